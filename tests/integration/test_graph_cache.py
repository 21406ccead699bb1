"""Reame's build keeps llama.cpp's graphs of recent decode shapes and reuses any that fits
(`LLAMA_GRAPH_CACHE`, scripts/patches/llama-graph-cache.patch), where llama.cpp alone
reuses only the last decode's. A speed-up only: every decode must give exactly the logits
it gives when each graph is built anew, and a graph of one sequence's stream must never
serve a decode of another's (same shape, other KV stream). Checked on SmolLM2 over a
schedule of verification-like steps (drafts of a few lengths, rolled back after), one
sequence and two, in contexts that keep no graph, few (so graphs are evicted), and the
default number.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from reame_core.backend.base import Batch
from reame_core.backend.llama import GRAPH_CACHE, GRAPH_CACHE_ENV, LlamaBackend
from reame_core.models.shape import KVType

PROMPT = 24
DecodeWith = Callable[[dict[str, str]], tuple[np.ndarray, int]]
# Each step: (sequence, tokens) decoded together, every row's logits kept; then each
# sequence keeps some of its tokens and the rest are removed, as after a verified draft.
STEP_CYCLE = (
    ((0, 1),),
    ((0, 4),),
    ((0, 1),),
    ((0, 1),),
    ((0, 7),),
    ((1, 1),),
    ((1, 4),),
    ((0, 1), (1, 1)),
    ((0, 1),),
    ((1, 1),),  # the shape of the step before, the other sequence's stream
    ((0, 4),),
    ((0, 1), (1, 3)),
    ((1, 7),),
    ((0, 2),),
)
STEPS = STEP_CYCLE * 3


def _decode_schedule(backend: LlamaBackend) -> np.ndarray:
    rng = np.random.default_rng(7)
    positions = {}
    for seq in (0, 1):
        batch = Batch()
        for position in range(PROMPT):
            batch.add(int(rng.integers(100, 5000)), position, seq, False)
        backend.decode(batch)
        positions[seq] = PROMPT
    rows = []
    for step, layout in enumerate(STEPS):
        batch = Batch()
        for seq, n in layout:
            for offset in range(n):
                batch.add(int(rng.integers(100, 5000)), positions[seq] + offset, seq, True)
        rows.append(np.array(backend.decode(batch), copy=True))
        for seq, n in layout:
            positions[seq] += 1 + step % n
            assert backend.seq_rm(seq, positions[seq], -1)
    return np.concatenate(rows)


@pytest.fixture
def run(
    smollm2_path: Path,
    use_extra_bufts: bool,
    flash_attn: bool,
    kv_types: tuple[KVType, KVType],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[DecodeWith]:
    def decode_with(environment: dict[str, str]) -> tuple[np.ndarray, int]:
        """The schedule's logits in a context made with `environment`, and how many of
        its decodes reused a graph."""
        for name, value in environment.items():
            monkeypatch.setenv(name, value)
        backend = LlamaBackend(
            smollm2_path,
            n_ctx_seq=512,
            n_seq_max=2,
            n_batch=64,
            n_threads=2,
            deterministic=True,
            flash_attn=flash_attn,
            type_k=kv_types[0],
            type_v=kv_types[1],
            use_extra_bufts=use_extra_bufts,
        )
        try:
            logits = _decode_schedule(backend)
            reused = int(llama_cpp.llama_perf_context(backend._ctx).n_reused)
        finally:
            backend.close()
        return logits, reused

    yield decode_with


def test_kept_graphs_give_the_logits_of_graphs_built_anew(run: DecodeWith) -> None:
    built_anew, _ = run({"LLAMA_GRAPH_REUSE_DISABLE": "1", GRAPH_CACHE_ENV: "0"})
    last_only, reused_last = run({"LLAMA_GRAPH_REUSE_DISABLE": "0", GRAPH_CACHE_ENV: "0"})
    few, reused_few = run({GRAPH_CACHE_ENV: "2"})
    default, reused_default = run({GRAPH_CACHE_ENV: str(GRAPH_CACHE)})
    assert np.array_equal(last_only, built_anew)
    assert np.array_equal(few, built_anew)
    assert np.array_equal(default, built_anew)
    # The schedule's shapes recur: kept graphs serve most of its decodes, llama.cpp's own
    # reuse (the same shape twice running) only a few.
    assert reused_last < len(STEPS) // 4
    assert reused_default > len(STEPS) // 2 > reused_last
    assert reused_last <= reused_few <= reused_default
