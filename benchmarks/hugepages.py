"""What transparent huge pages for llama.cpp's buffers change (`GGML_HUGEPAGES`,
scripts/patches/ggml-hugepages.patch).

A decode reads every weight once. In 4 KiB pages, how fast it reads them depends on where
the buffers landed: on a shared KVM host, of several contexts of one model loaded in one
process, one ran 10-15% slower than the others throughout, and which process or context
drew that was luck. Where the kernel gives huge pages only to memory that asks for them
(`/sys/kernel/mm/transparent_hugepage/enabled` set to madvise, the usual default), the
patch asks, for every buffer of 2 MiB or more: weights repacked or read into buffers (not
those computed from the mapped file: benchmarks/weights.py), KV cache, compute buffers.

Each repetition runs two fresh processes, the switch on and off, taking turns at going
first (ggml reads the switch once per process). Each loads the model as `reame serve` loads
it on this host, computes a prompt of `PROMPT` tokens three times, then `STEPS` one-token steps, and
reports the prompt's tokens per second (the best of two more, and the first, which also
faults the buffers' pages in), the median step, and how much of its memory was in
huge pages (AnonHugePages of /proc/self/smaps). Reported: medians over the
repetitions, the ratios, every repetition's figures.

    .venv/bin/python benchmarks/hugepages.py [--model PATH] [--reps 6] [--name hugepages]
"""

from __future__ import annotations

import statistics
from typing import Any

PROMPT = 256
STEPS = 120


def child(model: str, threads: int) -> dict[str, Any]:
    """One process's figures (the switch as the environment sets it)."""
    import numpy as np
    from common import memory_mib, prompt_and_steps

    from reame_core.runtime import planned_backend
    from reame_core.settings import Settings

    backend = planned_backend(Settings(model=model, threads=threads, log_level="warning"))
    tokens = [int(t) for t in np.random.default_rng(5).integers(100, 5000, PROMPT + STEPS)]
    prompt_s, steps = prompt_and_steps(backend, tokens, PROMPT, STEPS)
    huge = memory_mib(model)["anon_huge_pages_mib"]
    backend.close()
    return {
        "first_prompt_tok_s": round(PROMPT / prompt_s[0], 1),
        "prompt_tok_s": round(PROMPT / min(prompt_s[1:]), 1),
        "step_ms": round(statistics.median(steps) * 1000, 3),
        "anon_huge_pages_mib": round(huge, 1),
    }


def _spread(runs: list[dict[str, Any]]) -> list[float]:
    steps = [r["step_ms"] for r in runs]
    return [min(steps), max(steps)]


def main() -> None:
    from common import switched_benchmark

    from reame_core.autoconfig.facts import transparent_huge_pages
    from reame_core.backend.llama import HUGEPAGES_ENV

    measured = switched_benchmark(__file__, HUGEPAGES_ENV, child, 6, "hugepages")
    if measured is None:
        return
    runs = measured.runs

    def median(side: str, key: str) -> float:
        return float(statistics.median(r[key] for r in runs[side]))

    summary = {
        "step_ms_on": median("on", "step_ms"),
        "step_ms_off": median("off", "step_ms"),
        "decode_speedup": round(median("off", "step_ms") / median("on", "step_ms"), 3),
        "prompt_tok_s_on": median("on", "prompt_tok_s"),
        "prompt_tok_s_off": median("off", "prompt_tok_s"),
        "prompt_speedup": round(median("on", "prompt_tok_s") / median("off", "prompt_tok_s"), 3),
        "first_prompt_speedup": round(
            median("on", "first_prompt_tok_s") / median("off", "first_prompt_tok_s"), 3
        ),
        "step_ms_spread_on": _spread(runs["on"]),
        "step_ms_spread_off": _spread(runs["off"]),
    }
    print(summary)
    path = measured.write(
        {
            "prompt_tokens": PROMPT,
            "steps": STEPS,
            "transparent_hugepage": transparent_huge_pages(),
            **summary,
        }
    )
    print(f"written to {path}")


if __name__ == "__main__":
    main()
