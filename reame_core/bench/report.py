"""A benchmark report: its rows and the facts that say where they were measured.

Rows where the feature did not pay stay in the report, marked; skipped and failed
workloads stay too, with their reason. `to_json` and `from_json` round-trip, so a saved
report can be rendered again (markdown, plot) or compared with another host's.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Row:
    """One workload's result: feature (A) against baseline (B) on `server`.

    `ratio` is the median of the repetitions' speed-ups (`stats.speedup`); `feature_value`
    and `baseline_value` are the medians of the arms' own figures, in `unit`. `identical`
    says in how many repetitions a greedy feature generated the baseline's tokens.
    `detail` and `baseline_detail` are the last repetition's own accounts of A and of B.
    """

    workload: str
    title: str
    feature: str
    baseline: str
    unit: str
    higher_is_better: bool
    goal: float
    server: str = "reame"
    reps: int = 0
    ratio: float | None = None
    ratio_by_rep: tuple[float, ...] = ()
    feature_value: float | None = None
    baseline_value: float | None = None
    identical: str | None = None
    skipped: str | None = None
    failed: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    baseline_detail: dict[str, Any] = field(default_factory=dict)

    @property
    def paid(self) -> bool | None:
        """Whether the feature reached its goal; None when nothing was measured."""
        return None if self.ratio is None else self.ratio >= self.goal

    @property
    def verdict(self) -> str:
        if self.skipped:
            return f"skipped: {self.skipped}"
        if self.failed:
            return f"failed: {self.failed}"
        if self.paid:
            return "pays"
        return f"did not pay (goal {self.goal:g}x)"


@dataclass(frozen=True)
class Report:
    """Rows and their provenance: `host` (CPU, cores, RAM), `model` (file, quant),
    `reame` (versions), the date, the command and the repetitions."""

    rows: tuple[Row, ...]
    host: dict[str, Any]
    model: dict[str, Any]
    reame: dict[str, Any]
    date: str
    command: str
    quick: bool
    reps: int
    seconds: float = 0.0

    def to_json(self) -> str:
        data = asdict(self)
        for row, shown in zip(self.rows, data["rows"], strict=True):
            shown["paid"] = row.paid
            shown["verdict"] = row.verdict
        return json.dumps(data, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Report:
        data = json.loads(text)
        rows = []
        for row in data.pop("rows"):
            row.pop("paid", None)
            row.pop("verdict", None)
            rows.append(Row(**{**row, "ratio_by_rep": tuple(row["ratio_by_rep"])}))
        return cls(rows=tuple(rows), **data)
