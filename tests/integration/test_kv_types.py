"""A q8_0 K cache, the deterministic configuration's default, keeps its promise: reusing a
prefix gives bit-identical logits."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from reame_core.backend.base import Batch
from reame_core.backend.llama import LlamaBackend
from reame_core.errors import ModelLoadError

PROMPT = " ".join(
    f"Item {i}: the quick brown fox jumps over the lazy dog number {i * 7}." for i in range(25)
)


@pytest.fixture(scope="module")
def quantized_keys(smollm2_path: Path, use_extra_bufts: bool) -> Iterator[LlamaBackend]:
    backend = LlamaBackend(
        smollm2_path,
        n_ctx_seq=1024,
        n_seq_max=2,
        n_batch=512,
        n_threads=2,
        deterministic=True,
        type_k="q8_0",
        use_extra_bufts=use_extra_bufts,
    )
    yield backend
    backend.close()


def prefill(
    backend: LlamaBackend, tokens: list[int], seq: int, start: int, chunk: int
) -> np.ndarray:
    """Decode tokens[start:] as prompt chunks (never a one-token chunk); the last logits."""
    position, logits = start, None
    while position < len(tokens):
        end = min(len(tokens), position + chunk)
        if len(tokens) - end == 1:
            end = len(tokens)
        batch = Batch()
        for i in range(position, end):
            batch.add(tokens[i], i, seq, i == len(tokens) - 1)
        logits = backend.decode(batch)
        position = end
    assert logits is not None
    return np.array(logits[-1])


def test_the_model_info_names_both_cache_types(quantized_keys: LlamaBackend) -> None:
    assert quantized_keys.info.kv_type == "q8_0/f16"


def test_restored_and_trimmed_prefix_gives_identical_logits_with_q8_0_keys(
    quantized_keys: LlamaBackend,
) -> None:
    tokens = quantized_keys.tokenize(PROMPT, add_special=True, parse_special=False)[:400]
    for seq in (0, 1):
        quantized_keys.seq_rm(seq, -1, -1)
    fresh = prefill(quantized_keys, tokens, seq=0, start=0, chunk=128)

    assert quantized_keys.set_seq_state(1, quantized_keys.get_seq_state(0))
    quantized_keys.seq_rm(1, 250, -1)
    reused = prefill(quantized_keys, tokens, seq=1, start=250, chunk=128)

    assert np.array_equal(fresh, reused)


def test_a_quantized_v_cache_without_flash_attention_is_refused_clearly(
    smollm2_path: Path,
) -> None:
    with pytest.raises(ModelLoadError, match="needs flash attention"):
        LlamaBackend(
            smollm2_path,
            n_ctx_seq=256,
            n_seq_max=1,
            flash_attn=False,
            type_k="q8_0",
            type_v="q8_0",
        )
