"""The fast configuration (unified KV + flash attention) on SmolLM2: exact only up to near-ties.

llama.cpp does not promise that a sequence's logits here are independent of its batch
neighbours, so concurrent and serial greedy runs may part ways, but only at a near-tie of
the serial run and rarely (see near_tie.py; on the AVX-512 build measured there, batching
changed no logit at all).

The fast configuration runs ggml's own attention paths: a `--no-deterministic` server never
switches the row-exact path on. The suite's own process has it on (conftest.py), and ggml
reads the switch once, so the check runs in a pytest process of its own with it off.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from near_tie import BATCH_FLIP_RATE, TOP, assert_near_ties, plain_run

from reame_core.backend.base import Backend
from reame_core.backend.llama import LlamaBackend
from reame_core.backend.probe_child import ROW_EXACT_ENV
from reame_core.chat import encode_chat
from reame_core.engine.engine import Engine
from reame_core.request import FinishEvent, GenerationRequest, SamplingParams

Together = Callable[[Engine, Sequence[GenerationRequest]], list[FinishEvent]]

MAX_TOKENS = 48


@pytest.fixture(scope="module")
def fast_backend(smollm2_path: Path, use_extra_bufts: bool) -> Iterator[LlamaBackend]:
    backend = LlamaBackend(
        smollm2_path,
        n_ctx_seq=1024,
        n_seq_max=8,
        n_batch=512,
        n_threads=2,
        deterministic=False,
        use_extra_bufts=use_extra_bufts,
    )
    yield backend
    backend.close()


def test_the_fast_configuration_in_a_process_with_ggmls_own_attention() -> None:
    if os.environ.get(ROW_EXACT_ENV) == "0":
        pytest.skip("this is that process")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
        env={**os.environ, ROW_EXACT_ENV: "0"},
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout, done.stdout[-1000:]


@pytest.mark.skipif(
    os.environ.get(ROW_EXACT_ENV) != "0", reason="runs in a process with ggml's own attention"
)
def test_concurrent_greedy_runs_follow_serial_runs_but_at_near_ties(
    questions: tuple[str, ...],
    fast_backend: LlamaBackend,
    make_engine: Callable[[Backend], Engine],
    forget_kv: Callable[[Engine], None],
    generate_together: Together,
) -> None:
    engine = make_engine(fast_backend)
    prompts = [encode_chat(fast_backend.info, [{"role": "user", "content": q}]) for q in questions]
    requests = [
        GenerationRequest(
            prompt, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=TOP)
        )
        for prompt in prompts
    ]
    serial = []
    for each in requests:
        forget_kv(engine)
        serial.append(plain_run(engine, each))
    forget_kv(engine)
    together = [finished.candidates[0].tokens for finished in generate_together(engine, requests)]
    assert all(len(tokens) == MAX_TOKENS for tokens in together)
    assert_near_ties(serial, together, BATCH_FLIP_RATE, exact=False)
