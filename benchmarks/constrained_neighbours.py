"""What a constrained request costs the unconstrained requests decoding beside it.

Four greedy requests of `--tokens` tokens decode together in one engine (speculation off, so
only the grammar's mask is measured, not its drafts). In the "plain" runs all four are free
text; in the "constrained" runs the first follows a JSON schema (an array of at least 64
strings: it cannot end before `--tokens`, so the batch keeps its shape) and the other three
are free text. The figure is the three neighbours' decode rate, constrained run over plain
run, each run in a fresh process, alternating, the median of the per-repetition ratios.

    .venv/bin/python benchmarks/constrained_neighbours.py [--tokens 128] [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

PROMPTS = [
    f"Story number {i}: once upon a time, in a small village by the sea, there lived"
    for i in range(4)
]
SCHEMA = {"type": "array", "items": {"type": "string"}, "minItems": 64}


def child(mode: str, tokens: int, threads: int) -> dict[str, float]:
    from reame_core.request import GenerationRequest, SamplingParams
    from reame_core.runtime import start_runtime
    from reame_core.settings import Settings

    settings = Settings(
        parallel=4, ctx=1024, threads=threads, speculate="off", log_level="warning",
        disable_plugins=["palimpsest"],
    )  # fmt: skip
    runtime = start_runtime(settings)

    def request(i: int, extensions: dict[str, Any]) -> GenerationRequest:
        ids = runtime.backend.tokenize(PROMPTS[i], add_special=True, parse_special=True)
        constrained = bool(extensions)
        params = SamplingParams(max_tokens=tokens, ignore_eos=not constrained)
        return GenerationRequest(ids, params, extensions=extensions)

    runtime.engine.generate(request(0, {}))  # warm the model and the plugins
    first = {"json_schema": SCHEMA} if mode == "constrained" else {}
    requests = [request(0, first), *(request(i, {}) for i in range(1, 4))]
    ends: list[float] = [0.0] * 4
    lengths: list[int] = [0] * 4

    def run(i: int) -> None:
        finished = runtime.engine.generate(requests[i])
        ends[i] = time.perf_counter()
        lengths[i] = len(finished.candidates[0].tokens)

    threads_ = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    started = time.perf_counter()
    for thread in threads_:
        thread.start()
    for thread in threads_:
        thread.join()
    runtime.close()
    assert lengths == [tokens] * 4, lengths  # the batch kept its shape throughout
    neighbours = max(ends[1:]) - started
    return {"neighbours_tok_s": 3 * tokens / neighbours, "all_seconds": max(ends) - started}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", nargs=3, metavar=("MODE", "TOKENS", "THREADS"))
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.child:
        mode, tokens, threads = args.child
        print(json.dumps(child(mode, int(tokens), int(threads))))
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from common import measure, median_ratio, write_report

    runs: dict[str, list[float]] = {"plain": [], "constrained": []}
    for _ in range(args.reps):
        for mode, rates in runs.items():
            result = measure(__file__, mode, str(args.tokens), str(args.threads))
            rates.append(result["neighbours_tok_s"])
            print(json.dumps({"mode": mode, **result}), flush=True)
    ratio = round(median_ratio(runs["constrained"], runs["plain"]), 3)
    path = write_report(
        "constrained_neighbours",
        {
            "workload": "4 greedy requests decoding together, speculation off; in the "
            "constrained runs the first follows a JSON schema (array of >= 64 strings)",
            "model": "embedded SmolLM2-135M Q4_1",
            "tokens": args.tokens,
            "reps": args.reps,
            "threads": args.threads,
            "command": " ".join(["python", *sys.argv]),
            "neighbours_tok_s": {m: round(statistics.median(r), 1) for m, r in runs.items()},
            "neighbours_tok_s_by_rep": {m: [round(x, 1) for x in r] for m, r in runs.items()},
            "constrained_vs_plain": ratio,
        },
    )
    print(f"neighbours' rate, constrained / plain: {ratio} (written to {path})")


if __name__ == "__main__":
    main()
