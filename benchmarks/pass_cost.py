"""What a pass of n tokens of one sequence costs against a pass of one: the ceiling of every
draft source on this host.

Verifying a draft of k tokens is one pass of k + 1 tokens; it pays only if that pass costs
less than the k + 1 one-token passes it replaces, times the share of the draft accepted. The
model is loaded as `reame serve` loads it on this host (the host plan's attention and KV
types, one KV stream per sequence), a 300-token prompt is computed, then passes of n
tokens are appended after it and taken back, alternating sizes, with logits for every row
(as verification asks) and for the last row only. Medians over the repetitions.

    .venv/bin/python benchmarks/pass_cost.py [--model PATH] [--reps 7] [--name pass_cost]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

SIZES = (1, 2, 3, 4, 6, 8, 12, 16)
TEXT = "def fibonacci(n):\n    '''Return the n-th Fibonacci number.'''\n" * 16


def pass_seconds(
    model: Path, threads: int, reps: int, sizes: tuple[int, ...] = SIZES
) -> dict[tuple[int, str], float]:
    """Median seconds of a pass of n tokens after a 300-token prompt, by (n, "all") with
    logits for every row and (n, "last") for the last row only."""
    from reame_core.backend.base import Batch
    from reame_core.runtime import planned_backend
    from reame_core.settings import Settings

    backend = planned_backend(
        Settings(model=str(model), threads=threads, parallel=4, ctx=2048, log_level="warning")
    )
    prompt = backend.tokenize(TEXT, add_special=False, parse_special=False)[:300]
    batch = Batch()
    for i, token in enumerate(prompt):
        batch.add(token, i, 0, i == len(prompt) - 1)
    backend.decode(batch)
    start = len(prompt)

    seconds: dict[tuple[int, str], list[float]] = {}
    for _ in range(reps):
        for n in sizes:
            for rows in ("all", "last"):
                batch = Batch()
                for j in range(n):
                    batch.add(prompt[j], start + j, 0, rows == "all" or j == n - 1)
                began = time.perf_counter()
                backend.decode(batch)
                seconds.setdefault((n, rows), []).append(time.perf_counter() - began)
                backend.seq_rm(0, start, -1)
    backend.close()
    return {key: statistics.median(values) for key, values in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", help="model alias or .gguf path (default: embedded)")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default="pass_cost", help="results file name (no extension)")
    args = parser.parse_args()

    from common import write_report

    from reame_core.models import resolve_model
    from reame_core.settings import Settings

    model = resolve_model(args.model or Settings().model)
    seconds = pass_seconds(model.path, args.threads, args.reps)
    one = seconds[(1, "all")]
    table = []
    for n in SIZES:
        all_rows = seconds[(n, "all")]
        last_row = seconds[(n, "last")]
        table.append(
            {
                "tokens": n,
                "ms_logits_every_row": round(all_rows * 1000, 2),
                "ms_logits_last_row": round(last_row * 1000, 2),
                "one_token_passes": round(all_rows / one, 2),
                "best_gain_if_every_draft_token_is_right": round(n * one / all_rows, 2),
            }
        )
        print(table[-1], flush=True)
    path = write_report(
        args.name,
        {
            "model": model.path.name,
            "threads": args.threads,
            "reps": args.reps,
            "command": " ".join(["python", "benchmarks/pass_cost.py", *sys.argv[1:]]),
            "passes": table,
        },
    )
    print(path)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
