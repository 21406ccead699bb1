"""The `palimpsest` plugin's hook implementations.

This release registers the plugin and validates its ``[plugins.palimpsest]`` settings
section; the feature itself (generation archive as a draft source) is not active yet, and
the plugin says so rather than claiming it. It writes nothing, so it asks the host plan for
no disk (`reame_disk_need`) and `reame config` shows no budget for it; a `budget` set in its
section is accepted for the archive to come. It needs no request field: the archive feeds
drafts, which never change the output.
"""

from __future__ import annotations

from pydantic import BaseModel, ByteSize, ConfigDict, Field

from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import ModelInfo
from reame_core.settings import Settings

NAME = "palimpsest"


class PalimpsestSettings(BaseModel):
    """Options of the `palimpsest` plugin (unknown keys are refused)."""

    model_config = ConfigDict(extra="forbid")

    budget: ByteSize | None = Field(
        None,
        description="Most bytes the archive may take (e.g. 1GiB, 100MB), once it is active; "
        "this release writes no archive.",
    )


@hookimpl
def reame_configure(settings: Settings, model: ModelInfo) -> None:
    settings.plugin_section(NAME, PalimpsestSettings)


@hookimpl
def reame_describe() -> str:
    return "generation archive as a draft source: not active in this release"
