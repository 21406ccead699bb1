"""The `suggeritore` plugin's hook implementations.

This release registers the plugin and validates its ``[plugins.suggeritore]`` settings
section; the feature itself (grammar drafts and structured output) is not active yet, and
the plugin says so rather than claiming it. It claims its request fields and refuses a
request that asks for structured output with a message naming the field, rather than
letting it pass unhonoured; plain text (``response_format: {"type": "text"}``) passes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from reame_core.errors import RequestError
from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import ModelInfo
from reame_core.request import GenerationRequest
from reame_core.settings import Settings

NAME = "suggeritore"
DISTRIBUTION = "reame-suggeritore"
REQUEST_FIELDS = {
    "grammar": "a GBNF grammar the output must follow",
    "json_schema": "a JSON schema the output must follow",
    "regex": "a regular expression the output must match",
    "response_format": "OpenAI's structured output: json_object or json_schema",
}


class SuggeritoreSettings(BaseModel):
    """Options of the `suggeritore` plugin (none yet; unknown keys are refused)."""

    model_config = ConfigDict(extra="forbid")


@hookimpl
def reame_configure(settings: Settings, model: ModelInfo) -> None:
    settings.plugin_section(NAME, SuggeritoreSettings)


@hookimpl
def reame_request_extensions() -> Mapping[str, str]:
    return REQUEST_FIELDS


@hookimpl
def reame_check_request(request: GenerationRequest, model: ModelInfo) -> None:
    for field, value in request.extensions.items():
        if field in REQUEST_FIELDS and not _asks_nothing(field, value):
            raise RequestError(
                f"'{field}' needs structured output: the {NAME} plugin ({DISTRIBUTION}) is "
                "installed but not active in this release.",
                param=field,
            )


def _asks_nothing(field: str, value: Any) -> bool:
    """A null field, or ``response_format: {"type": "text"}``: what every request gets."""
    if value is None:
        return True
    return field == "response_format" and isinstance(value, dict) and value.get("type") == "text"


@hookimpl
def reame_describe() -> str:
    return "grammar drafts and structured output: not active in this release"
