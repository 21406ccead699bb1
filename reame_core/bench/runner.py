"""The alternation of A and B, and the row made of their samples.

Repetition r runs A then B when r is even, B then A when it is odd, so neither arm always
goes first on a host whose speed drifts; a workload whose A reads what B left behind (a
disk cache, an archive) runs B first every time. Each repetition gets a scratch directory
of its own, shared by its two arms only. A trial that fails ends its workload's row with
the reason; the other workloads still run.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace

from reame_core.bench.report import Row
from reame_core.bench.stats import median, paired_speedups
from reame_core.bench.trial import Sample, Trial
from reame_core.bench.workloads import Arm, Workload

# Measures one arm of one repetition; the scratch directory is the repetition's.
Measure = Callable[[Workload, Arm, int, str], Sample]
# Told before each measurement starts (progress display).
OnTrial = Callable[[Workload, Arm, int], None]


def alternation(reps: int, *, baseline_first: bool = False) -> list[tuple[int, Arm]]:
    """The order of the measurements: (repetition, arm), A/B then B/A, ..."""
    order: list[tuple[int, Arm]] = []
    for rep in range(reps):
        arms: tuple[Arm, Arm] = ("B", "A") if baseline_first or rep % 2 else ("A", "B")
        order.extend((rep, arm) for arm in arms)
    return order


def blank_row(workload: Workload, *, server: str = "reame") -> Row:
    return Row(
        workload=workload.name,
        title=workload.title,
        feature=workload.feature,
        baseline=workload.baseline,
        unit=workload.unit,
        higher_is_better=workload.higher_is_better,
        goal=workload.goal,
        server=server,
    )


def row_from_samples(
    workload: Workload, feature: Sequence[Sample], baseline: Sequence[Sample], *, server: str
) -> Row:
    """Median speed-up of the paired repetitions, the arms' median figures, and whether a
    greedy feature kept the baseline's tokens."""
    ratios = paired_speedups(
        [s.value for s in feature],
        [s.value for s in baseline],
        higher_is_better=workload.higher_is_better,
        scale=workload.scale,
    )
    compared = [
        a.outputs == b.outputs
        for a, b in zip(feature, baseline, strict=True)
        if a.outputs is not None and b.outputs is not None
    ]
    return replace(
        blank_row(workload, server=server),
        reps=len(ratios),
        ratio=median(ratios),
        ratio_by_rep=tuple(ratios),
        feature_value=median([s.value for s in feature]),
        baseline_value=median([s.value for s in baseline]),
        identical=f"{sum(compared)} of {len(compared)}" if compared else None,
        detail=dict(feature[-1].detail),
        baseline_detail=dict(baseline[-1].detail),
    )


def run_workload(
    workload: Workload,
    reps: int,
    measure: Measure,
    *,
    server: str = "reame",
    on_trial: OnTrial | None = None,
) -> Row:
    """Every repetition of both arms, in `alternation` order; the row they make."""
    samples: dict[Arm, list[Sample]] = {"A": [], "B": []}
    scratch: dict[int, tempfile.TemporaryDirectory[str]] = {}
    try:
        for rep, arm in alternation(reps, baseline_first=workload.baseline_first):
            if on_trial is not None:
                on_trial(workload, arm, rep)
            if rep not in scratch:
                scratch[rep] = tempfile.TemporaryDirectory(prefix=f"reame-bench-{workload.name}-")
            try:
                samples[arm].append(measure(workload, arm, rep, scratch[rep].name))
            except Exception as error:  # one broken workload must not end the run
                return replace(blank_row(workload, server=server), failed=str(error))
    finally:
        for directory in scratch.values():
            directory.cleanup()
    return row_from_samples(workload, samples["A"], samples["B"], server=server)


def trial_measure(
    run: Callable[[Trial], Sample],
    *,
    model: str,
    quick: bool,
    threads: int | None,
    draft: str | None = None,
) -> Measure:
    """A `Measure` that describes each measurement as a `Trial` and hands it to `run`
    (`child.measure_in_child`, or `arms.run_trial` in this process)."""

    def measure(workload: Workload, arm: Arm, rep: int, scratch: str) -> Sample:
        size = workload.size(quick)
        given = draft if workload.needs_draft_model else None
        return run(Trial(workload.name, arm, rep, size, model, scratch, threads, given))

    return measure
