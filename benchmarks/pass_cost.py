"""What a pass of n tokens of one sequence costs against a pass of one: the ceiling of every
draft source on this host.

Verifying a draft of k tokens is one pass of k + 1 tokens; it pays only if that pass costs
less than the k + 1 one-token passes it replaces, times the share of the draft accepted. The
model is loaded as `reame serve` loads it on this host (the host plan's attention and KV
types, one KV stream per sequence), a 300-token prompt is computed, then passes of n
tokens are appended after it and taken back, with logits for every row (as verification
asks) and for the last row only: each shape `WARM` + `TIMED` times in a row, sizes largest
first, in every repetition; medians over the repetitions' timed passes. The untimed ones
come first so that llama.cpp reuses that shape's compute graph, as the engine's decodes
mostly do (scripts/patches/llama-graph-cache.patch keeps a few graphs), where a pass of a
shape not seen lately pays for building and allocating its graph too (on SmolLM2, a
one-token pass cost 5.7 ms that way against 3.0-3.7 ms in the engine).

With --compare-amx-tiles (a CPU with AMX): the same in fresh processes, alternating, with
Reame's setting of the AMX row kernels (`AMX_ROWS_ENV`, scripts/patches/ggml-amx-row-kernels.patch)
and with ggml's own choice (the switch at 1: every product of two rows or more in AMX tiles);
`--rounds` processes of each, taking turns at going first, the median of each process's
medians. With
--compare-q4_1-row-groups (Q4_1 weights where no repacked or AMX kernel takes them, as on an
AVX2 CPU) likewise, Reame's row groups (`Q4_1_ROW_GROUPS_ENV`,
scripts/patches/ggml-q4_1-row-groups.patch) against ggml's one row at a time. With
--compare-k-quant-row-groups (Q4_K and Q6_K weights where no AMX kernel takes them: x86 with
AVX2) likewise, Reame's K-quant row groups (`K_QUANT_ROW_GROUPS_ENV`,
scripts/patches/ggml-k-quant-row-groups.patch; a deterministic server's setting, every
product) against ggml's 4-row, tiled and one-row kernels. With --compare-q8_0-row-groups
(Q8_0 weights, as SmolLM2's output layer, where no AMX kernel takes them: x86 with AVX2)
likewise, Reame's Q8_0 row groups (`Q8_0_ROW_GROUPS_ENV`,
scripts/patches/ggml-q8_0-row-groups.patch) against llamafile's kernel, which ggml gives
every product of two rows or more. With --compare-q5_0-row-groups (Q5_0 weights, as
Qwen2.5-0.5B's layers whose rows no K-quant takes) likewise, the same row groups for Q5_0
(`Q5_0_ROW_GROUPS_ENV`, scripts/patches/ggml-q5_0-row-groups.patch) against llamafile's
kernel. With --compare-row-groups-chunk likewise, the row groups'
products of a few rows handed to the threads in Reame's chunks of 64 weight rows
(`ROW_GROUPS_CHUNK_ENV`, scripts/patches/ggml-row-groups-chunk.patch) against ggml's 16.
`--sizes` replaces the pass sizes
(prompt chunks too: a pass of 512 tokens is one of a prompt's, whose ratio with logits for
the last row only the report keeps beside that with logits for every row).

    .venv/bin/python benchmarks/pass_cost.py [--model PATH] [--reps 7] [--name pass_cost]
    .venv/bin/python benchmarks/pass_cost.py --compare-amx-tiles [--rounds 3] [--reps 5]
    .venv/bin/python benchmarks/pass_cost.py --compare-q4_1-row-groups [--sizes 1 2 4 64 512]
    .venv/bin/python benchmarks/pass_cost.py --compare-k-quant-row-groups --model qwen2.5-coder-1.5b
    .venv/bin/python benchmarks/pass_cost.py --compare-q8_0-row-groups [--sizes 1 2 4 8]
    .venv/bin/python benchmarks/pass_cost.py --compare-q5_0-row-groups --model qwen2.5-coder-0.5b
    .venv/bin/python benchmarks/pass_cost.py --compare-row-groups-chunk
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from reame_core.backend.llama import (
    K_QUANT_ROW_GROUPS_ENV,
    Q4_1_ROW_GROUPS_ENV,
    Q5_0_ROW_GROUPS_ENV,
    Q8_0_ROW_GROUPS_ENV,
    ROW_GROUPS_CHUNK_ENV,
)
from reame_core.backend.probe_child import AMX_ROWS_ENV

SIZES = (1, 2, 3, 4, 6, 8, 12, 16)
WARM = 2  # untimed passes of a shape before its timed ones
TIMED = 3  # timed passes of a shape in a row
TEXT = "def fibonacci(n):\n    '''Return the n-th Fibonacci number.'''\n" * 16


def pass_seconds(
    model: Path, threads: int, reps: int, sizes: tuple[int, ...] = SIZES
) -> dict[tuple[int, str], float]:
    """Median seconds of a pass of n tokens after a 300-token prompt (its graph warm), by
    (n, "all") with logits for every row and (n, "last") for the last row only."""
    from common import repeated_pass

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
        # Largest first: the one-token pass, the price of every other, is timed furthest
        # from the passes large enough for AMX tiles.
        for n in sorted(sizes, reverse=True):
            for rows in ("all", "last"):
                batch = Batch()
                for j in range(n):
                    batch.add(prompt[j % len(prompt)], start + j, 0, rows == "all" or j == n - 1)
                seconds.setdefault((n, rows), []).extend(
                    repeated_pass(backend, batch, start, WARM, TIMED)
                )
    backend.close()
    return {key: statistics.median(values) for key, values in seconds.items()}


# A switch's setting per configuration (None: Reame's), and the comparisons of two: Reame's
# configuration the first of each pair, the report's key for the other's time over Reame's.
CONFIGS = {
    "row-kernels": (AMX_ROWS_ENV, None),
    "ggml-tiles": (AMX_ROWS_ENV, "1"),  # every product of two rows or more in AMX tiles
    "row-groups": (Q4_1_ROW_GROUPS_ENV, None),
    "one-row": (Q4_1_ROW_GROUPS_ENV, "0"),
    "k-quant-row-groups": (K_QUANT_ROW_GROUPS_ENV, None),  # deterministic: every product
    "ggml-k-quant": (K_QUANT_ROW_GROUPS_ENV, "0"),  # ggml's 4-row, tiled and one-row kernels
    "q8_0-row-groups": (Q8_0_ROW_GROUPS_ENV, None),
    "llamafile-q8_0": (Q8_0_ROW_GROUPS_ENV, "0"),  # llamafile's kernel from two rows on
    "q5_0-row-groups": (Q5_0_ROW_GROUPS_ENV, None),
    "llamafile-q5_0": (Q5_0_ROW_GROUPS_ENV, "0"),  # llamafile's kernel from two rows on
    "chunks-of-64": (ROW_GROUPS_CHUNK_ENV, None),
    "ggml-chunks": (ROW_GROUPS_CHUNK_ENV, "0"),  # ggml's 16 weight rows a chunk
}
# --compare-NAME: (Reame's configuration, the other, the report's key for other over Reame's)
COMPARISONS = {
    "amx-tiles": ("row-kernels", "ggml-tiles", "tiles_over_row_kernels"),
    "q4_1-row-groups": ("row-groups", "one-row", "one_row_over_row_groups"),
    "k-quant-row-groups": ("k-quant-row-groups", "ggml-k-quant", "ggml_over_row_groups"),
    "q8_0-row-groups": ("q8_0-row-groups", "llamafile-q8_0", "llamafile_over_row_groups"),
    "q5_0-row-groups": ("q5_0-row-groups", "llamafile-q5_0", "llamafile_over_row_groups"),
    "row-groups-chunk": ("chunks-of-64", "ggml-chunks", "ggml_chunks_over_chunks_of_64"),
}


def child(model: str, threads: int, reps: int, config: str, sizes: tuple[int, ...]) -> None:
    """One configuration in this fresh process: its pass seconds, as one JSON line."""
    variable, value = CONFIGS[config]
    if value is not None:
        os.environ[variable] = value  # before llama.cpp computes anything
    seconds = pass_seconds(Path(model), threads, reps, sizes)
    print(json.dumps({"seconds": [[n, rows, t] for (n, rows), t in seconds.items()]}))


def table_of(
    seconds: dict[tuple[int, str], float], sizes: tuple[int, ...]
) -> list[dict[str, float]]:
    one = seconds[(1, "all")]
    table = []
    for n in sizes:
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
    return table


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", help="model alias or .gguf path (default: embedded)")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    for name in COMPARISONS:
        parser.add_argument(
            f"--compare-{name}", dest="comparison", action="store_const", const=name
        )
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--rounds", type=int, default=3, help="processes per configuration")
    parser.add_argument("--name", default="pass_cost", help="results file name (no extension)")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = tuple(sorted(set(args.sizes) | {1}))  # every pass is priced in one-token passes
    if args.child:
        model, threads, reps, config = args.child
        child(model, int(threads), int(reps), config, sizes)
        return

    from common import measure, write_report

    from reame_core.models import resolve_model
    from reame_core.settings import Settings

    model = resolve_model(args.model or Settings().model)
    report: dict[str, object] = {
        "model": model.path.name,
        "threads": args.threads,
        "reps": args.reps,
        "command": " ".join(["python", "benchmarks/pass_cost.py", *sys.argv[1:]]),
    }
    report["sizes"] = list(sizes)
    if args.comparison is None:
        table = table_of(pass_seconds(model.path, args.threads, args.reps, sizes), sizes)
        for row in table:
            print(row, flush=True)
        report["passes"] = table
    else:
        reames, other, key = COMPARISONS[args.comparison]
        samples: dict[str, dict[tuple[int, str], list[float]]] = {reames: {}, other: {}}
        for round_ in range(args.rounds):
            # taking turns at going first: on a shared host the cores' speed drifts
            for config in list(samples)[:: 1 if round_ % 2 == 0 else -1]:
                found = measure(
                    __file__, str(model.path), str(args.threads), str(args.reps), config,
                    "--sizes", *map(str, sizes),
                )  # fmt: skip
                for n, rows, seconds in found["seconds"]:
                    samples[config].setdefault((n, rows), []).append(seconds)
        tables = {
            config: table_of({k: statistics.median(v) for k, v in by_size.items()}, sizes)
            for config, by_size in samples.items()
        }
        report["rounds"] = args.rounds
        report["passes"] = tables
        pairs = list(zip(tables[reames], tables[other], strict=True))
        report[key] = {
            row["tokens"]: round(theirs["ms_logits_every_row"] / row["ms_logits_every_row"], 3)
            for row, theirs in pairs
        }
        # A prompt chunk's pass: logits for its last row only.
        report[f"{key}_last_row"] = {
            row["tokens"]: round(theirs["ms_logits_last_row"] / row["ms_logits_last_row"], 3)
            for row, theirs in pairs
        }
        print(json.dumps(report[key]), json.dumps(report[f"{key}_last_row"]))
    print(write_report(args.name, report))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
