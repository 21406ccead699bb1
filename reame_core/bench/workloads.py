"""What each workload compares: a feature (arm A) against its baseline (arm B), the figure
both are measured in, when the feature counts as paying, and what it needs installed.

Data only: the measured code is in `arms.py`, the alternation in `runner.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from reame_core.plugins import PluginRecord

Arm = Literal["A", "B"]


@dataclass(frozen=True)
class Size:
    """How much a trial generates: `requests` prompts of `tokens` new tokens each, behind a
    shared system prompt of `shared_rules` handbook rules (about 30 tokens each) if any."""

    requests: int
    tokens: int
    shared_rules: int = 0


@dataclass(frozen=True)
class Workload:
    """One row of the report.

    The ratio of a repetition is A's figure over B's when higher is better (a rate), B's
    over A's when lower is (a time), times `scale`: the feature's speed-up, 1.0 meaning
    no gain. `goal` is the ratio at which the feature counts as paying (below 1 where the
    promise is to cost almost nothing). `plugins` must be installed and enabled, or the row
    is skipped with that reason. `baseline_first`: B runs before A in every repetition,
    because A reads what B left behind (a disk cache, an archive); otherwise the order
    alternates between repetitions. `http`: the workload also runs against another server
    (`--against`). `needs_draft_model`: arm A loads the model's same-vocabulary draft
    model, so the row is skipped when the model has none on this machine.
    """

    name: str
    title: str
    feature: str  # arm A's configuration, as a reader should understand it
    baseline: str  # arm B's
    unit: str
    higher_is_better: bool
    quick: Size
    full: Size
    goal: float = 1.0
    scale: float = 1.0
    plugins: tuple[str, ...] = ()
    baseline_first: bool = False
    http: bool = False
    needs_draft_model: bool = False

    def size(self, quick: bool) -> Size:
        return self.quick if quick else self.full

    def skip_reason(
        self, records: Mapping[str, PluginRecord], *, no_draft_model: str | None = None
    ) -> str | None:
        """Why this workload cannot run with these plugins, or with no draft model for the
        model (`no_draft_model` says why there is none), or None if it can."""
        if self.needs_draft_model and no_draft_model is not None:
            return no_draft_model
        for name in self.plugins:
            record = records.get(name)
            if record is None:
                return f"plugin {name} is not installed (pip install reame-{name.split('_')[0]})"
            if not record.enabled:
                return f"plugin {name} is disabled" + (f": {record.error}" if record.error else "")
        return None


BEST_OF = 5

WORKLOADS: tuple[Workload, ...] = (
    Workload(
        "decode",
        "one stream, engine against the raw llama.cpp loop",
        feature="Reame engine, speculation off",
        baseline="raw llama.cpp decode loop (same context, greedy argmax)",
        unit="tok/s",
        higher_is_better=True,
        quick=Size(1, 96),
        full=Size(1, 256),
        goal=0.95,
        http=True,
    ),
    Workload(
        "streams",
        "4 concurrent streams against the same 4 one after another",
        feature="4 streams interleaved in one batch",
        baseline="the same 4 requests serially",
        unit="tok/s",
        higher_is_better=True,
        quick=Size(4, 48),
        full=Size(4, 128),
        http=True,
    ),
    Workload(
        "diskcache",
        "time to first token behind a long shared system prompt, fresh process",
        feature="system prompt restored from the disk prefix cache",
        baseline="cold prefill (empty cache)",
        unit="s",
        higher_is_better=False,
        quick=Size(1, 8, shared_rules=20),
        full=Size(1, 16, shared_rules=63),
        plugins=("diskkv",),
        baseline_first=True,
    ),
    Workload(
        "lookup",
        "rewrite tasks: prompt lookup drafts",
        feature="speculation auto (prompt lookup)",
        baseline="speculation off",
        unit="tok/s",
        higher_is_better=True,
        quick=Size(2, 96),
        full=Size(5, 160),
    ),
    Workload(
        "palimpsest",
        "an exact repeat of earlier requests: drafts from the archive",
        feature="second pass, Palimpsest archive and speculation auto",
        baseline="first pass, speculation off (it fills the archive)",
        unit="tok/s",
        higher_is_better=True,
        quick=Size(3, 64),
        full=Size(8, 96),
        plugins=("palimpsest",),
        baseline_first=True,
    ),
    Workload(
        "conclave",
        f"best-of-{BEST_OF} by vote on short questions",
        feature=f"best_of={BEST_OF}, one prefill, candidates interleaved, early stop",
        baseline=f"one sampled answer (ratio: {BEST_OF} such answers' time over best-of's)",
        unit="s",
        higher_is_better=False,
        quick=Size(2, 24),
        full=Size(4, 32),
        scale=BEST_OF,
        plugins=("conclave",),
    ),
    Workload(
        "grammar",
        "JSON-schema extraction: grammar drafts",
        feature="schema-constrained, speculation auto (forced tokens drafted)",
        baseline="schema-constrained, speculation off",
        unit="tok/s",
        higher_is_better=True,
        quick=Size(2, 96),
        full=Size(4, 128),
        plugins=("suggeritore",),
    ),
    Workload(
        "adversarial",
        "sampled free text where drafts miss: the governor's cost",
        feature="speculation auto (the governor decides)",
        baseline="speculation off",
        unit="tok/s",
        higher_is_better=True,
        quick=Size(2, 96),
        full=Size(4, 160),
        goal=0.97,
    ),
    Workload(
        "draftmodel",
        "code completion and rewrites: a smaller model of the same vocabulary drafts",
        feature="speculation auto with --draft-model (the model's same-vocabulary partner)",
        baseline="speculation off",
        unit="tok/s",
        higher_is_better=True,
        quick=Size(2, 64),
        full=Size(4, 128),
        needs_draft_model=True,
    ),
    Workload(
        "trace",
        "a day of an office's requests replayed over HTTP: extraction into a JSON schema "
        "behind a long system prompt, chats, rewrites, nightly reruns",
        feature="reame serve defaults: disk cache and archive (empty at first), speculation auto",
        baseline="reame serve, speculation off, disk cache and archive disabled",
        unit="useful tok/s",
        higher_is_better=True,
        # requests of the trace (a slice of it below its 38), most tokens an answer may take
        quick=Size(9, 400),
        full=Size(38, 400),
        plugins=("diskkv", "palimpsest", "suggeritore"),
        http=True,
    ),
)

BY_NAME: Mapping[str, Workload] = {workload.name: workload for workload in WORKLOADS}

# The workloads `--quick` runs: all of them, smaller.
QUICK: tuple[str, ...] = tuple(BY_NAME)
