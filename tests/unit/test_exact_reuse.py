"""Reuse only what a cold prefill would have computed the same way (deterministic mode).

llama.cpp computes a lone token per sequence along another path than a prompt chunk, so the
engine never makes a one-token prompt chunk, reuses generated tokens' KV only after it was
recomputed as a chunk (sessions, when idle), and empties a backend it takes over.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest

from reame_core.backend.base import Batch
from reame_core.backend.fake import FakeBackend
from reame_core.engine.engine import Engine
from reame_core.engine.slots import KVSlots, PrefixMatch
from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import ModelInfo
from reame_core.plugins import PluginHost
from reame_core.request import Event, FinishEvent, GenerationRequest, SamplingParams


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


def test_a_session_whose_slot_was_taken_meanwhile_reuses_its_last_prompt() -> None:
    engine = Engine(FakeBackend(n_seq_max=1), max_sessions=1)
    prompt = _prompt("Tell me something.")
    params = SamplingParams(max_tokens=12)
    first = _finish(engine, GenerationRequest(prompt, params, session_id="s"))
    _finish(engine, GenerationRequest(_prompt("Something else entirely."), params))
    follow_up = [*prompt, *first.candidates[0].tokens, *b" And more?"]
    second = _finish(engine, GenerationRequest(follow_up, params, session_id="s"))

    # Its slot ran another request in between (the engine never idle, so the answer was
    # not recomputed): the turn's prompt came back from memory, and only that.
    assert second.usage.cached_tokens == len(prompt)
    cold = Engine(FakeBackend(n_seq_max=1))
    alone = _finish(cold, GenerationRequest(follow_up, params))
    assert second.candidates[0].tokens == alone.candidates[0].tokens


def _finish(engine: Engine, request: GenerationRequest) -> FinishEvent:
    """Run one request to its end on an engine driven step by step, and stop stepping
    there: the engine is never idle between requests."""
    events: list[Event] = []
    engine.submit(request, events.append)
    while not events or not isinstance(events[-1], FinishEvent):
        engine.step()
    return events[-1]


@pytest.mark.parametrize(
    "options",
    [
        {"exact_reuse": False},  # fast mode
        # The server's pass check found a row's logits the same whatever pass computes it:
        # an answer's KV is what a chunk would compute, reused at once and without the grid.
        {"exact_reuse": True, "rows_exact": True},
    ],
)
def test_generated_tokens_are_reused_directly_where_reuse_need_not_wait_for_chunks(
    options: dict[str, bool],
) -> None:
    engine = Engine(FakeBackend(chunk_grid=16), **options).start()
    try:
        prompt = _prompt("Tell me something.")
        first = engine.generate(GenerationRequest(prompt, SamplingParams(max_tokens=12)))
        answer = first.candidates[0].tokens
        follow_up = [*prompt, *answer, *b" And more?"]
        second = engine.generate(GenerationRequest(follow_up, SamplingParams(max_tokens=4)))
        assert second.usage.cached_tokens == len(prompt) + len(answer) - 1
        assert engine.slots.grid == 1
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


# ------------------------------------------------------------------ the chunk grid
# llama.cpp's repacked kernels compute a micro-batch's rows four at a time and the leftover
# rows one by one: a prompt token's KV is the same in every run only if every chunk starts on
# the grid and only prefixes of a length on the grid are reused.

GRID = 16


class _Snapshots:
    """A prefix store that asks for a snapshot at given prompt lengths."""

    def __init__(self, *points: int) -> None:
        self.points = points
        self.stored: list[int] = []

    @hookimpl
    def reame_prefix_store_points(self, tokens: Sequence[int], model: ModelInfo) -> list[int]:
        return list(self.points)

    @hookimpl
    def reame_prefix_store(self, tokens: Sequence[int], state: bytes, model: ModelInfo) -> None:
        self.stored.append(len(tokens))


def _recording(backend: FakeBackend) -> list[tuple[int, int]]:
    """(first position, tokens) of every prompt chunk the backend computes from now on."""
    chunks: list[tuple[int, int]] = []
    decode = backend.decode

    def recorded(batch: Batch) -> Any:
        if len(batch) > 1 and len(set(batch.seq_ids)) == 1:
            chunks.append((batch.positions[0], len(batch)))
        return decode(batch)

    backend.decode = recorded  # type: ignore[method-assign]
    return chunks


def _run(engine: Engine, prompt: list[int], **params: Any) -> Any:
    return engine.generate(GenerationRequest(prompt, SamplingParams(max_tokens=4, **params)))


def test_prompt_chunks_start_on_the_grid_whatever_the_budget() -> None:
    backend = FakeBackend(chunk_grid=GRID, n_batch=64)
    chunks = _recording(backend)
    engine = Engine(backend, prefill_chunk=40, speculate="off").start()
    try:
        prompts = [[*b"x" * n, n % 251] for n in (30, 63, 100, 129, 200)]
        for prompt in prompts:
            _run(engine, prompt)
        # Beside a long generation, prompts run at most `prefill_chunk` (40) tokens a step.
        neighbour = threading.Thread(
            target=_run, args=(engine, _prompt("busy")), kwargs={"ignore_eos": True}
        )
        neighbour.start()
        _run(engine, [*b"y" * 150])
        neighbour.join()
    finally:
        engine.stop()
    assert chunks
    assert all(start % GRID == 0 for start, _ in chunks), chunks
    assert all(size <= 64 for _, size in chunks)


def test_a_shared_prefix_is_reused_up_to_the_grid_point_below_it() -> None:
    engine = Engine(FakeBackend(chunk_grid=GRID), speculate="off").start()
    try:
        first = [*b"shared system prompt, then", *b" one question" * 3]
        second = [*first[:40], *b" another question entirely"]
        _run(engine, first)
        reused = _run(engine, second).usage.cached_tokens
    finally:
        engine.stop()
    assert reused == 32  # 40 tokens shared; the grid point below is 32


def test_stored_prefixes_end_on_the_grid() -> None:
    plugins = PluginHost(discover=False)
    store = _Snapshots(37, 70)
    plugins.register(store, "snapshots")
    engine = Engine(FakeBackend(chunk_grid=GRID), plugins, speculate="off").start()
    try:
        _run(engine, [*b"z" * 90])
    finally:
        engine.stop()
    assert store.stored == [32, 64]


def test_a_session_answer_is_recomputed_from_the_grid() -> None:
    backend = FakeBackend(chunk_grid=GRID)
    engine = Engine(backend, speculate="off").start()
    try:
        prompt = [*b"p" * 37]
        params = SamplingParams(max_tokens=12)
        chunks = _recording(backend)
        first = engine.generate(GenerationRequest(prompt, params, session_id="s"))
        answer = first.candidates[0].tokens
        follow_up = [*prompt, *answer, *b" And more?"]
        second = engine.generate(GenerationRequest(follow_up, params, session_id="s"))
    finally:
        engine.stop()
    # The prompt as [0, 37); the answer recomputed from 32, the grid point below its start.
    assert chunks[:2] == [(0, 37), (32, len(prompt) + len(answer) - 1 - 32)]
    assert all(start % GRID == 0 for start, _ in chunks)
    assert second.usage.cached_tokens == (len(prompt) + len(answer) - 1) // GRID * GRID


def test_drafts_verified_after_the_prompt_are_not_counted_exact() -> None:
    backend = FakeBackend(n_seq_max=1)
    slots = KVSlots(backend)
    (slot,) = slots.slots
    prompt, verified = [1, 2, 3, 4], [5, 6, 7]
    for tokens, chunk in ((prompt, True), (verified, False)):
        batch = Batch()
        for offset, token in enumerate(tokens):
            batch.add(token, len(slot.tokens) + offset, slot.seq_id, True)
        backend.decode(batch)
        slots.appended(slot, tokens, chunk=chunk)
    assert slot.exact == len(prompt)
    assert slots.longest_prefix([*prompt, *verified, 8, 9], limit=9) == PrefixMatch(slot, 4)
