"""The `suggeritore` plugin's hook implementations.

This release registers the plugin and validates its ``[plugins.suggeritore]`` settings
section; the feature itself (grammar drafts and structured output)
is not active yet, and the plugin says so rather than claiming it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import ModelInfo
from reame_core.settings import Settings

NAME = "suggeritore"


class SuggeritoreSettings(BaseModel):
    """Options of the `suggeritore` plugin (none yet; unknown keys are refused)."""

    model_config = ConfigDict(extra="forbid")


@hookimpl
def reame_configure(settings: Settings, model: ModelInfo) -> None:
    settings.plugin_section(NAME, SuggeritoreSettings)


@hookimpl
def reame_describe() -> str:
    return "grammar drafts and structured output: not active in this release"
