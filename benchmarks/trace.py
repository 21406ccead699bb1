"""A realistic workload, end to end: the day of requests in reame_core/bench/data/trace.jsonl,
replayed with its timing against `reame serve` and llama.cpp's llama-server. The trace, its
replay and its figures are `reame_core.bench.trace` and `.replay` (`reame bench`'s `trace`
workload replays a slice of it); this script compares Reame with llama-server.

The trace (written by benchmarks/data/make_trace.py, seeded): back-office clients extracting
documents into one JSON schema behind one long shared system prompt, chat sessions of three
turns, rewrites of supplied prose and code, and a nightly batch that sends earlier requests
again byte for byte. Requests leave at their trace times stretched by --pace (arrivals are
open-loop: a slow server gets the next request all the same); a chat turn leaves its think
time after the previous answer, with the conversation so far and ``X-Session-ID``.

Servers, each replay in a fresh process with empty caches, alternating (the order swaps
every repetition):
  reame         `reame serve MODEL` with its defaults: every installed plugin (disk prefix
                cache, Palimpsest, Il Suggeritore, The Conclave), speculation `auto`,
                deterministic, its own choice of slots and context;
  llama-server  the same llama.cpp, model, threads, slots and context per slot, with what
                suits this trace: prompt cache with KV-shift reuse (``--cache-reuse``) and
                its RAM cache of idle slots (on by default), n-gram speculation on the
                context (``--spec-type ngram-simple``, its prompt lookup), and
                ``response_format`` json_schema, which it compiles to a grammar.
Every request streams, greedy. Per replay: the completion time (first request sent to last
answer received), useful output per second (the answers' tokens, counted with the model's
own tokenizer after the replay: a structured answer re-serialised compactly, an invalid
one counted as nothing), time to first token p50/p95 over all requests, and every
structured answer parsed and validated against its schema. Ratios are medians of per-repetition
ratios; the host's ceiling (prompt rate / decode rate) is printed beside them.

    .venv/bin/python benchmarks/trace.py --llama-server PATH [--model PATH] [--pace 1.0]
        [--reps 3] [--name NAME]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from common import free_port, llama_server, measure, median_ratio, running_server, write_report

from reame_core.bench.against import Server, warm_up
from reame_core.bench.replay import Outcome, replay
from reame_core.bench.trace import TRACE, check, load_trace, summary, token_counter

SERVERS = ("reame", "llama-server")
# llama-server's best settings for this trace, beside its slots and context (see above).
LLAMA_SERVER_FLAGS = "--cache-reuse 256 --spec-type ngram-simple"


def reame_server(model: str, threads: int, scratch: str) -> contextlib.AbstractContextManager[str]:
    """`reame serve` as installed, its defaults but for empty stores: the disk prefix cache
    and the generation archive start in `scratch`, as a new install's would."""
    port = free_port()
    reame = os.path.join(os.path.dirname(sys.executable), "reame")
    return running_server(
        [reame, "serve", model, "--port", str(port), "--threads", str(threads),
         "--kv-cache-dir", f"{scratch}/kv", "--palimpsest-dir", f"{scratch}/palimpsest",
         "--log-level", "warning"],
        port,
    )  # fmt: skip


def reame_plan(model: str) -> tuple[int, int]:
    """The slots and context per slot `reame serve` picks for `model` on this host (as
    `reame config` prints them), given to llama-server too."""
    reame = os.path.join(os.path.dirname(sys.executable), "reame")
    printed = subprocess.run(
        [reame, "config", model], capture_output=True, text=True, check=True
    ).stdout
    chosen = dict(line.split()[:2] for line in printed.splitlines() if line[:1].islower())
    return int(chosen["parallel"].rstrip(":")), int(chosen["ctx"].rstrip(":"))


def one_replay(
    server: str,
    args: argparse.Namespace,
    model: str,
    plan: tuple[int, int],
    trace: list[dict[str, Any]],
) -> list[Outcome]:
    """A fresh server, one warm-up request outside the measurement, the trace."""
    slots, ctx = plan
    with tempfile.TemporaryDirectory() as scratch, contextlib.ExitStack() as stack:
        if server == "reame":
            url = stack.enter_context(reame_server(model, args.threads, scratch))
        else:
            url = stack.enter_context(
                llama_server(args.llama_server, args.model_path, args.threads, slots=slots,
                             ctx=slots * ctx, extra=args.llama_server_flags.split())
            )  # fmt: skip
        warm_up(Server(url))
        outcomes = replay(Server(url), trace, args.pace)
    check(outcomes, trace)
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", help="model alias or .gguf path (default: embedded)")
    parser.add_argument("--llama-server", required=True, help="llama.cpp's llama-server binary")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pace", type=float, default=1.0, help="stretch the trace's clock")
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--name", help="results file name (default: trace_<model>)")
    parser.add_argument(
        "--llama-server-flags",
        default=LLAMA_SERVER_FLAGS,
        help="llama-server's flags beside model, threads, slots and context",
    )
    parser.add_argument("--only", default=",".join(SERVERS), help="servers to run, comma-separated")
    args = parser.parse_args()

    from reame_core.models import resolve_model
    from reame_core.settings import Settings

    model = args.model or Settings().model
    args.model_path = resolve_model(model).path
    trace = load_trace(args.trace)
    slots, ctx = plan = reame_plan(model)
    speculation = str(Path(__file__).parent / "speculation.py")
    host = measure(
        speculation, "ceiling", str(slots), "--threads", str(args.threads), "--model", model
    )
    print(json.dumps({k: round(v, 2) for k, v in host.items()}), flush=True)

    chosen = [name for name in SERVERS if name in args.only.split(",")]
    replays: dict[str, list[list[Outcome]]] = {name: [] for name in chosen}
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in chosen}
    with token_counter(args.model_path) as count:
        for rep in range(args.reps):
            for server in chosen if rep % 2 == 0 else reversed(chosen):
                outcomes = one_replay(server, args, model, plan, trace)
                replays[server].append(outcomes)
                figures = summary(outcomes, count)
                samples[server].append({**figures, **work_floor(outcomes, figures, host)})
                print(json.dumps({"rep": rep, "server": server, **samples[server][-1]}), flush=True)
    rows = {server: _row(runs) for server, runs in samples.items()}
    if len(samples) == len(SERVERS):
        rows["reame"]["vs_llama_server"] = round(
            median_ratio(
                [s["useful_tok_s"] for s in samples["reame"]],
                [s["useful_tok_s"] for s in samples["llama-server"]],
            ),
            3,
        )
    name = args.name or "trace_" + Path(model).name.removesuffix(".gguf")
    kinds: dict[str, int] = {}
    for request in trace:
        kinds[request["kind"]] = kinds.get(request["kind"], 0) + 1
    path = write_report(
        name,
        {
            "workload": f"{len(trace)} requests ({kinds}), {args.trace.name}, pace {args.pace}",
            "model": f"{model} ({args.model_path.name})",
            "threads": args.threads,
            "slots": slots,
            "ctx_per_slot": ctx,
            "llama_server_flags": [
                "-np", str(slots), "-c", str(slots * ctx), *args.llama_server_flags.split()
            ],
            "reps": args.reps,
            "command": " ".join(["python", "benchmarks/trace.py", *sys.argv[1:]]),
            "ceiling": host,
            "servers": rows,
            "samples": samples,
            "answers": {
                server: [[asdict(o) for o in outcomes] for outcomes in runs]
                for server, runs in replays.items()
            },
        },
    )  # fmt: skip
    print(f"\nwritten to {path}\n")
    print("| server | completion s | useful tok/s | vs llama-server | TTFT p50 / p95 s | valid |")
    print("|---|---|---|---|---|---|")
    for server, row in rows.items():
        print(
            f"| {server} | {row['completion_s']} | {row['useful_tok_s']} "
            f"| {row.get('vs_llama_server', '')} | {row['ttft_p50_s']} / {row['ttft_p95_s']} "
            f"| {row['valid']} |"
        )


def work_floor(
    outcomes: list[Outcome], figures: dict[str, Any], host: dict[str, Any]
) -> dict[str, Any]:
    """The least time the work a server says it did could take on this host: the prompt
    tokens it computed at the raw prompt rate, plus the tokens it decoded at the raw rate
    of as many sequences decoded together as it has slots (plain decoding, with every slot
    busy; drafts verified in passes of several tokens could beat this by at most what
    benchmarks/pass_cost.py allows). Arrivals, queueing and serving are not in it.
    `figures` is the replay's `summary`; only a server that sent its timings is priced."""
    if not all(o.timings for o in outcomes if o.error is None):
        return {}
    prompt_s = figures["computed_prompt_tokens"] / host["prompt_tok_s"]
    decode_s = figures["decoded_tokens"] / host["batched_decode_tok_s"]
    return {"work_floor_s": round(prompt_s + decode_s, 2)}


def _row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the repetitions, validity summed."""
    median = {
        key: round(statistics.median(run[key] for run in runs), 3)
        for key in ("completion_s", "useful_tok_s", "ttft_p50_s", "ttft_p95_s",
                    "latency_p50_s", "latency_p95_s", "work_floor_s")
        if all(key in run for run in runs)
    }  # fmt: skip
    return {
        **median,
        "useful_tok_s_by_rep": [run["useful_tok_s"] for run in runs],
        "valid": f"{sum(r['valid'] for r in runs)} of {sum(r['structured'] for r in runs)}",
        "errors": sum(len(r["errors"]) for r in runs),
    }


if __name__ == "__main__":
    main()
