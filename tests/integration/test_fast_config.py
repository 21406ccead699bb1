"""The fast configuration (unified KV + flash attention) on SmolLM2: exact only up to near-ties.

llama.cpp does not promise that a sequence's logits here are independent of its batch
neighbours, so concurrent and serial greedy runs may part ways, but only at a near-tie of
the serial run and rarely (see near_tie.py; on the AVX-512 build measured there, batching
changed no logit at all).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from near_tie import BATCH_FLIP_RATE, TOP, assert_near_ties, plain_run

from reame_core.backend.base import Backend
from reame_core.backend.llama import LlamaBackend
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
    assert_near_ties(serial, together, BATCH_FLIP_RATE)
