"""Medians and ratios: the only statistics a row needs.

Each repetition's ratio is taken between the A and B samples of that repetition, which ran
side by side; the row's ratio is the median of those, never the ratio of two medians, so a
drift of the host between repetitions does not enter it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def speedup(
    feature: float, baseline: float, *, higher_is_better: bool, scale: float = 1.0
) -> float:
    """How many times better the feature did than the baseline (1.0: no gain): a rate's
    ratio, or a time's inverse ratio, times `scale`."""
    if higher_is_better:
        return scale * feature / baseline if baseline > 0 else float("inf")
    return scale * baseline / feature if feature > 0 else float("inf")


def paired_speedups(
    feature: Sequence[float],
    baseline: Sequence[float],
    *,
    higher_is_better: bool,
    scale: float = 1.0,
) -> list[float]:
    """The speed-up of each repetition, A against the B of the same repetition."""
    if len(feature) != len(baseline):
        raise ValueError(f"{len(feature)} feature samples but {len(baseline)} baseline samples")
    return [
        speedup(a, b, higher_is_better=higher_is_better, scale=scale)
        for a, b in zip(feature, baseline, strict=True)
    ]


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))
