"""The plugin's settings section, ``[plugins.diskkv]``, and the defaults it takes from the host.

Where the cache lives: `dir`, by default ``$XDG_CACHE_HOME/reame/kv`` (``~/.cache/reame/kv``).
How much disk it may take: `budget`. Its default comes from the host plan, which grants the
need the plugin declares (`reame_disk_need`: a quarter of the free disk, at most 10 GiB;
`reame config` shows it); where no plan ran (an embedding application), a quarter of the
disk space that is free or already the cache's own, at most 10 GiB — enough for hundreds
of long system prompts, while leaving room on a small free-tier disk for models and logs.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from pydantic import BaseModel, ByteSize, ConfigDict, Field

from reame_diskkv.index import BLOCK

NAME = "diskkv"
BUDGET_SHARE_OF_FREE_DISK = 0.25
BUDGET_CAP = 10 << 30


class DiskKVSettings(BaseModel):
    """Options of the `diskkv` plugin (unknown keys are refused)."""

    model_config = ConfigDict(extra="forbid")

    dir: Path | None = Field(
        None, description="Cache directory; default $XDG_CACHE_HOME/reame/kv (~/.cache/reame/kv)."
    )
    budget: ByteSize | None = Field(
        None,
        description="Most bytes the entries may take (e.g. 20GB, 512MiB); default: the host "
        "plan's (a quarter of the free disk, at most 10 GiB).",
    )
    turns: int = Field(
        1, ge=0, description="Snapshot chat prompts at the end of their first N turns."
    )
    conversations: bool = Field(
        False,
        description="Also snapshot a session's chat prompts at the end of their last turn, "
        "so its next turn restores the conversation on any server sharing the directory, or "
        "after a restart (a fleet with a shared directory turns it on).",
    )
    block_tokens: int = Field(
        256,
        ge=0,
        description="Snapshot prompts without chat turns at their last multiple of this many "
        "tokens (0: never).",
    )
    min_tokens: int = Field(
        128, ge=BLOCK, description="Shorter prefixes are computed again, not stored."
    )
    compression_level: int = Field(3, ge=1, le=19, description="zstd level of new entries.")

    def directory(self) -> Path:
        return (self.dir or default_directory()).expanduser()

    def budget_bytes(self, held: int) -> int:
        """The budget, or its default for a cache that already holds `held` bytes."""
        if self.budget is not None:
            return int(self.budget)
        return default_budget(self.directory(), held)


def default_directory() -> Path:
    cache_home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache_home) / "reame" / "kv"


def default_budget(directory: Path, held: int) -> int:
    """A quarter of what the cache could grow into on its disk, at most `BUDGET_CAP`."""
    free = shutil.disk_usage(directory).free
    return min(BUDGET_CAP, int(BUDGET_SHARE_OF_FREE_DISK * (free + held)))
