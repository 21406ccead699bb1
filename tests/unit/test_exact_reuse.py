"""Reuse only what a cold prefill would have computed the same way (deterministic mode).

llama.cpp computes a lone token per sequence along another path than a prompt chunk, so the
engine never makes a one-token prompt chunk, reuses generated tokens' KV only after it was
recomputed as a chunk (sessions, when idle), and empties a backend it takes over.
"""

from __future__ import annotations

from reame_core.backend.base import Batch
from reame_core.backend.fake import FakeBackend
from reame_core.engine.engine import Engine
from reame_core.request import GenerationRequest, SamplingParams


def _prompt(text: str) -> list[int]:
    return FakeBackend().tokenize(text, add_special=True, parse_special=False)


def test_generated_tokens_are_not_reused_without_a_session() -> None:
    engine = Engine(FakeBackend()).start()
    try:
        prompt = _prompt("Tell me something.")
        first = engine.generate(GenerationRequest(prompt, SamplingParams(max_tokens=12)))
        follow_up = [*prompt, *first.candidates[0].tokens, *b" And more?"]
        second = engine.generate(GenerationRequest(follow_up, SamplingParams(max_tokens=4)))
        assert second.usage.cached_tokens == len(prompt)
    finally:
        engine.stop()


def test_idle_engine_makes_a_session_answer_reusable() -> None:
    backend = FakeBackend()
    engine = Engine(backend).start()
    try:
        prompt = _prompt("Tell me something.")
        params = SamplingParams(max_tokens=12)
        first = engine.generate(GenerationRequest(prompt, params, session_id="s"))
        answer = first.candidates[0].tokens
        follow_up = [*prompt, *answer, *b" And more?"]
        second = engine.generate(GenerationRequest(follow_up, params, session_id="s"))
        # The whole previous turn (prompt + all answer tokens in the KV) was reused.
        assert second.usage.cached_tokens == len(prompt) + len(answer) - 1
        assert max(backend.batch_sizes) > 1
    finally:
        engine.stop()


def test_fast_mode_reuses_generated_tokens_directly() -> None:
    engine = Engine(FakeBackend(), exact_reuse=False).start()
    try:
        prompt = _prompt("Tell me something.")
        first = engine.generate(GenerationRequest(prompt, SamplingParams(max_tokens=12)))
        answer = first.candidates[0].tokens
        follow_up = [*prompt, *answer, *b" And more?"]
        second = engine.generate(GenerationRequest(follow_up, SamplingParams(max_tokens=4)))
        assert second.usage.cached_tokens == len(prompt) + len(answer) - 1
    finally:
        engine.stop()


def test_prompt_is_never_cut_into_a_one_token_chunk() -> None:
    backend = FakeBackend(n_batch=16)
    engine = Engine(backend)
    # 33 tokens in chunks of 16 would leave a lone last token.
    prompt = [*b"a" * 33]
    engine.submit(GenerationRequest(prompt, SamplingParams(max_tokens=2)), lambda _: None)
    while engine.step():
        pass
    prefill_calls = [size for size in backend.batch_sizes if size > 1]
    assert sum(prefill_calls) == 33
    assert 1 not in backend.batch_sizes[: len(prefill_calls)]


def test_new_engine_empties_a_backend_left_holding_sequences() -> None:
    backend = FakeBackend()
    batch = Batch()
    for position, token in enumerate(b"left over"):
        batch.add(token, position, 0, False)
    backend.decode(batch)
    engine = Engine(backend).start()
    try:
        result = engine.generate(GenerationRequest(_prompt("Hello"), SamplingParams(max_tokens=3)))
        assert result.error is None
        assert len(result.candidates[0].tokens) == 3
    finally:
        engine.stop()
