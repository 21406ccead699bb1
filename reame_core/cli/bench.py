"""`reame bench [MODEL]`: Reame's features measured on this host, against their baselines.

Every workload of `bench.workloads` runs its feature and its baseline in fresh processes,
alternating, and becomes one row; `--against URL` adds the HTTP workloads sent to Reame's
own server and to that one. The table goes to stdout, progress to stderr; `--json`,
`--markdown` and `--plot` write the report to files.
"""

from __future__ import annotations

import argparse
import shlex
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from reame_core.bench import markdown, plot
from reame_core.bench.against import (
    Server,
    http_measure,
    http_workload,
    normalized,
    reame_server,
    warm_up,
    with_model,
)
from reame_core.bench.child import measure_in_child
from reame_core.bench.host import host_facts, model_facts, today, versions
from reame_core.bench.pairs import draft_for
from reame_core.bench.replay import against_measure
from reame_core.bench.report import Report, Row
from reame_core.bench.runner import Measure, blank_row, run_workload, trial_measure
from reame_core.bench.trace import Count, token_counter
from reame_core.bench.trial import Sample, Trial
from reame_core.bench.workloads import BY_NAME, QUICK, WORKLOADS, Arm, Workload
from reame_core.errors import ReameError
from reame_core.plugins import PluginHost
from reame_core.settings import Settings

QUICK_REPS = 2
FULL_REPS = 3


class BenchUsageError(ReameError):
    """A flag of `reame bench` names something that does not exist."""


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    bench = commands.add_parser(
        "bench",
        help="measure Reame's features on this host, each against its baseline",
        description="Run each workload's feature (A) and baseline (B) in fresh processes, "
        "alternating, and report the median ratio with the baseline's own figure, the host, "
        "the model and the version. Rows where a feature did not pay are kept and marked. "
        "Workloads: " + ", ".join(f"{w.name} ({w.title})" for w in WORKLOADS) + ".",
    )
    bench.add_argument("model", nargs="?", help="model (default: the embedded SmolLM2-135M)")
    bench.add_argument(
        "--quick",
        action="store_true",
        help=f"smaller workloads, {QUICK_REPS} repetition(s): a few minutes on 2 cores",
    )
    bench.add_argument(
        "--only", metavar="NAME,...", help="run only these workloads (comma-separated)"
    )
    bench.add_argument(
        "--reps", type=int, help=f"repetitions (default {FULL_REPS}; --quick {QUICK_REPS})"
    )
    bench.add_argument("--json", metavar="FILE", help="write the report as JSON")
    bench.add_argument("--markdown", metavar="FILE", help="write the report as a markdown table")
    bench.add_argument("--plot", metavar="FILE", help="write the ratios as an SVG bar chart")
    bench.add_argument(
        "--against",
        metavar="URL",
        help="also send the HTTP workloads (decode, streams, trace) to this "
        "OpenAI-compatible server and to Reame's, alternating",
    )
    bench.add_argument("--against-key", metavar="KEY", help="bearer key for --against's server")
    bench.add_argument("--threads", type=int, help="CPU threads (default: the host plan's)")
    return bench


def selected(only: str | None, quick: bool) -> list[Workload]:
    """The workloads `--only` names (all, or `--quick`'s, without it), in registry order."""
    if not only:
        names = QUICK if quick else tuple(BY_NAME)
        return [BY_NAME[name] for name in names]
    wanted = [name.strip() for name in only.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in BY_NAME]
    if unknown:
        raise BenchUsageError(
            f"no workload named {', '.join(unknown)}; the workloads are {', '.join(BY_NAME)}"
        )
    return [w for w in WORKLOADS if w.name in wanted]


def bench_command(
    settings: Settings,
    args: argparse.Namespace,
    argv: Sequence[str],
    *,
    console: Console | None = None,
    run_trial: Callable[[Trial], Sample] | None = None,
) -> int:
    """Run the selected workloads; print the table; write the files asked for.

    `run_trial` replaces `measure_in_child` (tests run trials in-process on a fake backend).
    """
    console = console or Console()
    started = time.perf_counter()
    workloads = selected(args.only, args.quick)
    reps = args.reps or (QUICK_REPS if args.quick else FULL_REPS)
    if reps < 1:
        raise BenchUsageError("--reps must be at least 1")
    records = {record.name: record for record in PluginHost(settings.disable_plugins).records()}
    model_path, model, (draft, no_draft) = _model(settings, check_build=run_trial is None)
    threads = args.threads or settings.threads

    measure = trial_measure(
        run_trial or measure_in_child,
        model=model_path,
        quick=args.quick,
        threads=threads,
        draft=draft,
    )
    reasons = {w.name: w.skip_reason(records, no_draft_model=no_draft) for w in workloads}
    planned = [w for w in workloads if reasons[w.name] is None]
    http = [w for w in planned if w.http] if args.against else []
    total = 2 * reps * (len(planned) + len(http))
    rows: list[Row] = []
    with TrialProgress(console, total) as advance:
        for workload in workloads:
            reason = reasons[workload.name]
            if reason is not None:
                rows.append(_skipped(workload, reason))
                continue
            rows.append(run_workload(workload, reps, measure, on_trial=advance))
        if http:
            rows.extend(_against(args, model_path, http, reps, advance, measure))
    report = Report(
        rows=tuple(rows),
        host=host_facts(settings.cache_path),
        model=model,
        reame=versions(),
        date=today(),
        command=shlex.join(["reame", *argv]),
        quick=args.quick,
        reps=reps,
        seconds=round(time.perf_counter() - started, 1),
    )
    _print(console, report)
    for path, text in (
        (args.json, report.to_json),
        (args.markdown, lambda: markdown.render(report)),
        (args.plot, lambda: plot.render(report)),
    ):
        if path:
            Path(path).write_text(text())
            console.print(f"written to {path}")
    return 1 if any(row.failed for row in rows) else 0


def _model(
    settings: Settings, *, check_build: bool
) -> tuple[str, dict[str, Any], tuple[str | None, str | None]]:
    """The model file (resolved, downloaded if need be, once here rather than in every
    trial), its facts, and its draft model's file or why it has none (`pairs.draft_for`);
    the build check runs here too, so that trials find its verdict cached."""
    from reame_core.models import ModelStore
    from reame_core.models.names import parse_model_name

    store = ModelStore.in_cache_dir(settings.cache_path)
    resolved = store.resolve(settings.model)
    if check_build:
        from reame_core.backend.probe import ensure_build_runs

        ensure_build_runs(settings)
    quant = resolved.card.quant if resolved.card is not None else None
    draft = draft_for(
        resolved.name, resolved.path, lambda alias: store.locate(parse_model_name(alias))
    )
    return str(resolved.path), model_facts(resolved.name, resolved.path, quant), draft


def _skipped(workload: Workload, reason: str) -> Row:
    from dataclasses import replace

    return replace(blank_row(workload), skipped=reason)


def _against(
    args: argparse.Namespace,
    model_path: str,
    workloads: Sequence[Workload],
    reps: int,
    advance: Callable[[Workload, Arm, int], None],
    trace_feature: Measure,
) -> list[Row]:
    other = with_model(Server(normalized(args.against), api_key=args.against_key))
    # The comparison is of serving (other servers do not speculate unless told): no archive
    # or disk cache of the user's is touched. The trace's Reame is its own (`trace_feature`).
    flags = ["--speculate", "off", "--disable-plugin", "palimpsest", "--disable-plugin", "diskkv"]
    flags += ["--threads", str(args.threads)] if args.threads else []
    with reame_server(model_path, *flags) as reame, token_counter(model_path) as count:
        return against_rows(
            reame,
            other,
            workloads,
            reps,
            quick=args.quick,
            advance=advance,
            trace_feature=trace_feature,
            count=count,
        )


def against_rows(
    reame: Server,
    other: Server,
    workloads: Sequence[Workload],
    reps: int,
    *,
    quick: bool,
    advance: Callable[[Workload, Arm, int], None] | None = None,
    trace_feature: Measure | None = None,
    count: Count | None = None,
) -> list[Row]:
    """The HTTP rows: each workload on Reame's server (A) and the other one (B). The trace's
    arm A is `trace_feature` (the trace row's own: a fresh server for each replay), and
    its answers are counted in tokens by `count`."""
    warm_up(reame)
    warm_up(other)
    measure: Measure = http_measure(reame, other, quick=quick)
    rows = []
    for workload in workloads:
        if workload.name == "trace":
            if trace_feature is None or count is None:
                raise ValueError("the trace over HTTP needs its feature arm and a token count")
            each = against_measure(trace_feature, workload, other, quick=quick, count=count)
        else:
            each = measure
        http = http_workload(workload, other.url)
        rows.append(run_workload(http, reps, each, server=other.url, on_trial=advance))
    return rows


class TrialProgress:
    """A rich progress bar over every trial, on stderr; `advance` names the next one."""

    def __init__(self, console: Console, total: int) -> None:
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True, quiet=console.quiet),
            transient=True,
        )
        self.task = self.progress.add_task("starting", total=total)
        self.started = False

    def __enter__(self) -> Callable[[Workload, Arm, int], None]:
        self.progress.start()
        return self.advance

    def advance(self, workload: Workload, arm: Arm, rep: int) -> None:
        side = workload.feature if arm == "A" else workload.baseline
        if self.started:
            self.progress.advance(self.task)
        self.started = True
        self.progress.update(
            self.task, description=f"{workload.name} {arm}, rep {rep + 1}: {side[:40]}"
        )

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()


def _print(console: Console, report: Report) -> None:
    table = Table(title=f"reame bench: {report.model['file']}, {report.host['cpu']}")
    for column in ("workload", "A vs B", "baseline", "feature", "same tokens", "verdict"):
        table.add_column(column, justify="right" if column in ("A vs B",) else "left")
    for row in report.rows:
        style = "red" if row.paid is False or row.failed else ("dim" if row.skipped else None)
        table.add_row(
            row.workload,
            markdown.ratio(row),
            markdown.figure(row.baseline_value, row.unit),
            markdown.figure(row.feature_value, row.unit),
            row.identical or "-",
            row.verdict,
            style=style,
        )
    console.print(table)
    console.print(
        f"{report.reps} repetition(s), {report.seconds:.0f} s; ratio = median of each "
        "repetition's A against its B (higher is better for the feature)",
        style="dim",
    )
