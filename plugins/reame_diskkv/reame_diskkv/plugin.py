"""The `diskkv` plugin's hook implementations.

This release registers the plugin and validates its ``[plugins.diskkv]`` settings
section; the feature itself (disk prefix cache)
is not active yet, and the plugin says so rather than claiming it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import ModelInfo
from reame_core.settings import Settings

NAME = "diskkv"


class DiskKVSettings(BaseModel):
    """Options of the `diskkv` plugin (none yet; unknown keys are refused)."""

    model_config = ConfigDict(extra="forbid")


@hookimpl
def reame_configure(settings: Settings, model: ModelInfo) -> None:
    settings.plugin_section(NAME, DiskKVSettings)


@hookimpl
def reame_describe() -> str:
    return "disk prefix cache: not active in this release"
