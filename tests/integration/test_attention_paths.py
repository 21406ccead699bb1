"""The deterministic configurations' attention: flash attention with f16 keys and values on
the build's row-exact path (the plan's default), and with keys in q8_0 (a stock build's),
computes every query row along one path, so a token's logits depend neither on the thread
count nor on how its prompt was cut into chunks (benchmarks/attention_paths.py measures
every path). Without flash attention (f16 keys and values: the plan's choice on a stock
build where the build check timed prompts much faster that way) a prompt cut anywhere must
give the same logits too.

The thread check runs against 600 tokens of context: from 512 cached cells on, ggml's own
flash attention with f16 keys and values splits a lone row's cache among the threads, and
its result then depends on their number — the control below, in a process with the
row-exact path switched off, shows the check reaches that path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from reame_core.backend.base import Batch
from reame_core.backend.llama import LlamaBackend
from reame_core.backend.probe import BuildVerdict, attention_facts, child_command, run_attempt
from reame_core.backend.probe_child import ROW_EXACT_ENV
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


def test_the_timing_child_knows_whether_a_lone_row_is_exact_without_flash_attention(
    smollm2_path: Path, use_extra_bufts: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asked where the build lacks the row-exact path (switched off here, as a stock build)."""
    monkeypatch.setenv(ROW_EXACT_ENV, "0")
    launch = child_command(smollm2_path, time_attention=True)
    timing = run_attempt(launch(use_extra_bufts), extra_bufts=use_extra_bufts, timeout=300)
    plain = load(smollm2_path, use_extra_bufts, None, flash_attn=False)
    try:
        tokens = tokens_for(plain, 300)
        whole = logits_in_chunks(plain, tokens, [300])[-1]
        alone = logits_in_chunks(plain, tokens, [299, 1])[-1]
    finally:
        plain.close()
    assert timing.outcome == "ok", timing.describe()
    assert attention_facts(timing).exact_without_flash == bool(np.array_equal(whole, alone))


def test_the_build_check_finds_the_row_exact_path_in_reames_build(
    smollm2_path: Path, use_extra_bufts: bool, build_check: BuildVerdict
) -> None:
    """scripts/llama-wheel patches every build with it, so the check must find it, and what
    it found must hold in this process too: a lone row against 600 cells (where ggml's own
    kernels split the cache between threads) equals the same row inside a chunk."""
    assert build_check.attention.row_exact_flash
    f16 = load(smollm2_path, use_extra_bufts, "f16")
    try:
        tokens = tokens_for(f16, CONTEXT)
        whole = logits_in_chunks(f16, tokens, [512, CONTEXT - 512])[-1]
        alone = logits_in_chunks(f16, tokens, [512, CONTEXT - 513, 1])[-1]
    finally:
        f16.close()
    assert np.array_equal(whole, alone)


def test_a_backend_loaded_without_an_engine_takes_the_plans_attention(
    smollm2_path: Path, flash_attn: bool, kv_types: tuple[KVType, KVType]
) -> None:
    """What benchmarks calling llama.cpp directly load: the configuration a server runs."""
    backend = planned_backend(Settings(model=str(smollm2_path), parallel=2, ctx=512))
    try:
        info = backend.info
        assert (info.n_seq_max, info.n_ctx_seq) == (2, 512)
        assert info.extra["flash_attn"] is flash_attn
        keys, values = kv_types
        assert info.kv_type == (keys if keys == values else f"{keys}/{values}")
    finally:
        backend.close()


CONFIGURATIONS = {"flash-row-exact": (True, "f16"), "flash-q8_0-keys": (True, None)}


@pytest.fixture(scope="module", params=[*CONFIGURATIONS, "no-flash"])
def deterministic(
    request: pytest.FixtureRequest, smollm2_path: Path, use_extra_bufts: bool
) -> Iterator[LlamaBackend]:
    """Every deterministic attention configuration, whichever the plan picks on this CPU."""
    flash_attn, type_k = CONFIGURATIONS.get(request.param, (False, None))
    backend = load(smollm2_path, use_extra_bufts, type_k, flash_attn=flash_attn)
    yield backend
    backend.close()


def test_the_default_is_flash_attention_with_f16_keys_on_the_row_exact_path(
    kv_types: tuple[KVType, KVType], flash_attn: bool
) -> None:
    assert flash_attn and kv_types == ("f16", "f16")
    assert stable_attention(True, "f16", "f16", row_exact=True)
    assert stable_attention(True, "q8_0", "f16")
    assert not stable_attention(True, "f16", "f16")


@pytest.mark.parametrize("type_k", ["f16", "q8_0"])
def test_a_token_gets_the_same_logits_with_one_thread_as_with_two(
    smollm2_path: Path, use_extra_bufts: bool, type_k: KVType
) -> None:
    backend = load(smollm2_path, use_extra_bufts, type_k)
    try:
        one, two = one_token_after_context(backend, 1), one_token_after_context(backend, 2)
    finally:
        backend.close()
    assert np.array_equal(one, two)


CONTROL = """
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from test_attention_paths import load, one_token_after_context
backend = load(sys.argv[2], sys.argv[3] == "True", "f16")
one, two = one_token_after_context(backend, 1), one_token_after_context(backend, 2)
print("differs" if not np.array_equal(one, two) else "equal")
"""


def test_the_control_ggmls_own_f16_paths_depend_on_the_thread_count(
    smollm2_path: Path, use_extra_bufts: bool
) -> None:
    """In a process with the row-exact path switched off, f16 keys and values take the
    thread-split path and differ: the check above reaches the path it guards against."""
    done = subprocess.run(
        [sys.executable, "-c", CONTROL, str(Path(__file__).parent), str(smollm2_path),
         str(use_extra_bufts)],
        env={**os.environ, ROW_EXACT_ENV: "0"},
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    assert done.stdout.strip().splitlines()[-1] == "differs", (
        "ggml's f16 flash attention no longer depends on threads: revisit the row-exact path"
    )


@pytest.mark.parametrize("tail", [1, 2, 8, 63, 64, 65])
def test_a_prompt_cut_anywhere_gives_the_logits_of_one_chunk(
    deterministic: LlamaBackend, tail: int, build_check: BuildVerdict
) -> None:
    """SmolLM2's Q4_1 weights are not repacked, so the chunk grid is not needed here: any
    cut must give the same logits (with f16 flash attention, tails under 64 did not). Without
    flash attention a lone row against 256 cached cells or more takes another path on some
    CPUs; the build check says whether it does here, and Reame then keeps flash attention."""
    if tail == 1 and not deterministic.flash_attn and not build_check.attention.exact_without_flash:
        pytest.skip(
            "without flash attention a lone row is not exact on this CPU, or the build check "
            "did not ask (the build has the row-exact path, which the plan takes)"
        )
    tokens = tokens_for(deterministic, 300)
    whole = logits_in_chunks(deterministic, tokens, [300])
    cut = logits_in_chunks(deterministic, tokens, [300 - tail, tail])
    assert np.array_equal(cut[300 - tail :], whole[300 - tail :])
