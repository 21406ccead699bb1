"""The plugin's settings section, ``[plugins.palimpsest]``, and the defaults it takes from
the host.

Where the archive lives: `dir`, by default ``palimpsest`` under Reame's own directory
(``$XDG_CACHE_HOME/reame``, beside the disk prefix cache). How much disk it may take:
`budget`, whose default comes from the host plan (`reame_disk_need`: a twentieth of the
free disk, at most 1 GiB; `reame config` shows it): at a few bytes a token compressed, a
gigabyte holds hundreds of millions of generated tokens, far more than a CPU host writes
in months. `record = false` stops adding to it (lookups go on). `recall`: whole answers are
kept too, and a request the server answered before is answered from there (`answers.py`).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ByteSize, ConfigDict, Field

NAME = "palimpsest"
BUDGET_SHARE_OF_FREE_DISK = 0.05
BUDGET_CAP = 1 << 30
FALLBACK_BUDGET = 256 << 20  # where no host plan ran (an embedding application)


class PalimpsestSettings(BaseModel):
    """Options of the `palimpsest` plugin (unknown keys are refused)."""

    model_config = ConfigDict(extra="forbid")

    dir: Path | None = Field(
        None, description="Archive directory; default <Reame's cache dir>/palimpsest."
    )
    budget: ByteSize | None = Field(
        None,
        description="Most bytes the archive may take (e.g. 1GiB, 100MB); the oldest segments "
        "are deleted beyond it. Default: the host plan's (a twentieth of the free disk, at "
        "most 1 GiB).",
    )
    record: bool = Field(True, description="Add finished generations to the archive.")
    recall: bool = Field(
        True,
        description="Answer a request the server answered before, when the request alone "
        "fixes its answer (greedy or seeded, deterministic configuration), from the answer "
        "kept then instead of computing it again.",
    )
    recall_budget: ByteSize = Field(
        ByteSize(64 << 20), ge=0, description="Most bytes the kept answers may take."
    )
    prompt_tokens: int = Field(
        64, ge=0, le=4096, description="Tokens of the prompt's end kept before each output."
    )
    memory_tokens: int = Field(
        4_000_000,
        ge=1024,
        le=1_000_000_000,  # positions are int32
        description="Most tokens the in-memory index holds (about 72 bytes each); the "
        "newest records are indexed first.",
    )
    min_match: int = Field(
        1,
        ge=1,
        le=24,
        description="Shortest match of a sequence's recent tokens that drafts (each length "
        "of match is judged apart: a short one drafts where its kind has shown it pays).",
    )
    draft_factor: float = Field(
        1.0, gt=0, le=16, description="A draft may be this many times as long as its match."
    )
    min_share: float = Field(
        0.1,
        gt=0,
        le=1,
        description="A draft stops where its path's share of the matched continuations falls "
        "below this.",
    )
    min_backing: float = Field(
        0.7,
        ge=0,
        le=1,
        description="A token drafted after a match shorter than 16 tokens must be what "
        "followed the same last few tokens across the archive at least this share of the "
        "time; the draft stops before the first that is not (0: no such check).",
    )
    segment_bytes: ByteSize = Field(
        ByteSize(8 << 20), ge=4096, description="Size at which a segment is sealed."
    )
    poll_seconds: float = Field(
        2.0, gt=0, le=3600, description="How often other processes' new records are read."
    )

    def directory(self, cache_path: Path) -> Path:
        return (self.dir or cache_path / NAME).expanduser()

    def budget_bytes(self) -> int:
        return int(self.budget) if self.budget is not None else FALLBACK_BUDGET
