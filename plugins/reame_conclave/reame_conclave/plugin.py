"""The `conclave` plugin's hook implementations.

This release registers the plugin and validates its ``[plugins.conclave]`` settings
section; the feature itself (best-of-N voting) is not active yet, and the plugin says so
rather than claiming it. It claims its request field, `best_of`, and refuses a request
that sets it with a message naming the field, rather than letting it pass unhonoured.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict

from reame_core.errors import RequestError
from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import ModelInfo
from reame_core.request import GenerationRequest
from reame_core.settings import Settings

NAME = "conclave"
DISTRIBUTION = "reame-conclave"
REQUEST_FIELDS = {"best_of": "generate this many candidates and return the one they vote for"}


class ConclaveSettings(BaseModel):
    """Options of the `conclave` plugin (none yet; unknown keys are refused)."""

    model_config = ConfigDict(extra="forbid")


@hookimpl
def reame_configure(settings: Settings, model: ModelInfo) -> None:
    settings.plugin_section(NAME, ConclaveSettings)


@hookimpl
def reame_request_extensions() -> Mapping[str, str]:
    return REQUEST_FIELDS


@hookimpl
def reame_check_request(request: GenerationRequest, model: ModelInfo) -> None:
    for field in REQUEST_FIELDS:
        # One candidate to vote among (OpenAI's default) asks for nothing more.
        if request.extensions.get(field, 1) not in (None, 1):
            raise RequestError(
                f"'{field}' needs best-of-N voting: the {NAME} plugin ({DISTRIBUTION}) is "
                "installed but not active in this release.",
                param=field,
            )


@hookimpl
def reame_describe() -> str:
    return "best-of-N voting: not active in this release"
