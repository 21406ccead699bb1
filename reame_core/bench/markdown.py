"""A report as markdown: where it was measured, then one table row per workload."""

from __future__ import annotations

from reame_core.bench.host import describe_host
from reame_core.bench.report import Report, Row


def figure(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "s":
        return f"{value:.3g} s" if value < 10 else f"{value:.1f} s"
    return f"{value:.1f} {unit}"


def ratio(row: Row) -> str:
    return "-" if row.ratio is None else f"{row.ratio:.2f}x"


def verdict(row: Row) -> str:
    if row.paid is False:
        return f"**did not pay** (goal {row.goal:g}x)"
    return row.verdict


def render(report: Report) -> str:
    model = report.model
    lines = [
        f"Reame {report.reame['reame']} (llama-cpp-python {report.reame['llama_cpp_python']}), "
        f"{report.date}",
        "",
        f"- host: {describe_host(report.host)}, {report.host['os']}",
        f"- model: {model['name']} ({model['file']}, {model['quant']})",
        f"- {report.reps} repetition(s) per workload"
        + (", `--quick` sizes" if report.quick else "")
        + f"; A and B alternate in fresh processes; ratio = median of the repetitions' "
        f"ratios; {report.seconds:.0f} s in all",
        f"- command: `{report.command}`",
        "",
        "| workload | feature (A) | baseline (B) | A vs B | baseline | feature | same tokens | "
        "verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in report.rows:
        cells = [
            f"{row.workload}: {row.title}",
            row.feature,
            row.baseline,
            ratio(row),
            figure(row.baseline_value, row.unit),
            figure(row.feature_value, row.unit),
            row.identical or "-",
            verdict(row),
        ]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"
