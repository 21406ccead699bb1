"""What asking for the weights ahead changes in a decode step (`GGML_READ_AHEAD`,
scripts/patches/ggml-read-ahead.patch).

A decode step multiplies every weight matrix with one row: it reads each weight once, in
order, and does little with each byte, so its speed is the speed at which the cores get the
weights from memory. With the switch, one-row products ask for the weights `READ_AHEAD`
bytes ahead of where they read, and on CPUs with AVX-512 VNNI and VBMI repacked Q4_K weights
go through a one-row kernel with fewer operations per byte. Products of more rows (prompts,
verified drafts) are unchanged, but for Q6_K's dot product, which asks wherever it runs.

Each repetition runs two fresh processes, the switch at `READ_AHEAD` and at 0, taking turns
at going first (ggml reads it once per process). Each loads the model as `reame serve` loads
it on this host, computes a prompt of `PROMPT` tokens, then `STEPS` one-token steps, and
reports the median step and a digest of every row of logits it computed. Reported: medians
over the repetitions, their ratio, each repetition's ratio and their median, whether every
process computed the same logits, every repetition's figures.

    .venv/bin/python benchmarks/read_ahead.py [--model PATH] [--reps 6] [--name read_ahead]
"""

from __future__ import annotations

import hashlib
import statistics
from typing import Any

PROMPT = 64
STEPS = 96


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
    backend.close()
    return {
        "step_ms": round(statistics.median(steps) * 1000, 3),
        "digests": {"prompt_and_steps": digest.hexdigest()[:16]},
    }


def main() -> None:
    from common import switched_benchmark

    from reame_core.backend.llama import READ_AHEAD, READ_AHEAD_ENV

    measured = switched_benchmark(
        __file__, READ_AHEAD_ENV, child, 6, "read_ahead", on=str(READ_AHEAD)
    )
    if measured is None:
        return
    runs = measured.runs
    on = statistics.median(r["step_ms"] for r in runs["on"])
    off = statistics.median(r["step_ms"] for r in runs["off"])
    per_rep = [
        round(b["step_ms"] / a["step_ms"], 3) for a, b in zip(runs["on"], runs["off"], strict=True)
    ]
    summary = {
        "read_ahead_bytes": READ_AHEAD,
        "step_ms_on": on,
        "step_ms_off": off,
        "tok_s_on": round(1000 / on, 1),
        "tok_s_off": round(1000 / off, 1),
        "decode_speedup": round(off / on, 3),
        "decode_speedup_per_rep": per_rep,
        "decode_speedup_median_of_reps": round(statistics.median(per_rep), 3),
        "logits_bit_identical": measured.logits_agree(),
    }
    print(summary)
    path = measured.write({"prompt_tokens": PROMPT, "steps": STEPS, **summary})
    print(f"written to {path}")


if __name__ == "__main__":
    main()
