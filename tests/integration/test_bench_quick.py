"""`reame bench --quick --only decode` on the embedded model: both arms run in processes of
their own and the report names what it measured. No figure is asserted, only that the
engine's greedy tokens are the raw loop's (the deterministic configuration guarantees it)."""

from __future__ import annotations

from pathlib import Path

from reame_core.bench.report import Report
from reame_core.cli.main import main


def test_quick_decode_bench_measures_the_engine_against_the_raw_loop(tmp_path: Path) -> None:
    saved = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--only", "decode", "--json", str(saved)]) == 0
    report = Report.from_json(saved.read_text())
    (row,) = report.rows
    assert row.failed is None
    assert row.reps >= 1 and row.ratio is not None and row.ratio > 0
    assert row.baseline_value is not None and row.baseline_value > 0
    assert row.identical == f"{row.reps} of {row.reps}"
    assert report.model["file"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert report.model["quant"] == "Q4_1"
    assert report.host["logical_cpus"] >= 1
