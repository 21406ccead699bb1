"""What building a decode's graph anew costs when the shape changes, and what keeping the
graphs of recent shapes saves (`LLAMA_GRAPH_CACHE`, scripts/patches/llama-graph-cache.patch).

llama.cpp reuses a decode's graph only when the decode before had the same shape; otherwise
it builds the graph and allocates it again. Verifying a draft between plain steps, or a
sequence joining or leaving the batch, changes the shape. With the patch's switch the
context keeps more graphs and reuses any that fits.

One process holds `--pairs` pairs of contexts of the model, each loaded as `reame serve`
loads it on this host, one of each pair with the switch off (llama.cpp's own reuse) and one
with Reame's setting, created in turns: where a context lands in memory moves its speed by
several percent on a shared host (one context in ten or so runs 10-15% slower throughout),
so each side gets several draws. Each pattern of decode shapes runs
for `--cycles` cycles on every context, the contexts taking turns, for `--rounds` rounds;
the tokens and positions are the same on every context and are taken back after each
decode. Reported per pattern: the median milliseconds of a cycle on each context, the ratio
off / on within each pair and the median of those ratios, and whether every context gave
bit-identical logits. Plain steps never change shape: their ratios show the noise. Also the
resident memory each context added while it first ran the patterns (its kept graphs'
buffers).

    .venv/bin/python benchmarks/graph_cache.py [--model PATH] [--pairs 3] [--rounds 6] [--cycles 30]
        [--name graph_cache]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# Each pattern: the decodes of one cycle, each a layout of (sequence, tokens).
PATTERNS: dict[str, list[list[tuple[int, int]]]] = {
    "plain steps": [[(0, 1)]],
    "a draft of 3 verified after each plain step": [[(0, 1)], [(0, 4)]],
    "drafts of 1, 4 and 2 between plain steps":
        [[(0, 1)], [(0, 2)], [(0, 1)], [(0, 5)], [(0, 1)], [(0, 3)]],
    "two sequences, one drafting now and then":
        [[(0, 1), (1, 1)], [(0, 1), (1, 1)], [(0, 4), (1, 1)]],
    "a third sequence joining and leaving": [[(0, 1), (1, 1)], [(0, 1), (1, 1), (2, 1)]],
}  # fmt: skip
PROMPT = 120


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(model: Path, threads: int, pairs: int, rounds: int, cycles: int) -> dict[str, Any]:
    import numpy as np

    from reame_core.backend.base import Batch
    from reame_core.backend.llama import GRAPH_CACHE, GRAPH_CACHE_ENV
    from reame_core.runtime import planned_backend
    from reame_core.settings import Settings

    settings = Settings(
        model=str(model), threads=threads, parallel=4, ctx=16384, log_level="warning"
    )
    names = tuple(f"{side} {i + 1}" for i in range(pairs) for side in ("off", "on"))
    backends = {}
    for name in names:
        os.environ[GRAPH_CACHE_ENV] = "0" if name.startswith("off") else str(GRAPH_CACHE)
        backends[name] = planned_backend(settings)
    tokens = [int(t) for t in np.random.default_rng(3).integers(100, 5000, PROMPT + 64)]
    for backend in backends.values():
        for seq in range(3):
            batch = Batch()
            for position in range(PROMPT):
                batch.add(tokens[position + seq], position, seq, False)
            backend.decode(batch)

    def cycle(backend: Any, pattern: list[list[tuple[int, int]]]) -> tuple[float, list[Any]]:
        seconds, logits = 0.0, []
        for layout in pattern:
            batch = Batch()
            for seq, n in layout:
                for i in range(n):
                    batch.add(tokens[PROMPT + 7 * seq + i], PROMPT + i, seq, True)
            began = time.perf_counter()
            rows = backend.decode(batch)
            seconds += time.perf_counter() - began
            logits.append(np.array(rows))
            for seq, _ in layout:
                backend.seq_rm(seq, PROMPT)
        return seconds, logits

    times: dict[tuple[str, str], list[float]] = {(p, n): [] for p in PATTERNS for n in names}
    identical = dict.fromkeys(PATTERNS, True)
    grew: dict[str, float] = {}
    for r in range(rounds):
        order = names if r % 2 == 0 else tuple(reversed(names))
        for pattern_name, pattern in PATTERNS.items():
            reference = None
            for name in order:
                before = _rss_mib()
                for c in range(cycles):
                    seconds, logits = cycle(backends[name], pattern)
                    times[(pattern_name, name)].append(seconds)
                    if c == 0:
                        if reference is None:
                            reference = logits
                        elif not all(map(np.array_equal, reference, logits)):
                            identical[pattern_name] = False
                if r == 0:
                    grew[name] = grew.get(name, 0.0) + _rss_mib() - before
    rows = []
    for pattern_name, pattern in PATTERNS.items():
        ms = {n: statistics.median(times[(pattern_name, n)]) * 1000 for n in names}
        ratios = [ms[f"off {i + 1}"] / ms[f"on {i + 1}"] for i in range(pairs)]
        saved = [(ms[f"off {i + 1}"] - ms[f"on {i + 1}"]) / len(pattern) for i in range(pairs)]
        rows.append(
            {
                "pattern": pattern_name,
                "decodes_per_cycle": len(pattern),
                "cycle_ms_by_context": {n: round(v, 3) for n, v in ms.items()},
                "off_over_on_by_pair": [round(r, 3) for r in ratios],
                "off_over_on": round(statistics.median(ratios), 3),
                "saved_ms_per_decode": round(statistics.median(saved), 3),
                "logits_bit_identical": identical[pattern_name],
            }
        )
        print(rows[-1], flush=True)
    for backend in backends.values():
        backend.close()
    return {
        "graphs_kept": GRAPH_CACHE,
        "patterns": rows,
        "max_rss_growth_mib_first_round": {n: round(v, 1) for n, v in grew.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", help="model alias or .gguf path (default: embedded)")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default="graph_cache", help="results file name (no extension)")
    args = parser.parse_args()

    from common import write_report

    from reame_core.models import resolve_model
    from reame_core.settings import Settings

    model = resolve_model(args.model or Settings().model)
    result = measure(model.path, args.threads, args.pairs, args.rounds, args.cycles)
    path = write_report(
        args.name,
        {
            "model": model.path.name,
            "threads": args.threads,
            "pairs": args.pairs,
            "rounds": args.rounds,
            "cycles": args.cycles,
            "prompt_tokens": PROMPT,
            "command": " ".join(["python", "benchmarks/graph_cache.py", *sys.argv[1:]]),
            **result,
        },
    )
    print(f"written to {path}")


if __name__ == "__main__":
    main()
