"""What asking for the weights ahead changes in a decode step and in a pass of a few tokens
(`GGML_READ_AHEAD`, scripts/patches/ggml-read-ahead.patch).

A decode step multiplies every weight matrix with one row: it reads each weight once, in
order, and does little with each byte, so its speed is the speed at which the cores get the
weights from memory; a pass of a few tokens (a draft verified) nearly so. With the switch,
products of one row and of a few ask for the weights `READ_AHEAD` bytes ahead of where they
read, and on CPUs with AVX-512 VNNI repacked Q4_K weights (with VBMI too; one row, and the
rows the K-quant row groups take) and the row groups' Q6_K weights (a few rows) go through
kernels with fewer operations per byte.

Each repetition runs two fresh processes, the switch at `READ_AHEAD` and at 0, taking turns
at going first (ggml reads it once per process). Each loads the model as `reame serve` loads
it on this host, computes a prompt of `PROMPT` tokens, then `STEPS` one-token steps, then
passes of each size in `PASSES` with logits for every row (as verification asks), appended
after them and taken back, `PASS_WARM` untimed and `PASS_TIMED` timed in a row; it reports
the median step, each size's median pass, and a digest of every row of logits it computed.
Reported: medians over the repetitions, their ratio, each repetition's ratio and their
median; each pass's price in one-token steps of its process (median over the repetitions);
whether every process computed the same logits; every repetition's figures.

    .venv/bin/python benchmarks/read_ahead.py [--model PATH] [--reps 6] [--name read_ahead]
"""

from __future__ import annotations

import hashlib
import statistics
from typing import Any

PROMPT = 64
STEPS = 96
PASSES = (2, 4, 8)  # drafts of 1, 3 and 7 tokens verified
PASS_WARM = 2  # untimed passes of a size first: llama.cpp reuses that shape's graph
PASS_TIMED = 8


def child(model: str, threads: int) -> dict[str, Any]:
    """One process's figures (the switch as the environment sets it)."""
    import numpy as np
    from common import prompt_and_steps

    from reame_core.runtime import planned_backend
    from reame_core.settings import Settings

    backend = planned_backend(Settings(model=model, threads=threads, log_level="warning"))
    tokens = [int(t) for t in np.random.default_rng(5).integers(100, 5000, PROMPT + STEPS)]
    digest = hashlib.sha256()
    _, steps = prompt_and_steps(backend, tokens, PROMPT, STEPS, digest)
    passes = pass_seconds(backend, tokens, PROMPT + STEPS, digest)
    backend.close()
    return {
        "step_ms": round(statistics.median(steps) * 1000, 3),
        "pass_ms": {n: round(seconds * 1000, 3) for n, seconds in passes.items()},
        "digests": {"prompt_steps_and_passes": digest.hexdigest()[:16]},
    }


def pass_seconds(backend: Any, tokens: list[int], start: int, digest: Any) -> dict[int, float]:
    """Each size's median pass of sequence 0 after its first `start` tokens, every row's
    logits asked for; `digest` takes the logits of each size's first pass."""
    from common import repeated_pass

    from reame_core.backend.base import Batch

    medians = {}
    for n in PASSES:
        batch = Batch()
        for j in range(n):
            batch.add(tokens[j], start + j, 0, True)
        seconds = repeated_pass(backend, batch, start, PASS_WARM, PASS_TIMED, digest)
        medians[n] = statistics.median(seconds)
    return medians


def compared(on: list[float], off: list[float]) -> dict[str, Any]:
    """Times with the switch and without, a repetition each: both medians, how many times
    faster with it (of the medians), each repetition's ratio and their median."""
    per_rep = [round(b / a, 3) for a, b in zip(on, off, strict=True)]
    return {
        "on": statistics.median(on),
        "off": statistics.median(off),
        "speedup": round(statistics.median(off) / statistics.median(on), 3),
        "per_rep": per_rep,
        "median_of_reps": round(statistics.median(per_rep), 3),
    }


def pass_figures(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per pass size: `compared` of its passes, and the pass's price in its process's
    one-token steps on and off (the median over the repetitions)."""
    figures = {}
    for n in PASSES:
        key = str(n)  # the children's JSON keys
        passes = compared(
            [r["pass_ms"][key] for r in runs["on"]], [r["pass_ms"][key] for r in runs["off"]]
        )
        figures[key] = {
            "pass_ms_on": passes["on"],
            "pass_ms_off": passes["off"],
            "speedup": passes["speedup"],
            "speedup_per_rep": passes["per_rep"],
            "speedup_median_of_reps": passes["median_of_reps"],
            **{
                f"in_steps_{side}": round(
                    statistics.median(r["pass_ms"][key] / r["step_ms"] for r in runs[side]), 2
                )
                for side in ("on", "off")
            },
        }
    return figures


def main() -> None:
    from common import switched_benchmark

    from reame_core.backend.llama import READ_AHEAD, READ_AHEAD_ENV

    measured = switched_benchmark(
        __file__, READ_AHEAD_ENV, child, 6, "read_ahead", on=str(READ_AHEAD)
    )
    if measured is None:
        return
    runs = measured.runs
    steps = compared([r["step_ms"] for r in runs["on"]], [r["step_ms"] for r in runs["off"]])
    summary = {
        "read_ahead_bytes": READ_AHEAD,
        "step_ms_on": steps["on"],
        "step_ms_off": steps["off"],
        "tok_s_on": round(1000 / steps["on"], 1),
        "tok_s_off": round(1000 / steps["off"], 1),
        "decode_speedup": steps["speedup"],
        "decode_speedup_per_rep": steps["per_rep"],
        "decode_speedup_median_of_reps": steps["median_of_reps"],
        "passes": pass_figures(runs),
        "logits_bit_identical": measured.logits_agree(),
    }
    print(summary)
    path = measured.write(
        {
            "prompt_tokens": PROMPT,
            "steps": STEPS,
            "pass_warm": PASS_WARM,
            "pass_timed": PASS_TIMED,
            **summary,
        }
    )
    print(f"written to {path}")


if __name__ == "__main__":
    main()
