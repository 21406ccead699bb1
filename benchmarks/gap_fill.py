"""What a gap between decoding slots costs, and what a throwaway row in it saves.

With per-sequence KV, llama.cpp decodes sequences in one pass over the weights only while
their ids run consecutively in the batch. A step decoding slots 0 and 2, with slot 1 busy
computing a prompt chunk or waiting, takes two passes; the engine fills slot 1 with one row
at the end of its KV, without logits, removed after the call (`KVSlots.gap_fillers`).

The model is loaded as `reame serve` loads it on this host (the host plan's attention and KV
types, one KV stream per sequence); four slots hold prompts of different lengths, then each
layout of decoding slots is decoded with its gaps split (llama.cpp's cut) and filled, taking
turns, one token per decoding slot; the tokens are taken back after each call. Reported:
median milliseconds of each way, their ratio, and whether the decoding slots' logits were
bit-identical both ways in every repetition.

    .venv/bin/python benchmarks/gap_fill.py [--model PATH] [--reps 9] [--name gap_fill]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

LAYOUTS = ((0, 2), (1, 3), (0, 3), (0, 1, 3), (0, 2, 3))  # decoding slots of four
PROMPT_LENGTHS = (200, 150, 260, 90)
TEXT = "def fibonacci(n):\n    '''Return the n-th Fibonacci number.'''\n" * 40


def measure(model: Path, threads: int, reps: int) -> list[dict[str, Any]]:
    import numpy as np

    from reame_core.backend.base import Batch
    from reame_core.engine.scheduler import FILLER_TOKEN
    from reame_core.engine.slots import KVSlots
    from reame_core.runtime import planned_backend
    from reame_core.settings import Settings

    backend = planned_backend(
        Settings(model=str(model), threads=threads, parallel=4, ctx=8192, log_level="warning")
    )
    slots = KVSlots(backend)
    tokens = backend.tokenize(TEXT, add_special=False, parse_special=False)
    for slot, length in zip(slots.slots, PROMPT_LENGTHS, strict=True):
        prompt = tokens[37 * slot.seq_id : 37 * slot.seq_id + length]
        batch = Batch()
        for i, token in enumerate(prompt):
            batch.add(token, i, slot.seq_id, i == length - 1)
        backend.decode(batch)
        slots.appended(slot, prompt, chunk=True)

    def decode(decoding: tuple[int, ...], filled: bool) -> tuple[Any, float]:
        """One token in each decoding slot, with the engine's fillers (`filled`) or not."""
        fillers = slots.gap_fillers([(seq_id, 1) for seq_id in decoding]) if filled else {}
        batch = Batch()
        for seq_id, length in enumerate(PROMPT_LENGTHS):
            if seq_id in decoding:
                batch.add(tokens[500 + seq_id], length, seq_id, True)
            elif seq_id in fillers:
                batch.add(FILLER_TOKEN, fillers[seq_id], seq_id, False)
        began = time.perf_counter()
        logits = np.array(backend.decode(batch))
        seconds = time.perf_counter() - began
        slots.drop_fillers(fillers)
        for seq_id in decoding:
            backend.seq_rm(seq_id, PROMPT_LENGTHS[seq_id])
        return logits, seconds

    rows = []
    for decoding in LAYOUTS:
        times: dict[bool, list[float]] = {False: [], True: []}
        identical = True
        decode(decoding, False)  # the first call of a shape builds its graph
        decode(decoding, True)
        for _ in range(reps):
            split, split_s = decode(decoding, False)
            filled, filled_s = decode(decoding, True)
            times[False].append(split_s)
            times[True].append(filled_s)
            identical = identical and bool(np.array_equal(split, filled))
        split_ms = statistics.median(times[False]) * 1000
        filled_ms = statistics.median(times[True]) * 1000
        layout = [(seq_id, 1) for seq_id in decoding]
        rows.append(
            {
                "decoding_slots": list(decoding),
                "passes_split": len(backend.passes(layout)),
                "filler_rows": len(slots.gap_fillers(layout)),
                "ms_split": round(split_ms, 2),
                "ms_filled": round(filled_ms, 2),
                "split_over_filled": round(split_ms / filled_ms, 2),
                "logits_bit_identical": identical,
            }
        )
        print(rows[-1], flush=True)
    backend.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", help="model alias or .gguf path (default: embedded)")
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default="gap_fill", help="results file name (no extension)")
    args = parser.parse_args()

    from common import write_report

    from reame_core.models import resolve_model
    from reame_core.settings import Settings

    model = resolve_model(args.model or Settings().model)
    rows = measure(model.path, args.threads, args.reps)
    path = write_report(
        args.name,
        {
            "model": model.path.name,
            "threads": args.threads,
            "reps": args.reps,
            "prompt_lengths": list(PROMPT_LENGTHS),
            "command": " ".join(["python", "benchmarks/gap_fill.py", *sys.argv[1:]]),
            "layouts": rows,
        },
    )
    print(f"written to {path}")


if __name__ == "__main__":
    main()
