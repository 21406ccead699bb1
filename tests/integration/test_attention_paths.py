"""The deterministic configurations' attention: flash attention with keys in q8_0 computes
every query row along one path, so a token's logits depend neither on the thread count nor
on how its prompt was cut into chunks (benchmarks/attention_paths.py measures every path).
Without flash attention (f16 keys and values: the plan's choice where the build check timed
prompts much faster that way) a prompt cut anywhere must give the same logits too.

The thread check runs against 600 tokens of context: from 512 cached cells on, ggml's flash
attention with f16 keys and values splits a lone row's cache among the threads, and its
result then depends on their number — the control below shows the check reaches that path.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from reame_core.backend.base import Batch
from reame_core.backend.llama import LlamaBackend
from reame_core.backend.probe import BuildVerdict
from reame_core.models.shape import KVType, stable_attention
from reame_core.runtime import planned_backend
from reame_core.settings import Settings

pytestmark = pytest.mark.model

CONTEXT = 600


def tokens_for(backend: LlamaBackend, count: int) -> list[int]:
    rng = np.random.default_rng(3)
    return [int(t) for t in rng.integers(100, min(backend.info.n_vocab, 5000), count)]


def logits_in_chunks(
    backend: LlamaBackend, tokens: list[int], sizes: list[int], last_threads: int = 2
) -> np.ndarray:
    """Every token's logits, the tokens fed in chunks of `sizes` (the last chunk computed
    with `last_threads` threads)."""
    backend.seq_rm(0, 0, -1)
    rows, position = [], 0
    try:
        for index, size in enumerate(sizes):
            if index == len(sizes) - 1:
                backend.set_threads(last_threads)
            batch = Batch()
            for offset in range(size):
                batch.add(tokens[position + offset], position + offset, 0, True)
            rows.append(np.array(backend.decode(batch), copy=True))
            position += size
    finally:
        backend.set_threads(2)
        backend.seq_rm(0, 0, -1)  # the session's backend goes to the next test empty
    return np.concatenate(rows)


def one_token_after_context(backend: LlamaBackend, threads: int) -> np.ndarray:
    tokens = tokens_for(backend, CONTEXT)
    return logits_in_chunks(backend, tokens, [256, 256, CONTEXT - 513, 1], threads)[-1]


def load(
    path: Path, use_extra_bufts: bool, type_k: KVType | None, flash_attn: bool = True
) -> LlamaBackend:
    return LlamaBackend(
        path,
        n_ctx_seq=1024,
        n_seq_max=1,
        n_batch=512,
        n_threads=2,
        deterministic=True,
        flash_attn=flash_attn,
        type_k=type_k,
        use_extra_bufts=use_extra_bufts,
    )


def test_the_build_check_knows_whether_a_lone_row_is_exact_without_flash_attention(
    smollm2_path: Path, use_extra_bufts: bool, build_check: BuildVerdict
) -> None:
    plain = load(smollm2_path, use_extra_bufts, None, flash_attn=False)
    try:
        tokens = tokens_for(plain, 300)
        whole = logits_in_chunks(plain, tokens, [300])[-1]
        alone = logits_in_chunks(plain, tokens, [299, 1])[-1]
    finally:
        plain.close()
    assert build_check.attention.exact_without_flash == bool(np.array_equal(whole, alone))


def test_a_backend_loaded_without_an_engine_takes_the_plans_attention(
    smollm2_path: Path, flash_attn: bool
) -> None:
    """What benchmarks calling llama.cpp directly load: the configuration a server runs."""
    backend = planned_backend(Settings(model=str(smollm2_path), parallel=2, ctx=512))
    try:
        info = backend.info
        assert (info.n_seq_max, info.n_ctx_seq) == (2, 512)
        assert info.extra["flash_attn"] is flash_attn
        assert info.kv_type == ("q8_0/f16" if flash_attn else "f16")
    finally:
        backend.close()


@pytest.fixture(scope="module", params=[True, False], ids=["flash-q8_0-keys", "no-flash"])
def deterministic(
    request: pytest.FixtureRequest, smollm2_path: Path, use_extra_bufts: bool
) -> Iterator[LlamaBackend]:
    """Both deterministic attention configurations, whichever the plan picks on this CPU."""
    backend = load(smollm2_path, use_extra_bufts, None, flash_attn=request.param)
    yield backend
    backend.close()


def test_the_default_is_flash_attention_with_q8_0_keys(
    smollm2_path: Path, use_extra_bufts: bool
) -> None:
    default = load(smollm2_path, use_extra_bufts, None)
    try:
        assert default.flash_attn
        assert default.info.kv_type == "q8_0/f16"
    finally:
        default.close()
    assert stable_attention(True, "q8_0", "f16")
    assert not stable_attention(True, "f16", "f16")


def test_a_token_gets_the_same_logits_with_one_thread_as_with_two(
    smollm2_path: Path, use_extra_bufts: bool
) -> None:
    default = load(smollm2_path, use_extra_bufts, None)
    try:
        one, two = one_token_after_context(default, 1), one_token_after_context(default, 2)
    finally:
        default.close()
    assert np.array_equal(one, two)

    # The control: f16 keys and values take the thread-split path here, and differ.
    f16 = load(smollm2_path, use_extra_bufts, "f16")
    try:
        differs = not np.array_equal(
            one_token_after_context(f16, 1), one_token_after_context(f16, 2)
        )
    finally:
        f16.close()
    assert differs, "f16 flash attention no longer depends on threads: revisit the q8_0 keys"


@pytest.mark.parametrize("tail", [1, 2, 8, 63, 64, 65])
def test_a_prompt_cut_anywhere_gives_the_logits_of_one_chunk(
    deterministic: LlamaBackend, tail: int, build_check: BuildVerdict
) -> None:
    """SmolLM2's Q4_1 weights are not repacked, so the chunk grid is not needed here: any
    cut must give the same logits (with f16 flash attention, tails under 64 did not). Without
    flash attention a lone row against 256 cached cells or more takes another path on some
    CPUs; the build check says whether it does here, and Reame then keeps flash attention."""
    if tail == 1 and not deterministic.flash_attn and not build_check.attention.exact_without_flash:
        pytest.skip("without flash attention a lone row is not exact on this CPU (build check)")
    tokens = tokens_for(deterministic, 300)
    whole = logits_in_chunks(deterministic, tokens, [300])
    cut = logits_in_chunks(deterministic, tokens, [300 - tail, tail])
    assert np.array_equal(cut[300 - tail :], whole[300 - tail :])
