"""`reame bench`'s outputs: the JSON report, the markdown table, the SVG plot, and the
command itself on the fake backend (trials run in this process)."""

from __future__ import annotations

import io
import json
import math
import xml.etree.ElementTree as ElementTree
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from reame_core.backend.fake import FakeBackend
from reame_core.bench import markdown, plot
from reame_core.bench.arms import run_trial
from reame_core.bench.host import cpu_model
from reame_core.bench.report import Report, Row
from reame_core.bench.runner import blank_row
from reame_core.bench.trial import Sample, Trial
from reame_core.bench.workloads import BY_NAME
from reame_core.cli.bench import bench_command
from reame_core.cli.main import build_parser, main, settings_from
from reame_core.plugins import PluginHost

HOST = {"cpu": "AMD EPYC 9B14", "logical_cpus": 2, "physical_cores": 1, "ram_gib": 23.4,
        "arch": "x86_64", "os": "Linux 6.1"}  # fmt: skip
MODEL = {"name": "smollm2-135m", "file": "SmolLM2-135M-Instruct.Q4_1.gguf", "quant": "Q4_1",
         "bytes": 98_000_000}  # fmt: skip


def measured(name: str, ratios: tuple[float, ...], baseline: float) -> Row:
    ratios_sorted = sorted(ratios)
    return replace(
        blank_row(BY_NAME[name]),
        reps=len(ratios),
        ratio=ratios_sorted[len(ratios) // 2],
        ratio_by_rep=ratios,
        baseline_value=baseline,
        feature_value=baseline * ratios_sorted[len(ratios) // 2],
        identical="3 of 3",
    )


def report() -> Report:
    return Report(
        rows=(
            measured("lookup", (1.4, 1.5, 1.45), 120.0),
            measured("adversarial", (0.9, 0.92, 0.91), 118.0),
            replace(blank_row(BY_NAME["conclave"]), skipped="plugin conclave is not installed"),
            replace(blank_row(BY_NAME["grammar"]), failed="grammar A: out of memory"),
        ),
        host=HOST,
        model=MODEL,
        reame={
            "reame": "0.1.0",
            "llama_cpp_python": "0.3.36",
            "python": "3.12.3",
            "omp_wait_policy": None,
        },
        date="2026-12-01 03:00 UTC",
        command="reame bench --quick",
        quick=True,
        reps=3,
        seconds=151.0,
    )


def test_the_json_report_round_trips_and_says_which_rows_paid() -> None:
    text = report().to_json()
    assert Report.from_json(text) == report()
    rows = json.loads(text)["rows"]
    assert [row["paid"] for row in rows] == [True, False, None, None]
    assert rows[2]["verdict"] == "skipped: plugin conclave is not installed"


def test_the_markdown_names_host_model_version_and_date() -> None:
    text = markdown.render(report())
    for fact in ("AMD EPYC 9B14", "2 CPUs", "23.4 GiB", "SmolLM2-135M-Instruct.Q4_1.gguf",
                 "Q4_1", "Reame 0.1.0", "2026-12-01", "`reame bench --quick`"):  # fmt: skip
        assert fact in text


def test_the_markdown_keeps_rows_that_did_not_pay_and_says_so() -> None:
    lines = markdown.render(report()).splitlines()
    adversarial = next(line for line in lines if line.startswith("| adversarial"))
    assert "0.91x" in adversarial
    assert "118.0 tok/s" in adversarial
    assert "**did not pay** (goal 0.97x)" in adversarial
    lookup = next(line for line in lines if line.startswith("| lookup"))
    assert "1.45x" in lookup and "| pays |" in lookup
    assert any("skipped: plugin conclave is not installed" in line for line in lines)
    assert any("failed: grammar A: out of memory" in line for line in lines)


def test_the_plot_draws_each_measured_ratio_from_the_line_at_one() -> None:
    svg = ElementTree.fromstring(plot.render(report()))
    ns = "{http://www.w3.org/2000/svg}"
    bars = [r for r in svg.iter(f"{ns}rect") if r.get("fill") in (plot.PAID, plot.NOT_PAID)]
    assert [bar.get("fill") for bar in bars] == [plot.PAID, plot.NOT_PAID]
    (one,) = [line for line in svg.iter(f"{ns}line") if line.get("stroke-dasharray")]
    one_x = float(one.get("x1") or 0)
    gain, loss = ((float(b.get("x") or 0), float(b.get("width") or 0)) for b in bars)
    assert gain[0] == pytest.approx(one_x, abs=0.1)  # 1.45x: from the line, rightwards
    assert loss[0] + loss[1] == pytest.approx(one_x, abs=0.1)  # 0.91x: leftwards to it
    # logarithmic: the bar of 1.45x is as long as log(1.45) / -log(0.91) times the other's
    assert gain[1] / loss[1] == pytest.approx(math.log(1.45) / -math.log(0.91), rel=0.02)
    texts = "".join(svg.itertext())
    assert "skipped: plugin conclave is not installed" in texts


def test_the_cpu_model_is_read_from_cpuinfo() -> None:
    cpuinfo = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9B14\n"
    assert cpu_model(cpuinfo) == "AMD EPYC 9B14"


# ---------------------------------------------------------------- the command


def in_process(trial: Trial) -> Sample:
    return run_trial(trial, backend=lambda: FakeBackend(n_ctx_seq=8192, n_seq_max=5))


def bench(argv: list[str]) -> tuple[int, str]:
    args = build_parser(PluginHost()).parse_args(argv)
    out = io.StringIO()
    code = bench_command(
        settings_from(args, model=args.model),
        args,
        argv,
        console=Console(file=out, width=200),
        run_trial=in_process,
    )
    return code, out.getvalue()


def test_bench_writes_json_markdown_and_plot(tmp_path: Path) -> None:
    files = {kind: tmp_path / f"report.{kind}" for kind in ("json", "md", "svg")}
    code, out = bench(
        ["bench", "--quick", "--only", "decode,lookup", "--reps", "2",
         "--json", str(files["json"]), "--markdown", str(files["md"]),
         "--plot", str(files["svg"])]
    )  # fmt: skip
    assert code == 0
    saved = Report.from_json(files["json"].read_text())
    assert [row.workload for row in saved.rows] == ["decode", "lookup"]
    assert all(row.reps == 2 and row.ratio is not None for row in saved.rows)
    assert saved.quick and saved.reps == 2
    assert saved.command.startswith("reame bench --quick --only decode,lookup")
    assert saved.model["quant"] == "Q4_1"
    assert files["md"].read_text() == markdown.render(saved)
    ElementTree.fromstring(files["svg"].read_text())
    assert "decode" in out and "lookup" in out


def test_a_disabled_plugins_workload_is_skipped_with_its_reason(tmp_path: Path) -> None:
    out_json = tmp_path / "r.json"
    code, _ = bench(
        ["bench", "--quick", "--only", "conclave", "--disable-plugin", "conclave",
         "--json", str(out_json)]
    )  # fmt: skip
    assert code == 0
    (row,) = Report.from_json(out_json.read_text()).rows
    assert row.skipped is not None and row.skipped.startswith("plugin conclave is ")
    assert row.ratio is None


def test_an_unknown_workload_is_refused_with_the_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--only", "decode,warp"]) == 1
    error = capsys.readouterr().err
    assert "no workload named warp" in error and "diskcache" in error
