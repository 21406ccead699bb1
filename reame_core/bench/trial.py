"""One measurement: what a trial's process is asked to run, and what it reports back.

Both cross a process boundary as JSON, so they hold plain values only.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from reame_core.bench.workloads import Arm, Size


@dataclass(frozen=True)
class Trial:
    """Arm `arm` of workload `workload`, repetition `rep`, in a process of its own.

    `model` is a resolved .gguf path (or a name the child resolves), `scratch` a directory
    the arms of one repetition share (a disk cache, an archive) and nothing else sees.
    `draft` is the draft model's file, for a workload that needs one.
    """

    workload: str
    arm: Arm
    rep: int
    size: Size
    model: str
    scratch: str
    threads: int | None = None
    draft: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Trial:
        data = json.loads(text)
        return cls(**{**data, "size": Size(**data["size"])})


@dataclass(frozen=True)
class Sample:
    """A trial's figure (in its workload's unit), and what it generated.

    `outputs` digests the generated tokens of a greedy arm (None for a sampled one), so the
    runner can say whether the feature changed the answers. `detail` is the workload's own
    account (drafts accepted, tokens restored, ...), copied into the report.
    """

    value: float
    tokens: int
    seconds: float
    outputs: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Sample:
        return cls(**json.loads(text))
