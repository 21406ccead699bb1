"""The `conclave` plugin's hook implementations.

This release registers the plugin and validates its ``[plugins.conclave]`` settings
section; the feature itself (best-of-N voting)
is not active yet, and the plugin says so rather than claiming it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import ModelInfo
from reame_core.settings import Settings

NAME = "conclave"


class ConclaveSettings(BaseModel):
    """Options of the `conclave` plugin (none yet; unknown keys are refused)."""

    model_config = ConfigDict(extra="forbid")


@hookimpl
def reame_configure(settings: Settings, model: ModelInfo) -> None:
    settings.plugin_section(NAME, ConclaveSettings)


@hookimpl
def reame_describe() -> str:
    return "best-of-N voting: not active in this release"
