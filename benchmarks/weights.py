"""Weights read into memory against weights mapped from the model file (`--weights`).

A decode reads every weight once. Mapped from the file (llama.cpp's default), the weights sit
in the page cache's 4 KiB pages; read, they land in ggml's buffers, which Reame's build asks
to be in 2 MiB pages (`GGML_HUGEPAGES`, benchmarks/hugepages.py). Weights that the CPU
backend repacks (Q4_K on AVX2, for instance) are copied into buffers either way; the others
(SmolLM2's Q4_1 and Q8_0, a Q6_K output layer) are read where they were mapped.

Each repetition is one fresh process that loads the model both ways, as `reame serve` loads
it on this host (timed, and the memory in huge pages each load added), the two ways taking
turns at loading first from one repetition to the next. Each computes a prompt of `PROMPT`
tokens three times (the first also faults the buffers' pages in); then the two take turns,
`BLOCK` one-token steps at a time, until each has taken `STEPS`; then passes of `PASSES`
tokens with logits on every row (the shape of a draft's verification), each size in turn,
`TIMES` of each. Taking turns within one process, the two see the same moments of a host
whose speed drifts between processes and minutes. Reported: each way's median step and
pass, the ratios, their medians over the repetitions, load times, and whether both ways'
logits (digested) were the same.

    .venv/bin/python benchmarks/weights.py [--model PATH] [--reps 6] [--name weights]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

PROMPT = 256
STEPS = 120
BLOCK = 10
PASSES = (2, 4, 8)
TIMES = 30
WAYS = ("read", "mapped")


def child(model: str, threads: int, first: str) -> dict[str, Any]:
    """One process's figures, the weights loaded `first` way first."""
    import numpy as np
    from common import memory_mib, prompt_and_steps, timed_decode

    from reame_core.autoconfig.plan import Choice
    from reame_core.backend.base import Batch
    from reame_core.runtime import ensure_build_runs, load_backend, prepare
    from reame_core.settings import Settings

    settings = Settings(model=model, threads=threads, log_level="warning")
    build = ensure_build_runs(settings)
    preparation = prepare(settings, build=build)
    order = [first, *(way for way in WAYS if way != first)]
    path = str(Path(model).resolve())
    backends: dict[str, Any] = {}
    load_s: dict[str, float] = {}
    added_huge_mib: dict[str, float] = {}
    for way in order:
        plan = replace(preparation.plan, weights=Choice(way, "benchmark"))
        huge_before = memory_mib(path)["anon_huge_pages_mib"]
        began = time.perf_counter()
        backends[way] = load_backend(
            settings, replace(preparation, plan=plan), use_extra_bufts=build.use_extra_bufts
        )
        load_s[way] = round(time.perf_counter() - began, 3)
        added_huge_mib[way] = round(memory_mib(path)["anon_huge_pages_mib"] - huge_before, 1)
    tokens = [int(t) for t in np.random.default_rng(5).integers(100, 5000, PROMPT + STEPS + 8)]
    digests = {way: hashlib.sha256() for way in order}
    prompt_s = {}
    for way in order:
        prompt_s[way], _ = prompt_and_steps(backends[way], tokens, PROMPT, 0, digests[way])
    steps: dict[str, list[float]] = {way: [] for way in order}
    for block, start in enumerate(range(PROMPT, PROMPT + STEPS, BLOCK)):
        for way in order if block % 2 == 0 else order[::-1]:
            for position in range(start, start + BLOCK):
                batch = Batch()
                batch.add(tokens[position], position, 0, True)
                steps[way].append(timed_decode(backends[way], batch, digests[way]))
    end = PROMPT + STEPS
    passes: dict[str, dict[int, list[float]]] = {way: {n: [] for n in PASSES} for way in order}
    for time_ in range(TIMES):
        for way in order if time_ % 2 == 0 else order[::-1]:
            for n in PASSES:
                batch = Batch()
                for offset in range(n):
                    batch.add(tokens[end + offset], end + offset, 0, True)
                passes[way][n].append(timed_decode(backends[way], batch, digests[way]))
                backends[way].seq_rm(0, end)
    memory = memory_mib(path)
    for backend in backends.values():
        backend.close()
    return {
        "first": first,
        "load_s": load_s,
        "added_huge_pages_mib": added_huge_mib,
        "file_mapped_mib": memory["file_mapped_mib"],
        "first_prompt_tok_s": {way: round(PROMPT / prompt_s[way][0], 1) for way in order},
        "prompt_tok_s": {way: round(PROMPT / min(prompt_s[way][1:]), 1) for way in order},
        "step_ms": {way: round(statistics.median(steps[way]) * 1000, 3) for way in order},
        "pass_ms": {
            way: {str(n): round(statistics.median(v) * 1000, 3) for n, v in passes[way].items()}
            for way in order
        },
        "digests": {way: digests[way].hexdigest()[:16] for way in order},
    }


def _ratio(run: dict[str, Any], key: str, size: int | None = None) -> float:
    """How many times as fast the read weights were as the mapped in one repetition."""
    if size is None:
        return float(run[key]["mapped"]) / float(run[key]["read"])
    return float(run[key]["mapped"][str(size)]) / float(run[key]["read"][str(size)])


def main() -> None:
    from common import measure, write_report

    from reame_core.autoconfig.facts import transparent_huge_pages
    from reame_core.models import resolve_model
    from reame_core.settings import Settings

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", help="model alias or .gguf path (default: embedded)")
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default="weights", help="results file name (no extension)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--first", choices=WAYS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    model = str(resolve_model(args.model or Settings().model).path)
    if args.child:
        print(json.dumps(child(model, args.threads, args.first)), flush=True)
        return
    runs = []
    for rep in range(args.reps):
        first = WAYS[rep % 2]
        runs.append(
            measure(__file__, "--model", model, "--threads", str(args.threads), "--first", first)
        )
        print(runs[-1], flush=True)

    def median(values: Any) -> float:
        return round(float(statistics.median(values)), 3)

    summary: dict[str, Any] = {
        "step_ms": {way: median(r["step_ms"][way] for r in runs) for way in WAYS},
        "step_speedup": median(_ratio(r, "step_ms") for r in runs),
        "step_speedup_by_rep": [round(_ratio(r, "step_ms"), 3) for r in runs],
        "pass_speedup": {str(n): median(_ratio(r, "pass_ms", n) for r in runs) for n in PASSES},
        "pass_speedup_by_rep": {
            str(n): [round(_ratio(r, "pass_ms", n), 3) for r in runs] for n in PASSES
        },
        "prompt_speedup": median(1 / _ratio(r, "prompt_tok_s") for r in runs),
        "load_s": {way: median(r["load_s"][way] for r in runs) for way in WAYS},
        "added_huge_pages_mib": {
            way: median(r["added_huge_pages_mib"][way] for r in runs) for way in WAYS
        },
        "logits_equal": len({d for r in runs for d in r["digests"].values()}) == 1,
    }
    print(summary)
    command = ["python", f"benchmarks/{Path(sys.argv[0]).name}", *sys.argv[1:]]
    path = write_report(
        args.name,
        {
            "model": Path(model).name,
            "threads": args.threads,
            "reps": args.reps,
            "command": " ".join(command),
            "prompt_tokens": PROMPT,
            "steps": STEPS,
            "block": BLOCK,
            "passes": list(PASSES),
            "times": TIMES,
            "transparent_hugepage": transparent_huge_pages(),
            **summary,
            "runs": runs,
        },
    )
    print(f"written to {path}")


if __name__ == "__main__":
    main()
