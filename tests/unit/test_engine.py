"""The engine over the fake backend: what a caller gets back, and how steps are scheduled."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import pytest

from reame_core.backend.fake import EOS, FakeBackend
from reame_core.engine.engine import Engine
from reame_core.errors import ContextOverflowError, RequestError
from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import CandidateView, ModelInfo, PrefixHit, Selection
from reame_core.plugins import PluginHost
from reame_core.request import (
    Event,
    FinishEvent,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
)

MakeEngine = Callable[..., Engine]
Reference = Callable[[FakeBackend, Sequence[int], int], list[int]]
Tokenize = Callable[[str], list[int]]
Drive = Callable[[Engine], None]


def request(prompt: Sequence[int], n: int = 1, **params: Any) -> GenerationRequest:
    return GenerationRequest(list(prompt), SamplingParams(**params), n=n)


def fake(engine: Engine) -> FakeBackend:
    assert isinstance(engine.backend, FakeBackend)
    return engine.backend


def finish_of(events: list[Event]) -> FinishEvent:
    finishes = [event for event in events if isinstance(event, FinishEvent)]
    assert len(finishes) == 1
    return finishes[0]


def finish_of_any(events: list[Event]) -> bool:
    return any(isinstance(event, FinishEvent) for event in events)


def token_events(events: list[Event]) -> list[TokenEvent]:
    return [event for event in events if isinstance(event, TokenEvent)]


# ------------------------------------------------------------------------ output


def test_greedy_output_equals_the_reference_model_loop(
    make_engine: MakeEngine, tokenize: Tokenize, greedy_reference: Reference
) -> None:
    engine = make_engine()
    prompt = tokenize("The quick brown fox")

    result = engine.generate(request(prompt, max_tokens=40))

    expected = greedy_reference(fake(engine), prompt, 40)
    assert list(result.candidates[0].tokens) == expected
    assert result.candidates[0].text == bytes(expected).decode()


def test_streamed_text_joins_to_the_final_text(make_engine: MakeEngine, tokenize: Tokenize) -> None:
    engine = make_engine()
    deltas: list[str] = []

    result = engine.generate(
        request(tokenize("Stream me"), max_tokens=30), lambda event: deltas.append(event.text)
    )

    assert "".join(deltas) == result.candidates[0].text
    assert len(deltas) > 1


def test_max_tokens_ends_with_finish_reason_length(
    make_engine: MakeEngine, tokenize: Tokenize
) -> None:
    engine = make_engine()

    result = engine.generate(request(tokenize("Count"), max_tokens=7))

    assert result.candidates[0].finish_reason == "length"
    assert len(result.candidates[0].tokens) == 7


def test_end_of_sequence_as_first_token_ends_with_stop_and_no_output(
    make_engine: MakeEngine, tokenize: Tokenize
) -> None:
    engine = make_engine()

    result = engine.generate(request(tokenize("Nothing to say"), logit_bias={EOS: 50.0}))

    assert result.candidates[0].finish_reason == "stop"
    assert (result.candidates[0].tokens, result.candidates[0].text) == ((), "")


def test_model_that_ends_greedily_finishes_with_stop(
    make_engine: MakeEngine, tokenize: Tokenize, greedy_reference: Reference
) -> None:
    engine = make_engine(eos_every=3)
    prompt = tokenize("Short answers")

    result = engine.generate(request(prompt, max_tokens=200))

    expected = greedy_reference(fake(engine), prompt, 200)
    assert len(expected) < 200
    assert list(result.candidates[0].tokens) == expected
    assert result.candidates[0].finish_reason == "stop"


def test_ignore_eos_generates_past_the_end_of_sequence(
    make_engine: MakeEngine, tokenize: Tokenize
) -> None:
    engine = make_engine(eos_every=3)

    result = engine.generate(request(tokenize("Short answers"), max_tokens=200, ignore_eos=True))

    assert result.candidates[0].finish_reason == "length"
    assert len(result.candidates[0].tokens) == 200
    assert EOS not in result.candidates[0].tokens


def test_stop_string_across_token_boundaries_is_never_emitted(
    make_engine: MakeEngine, tokenize: Tokenize, greedy_reference: Reference
) -> None:
    engine = make_engine()
    prompt = tokenize("Say something")
    full = bytes(greedy_reference(fake(engine), prompt, 40)).decode()
    stop = full[10:13]
    cut = full.index(stop)
    deltas: list[str] = []

    result = engine.generate(
        request(prompt, max_tokens=40, stop=(stop,)), lambda event: deltas.append(event.text)
    )

    assert result.candidates[0].finish_reason == "stop"
    assert result.candidates[0].text == full[:cut]
    assert "".join(deltas) == full[:cut]


# ------------------------------------------------------------------- scheduling


def test_long_prompt_is_prefilled_in_chunks_while_another_stream_decodes(
    make_engine: MakeEngine, tokenize: Tokenize
) -> None:
    engine = make_engine(start=False, n_batch=32, prefill_chunk=8)
    backend = fake(engine)
    decoding: list[Event] = []
    engine.submit(request(tokenize("Hi"), max_tokens=100), decoding.append)
    while not decoding:
        engine.step()
    long_prompt = list(b"x" * 100)  # no BOS: nothing to share with the running prompt
    prefilling: list[Event] = []
    engine.submit(request(long_prompt, max_tokens=5), prefilling.append)
    steps_before = len(backend.batch_sizes)

    tokens_per_step = []
    while not prefilling:
        before = len(token_events(decoding))
        engine.step()
        tokens_per_step.append(len(token_events(decoding)) - before)

    # 100 prompt tokens: twelve chunks of 8 and one of 4, each in its own call beside the
    # call that decodes the running stream's token.
    assert backend.batch_sizes[steps_before:] == [1, 8] * 12 + [1, 4]
    assert tokens_per_step == [1] * 13


def test_streams_around_a_slot_computing_a_prompt_decode_in_one_pass(
    make_engine: MakeEngine, tokenize: Tokenize, greedy_reference: Reference, drive: Drive
) -> None:
    engine = make_engine(start=False, n_seq_max=3, n_batch=32, prefill_chunk=8, speculate="off")
    backend = fake(engine)
    prompts = [tokenize("First stream"), tokenize("Short one"), tokenize("Third stream")]
    events: list[list[Event]] = [[] for _ in prompts]
    for prompt, sink, max_tokens in zip(prompts, events, (60, 2, 60), strict=True):
        engine.submit(request(prompt, max_tokens=max_tokens), sink.append)
    while not (finish_of_any(events[1]) and token_events(events[0]) and token_events(events[2])):
        engine.step()
    long_prompt = list(b"x" * 100)  # takes slot 1, between the two streams still decoding
    prefilling: list[Event] = []
    engine.submit(request(long_prompt, max_tokens=5), prefilling.append)
    calls_before = len(backend.batch_sizes)
    steps = 0
    while not prefilling:
        engine.step()
        steps += 1

    # Each step: the two streams' tokens and a throwaway row in slot 1 in one pass, then a
    # chunk of the prompt in a call of its own.
    calls = backend.batch_sizes[calls_before:]
    assert calls[::2] == [3] * steps
    assert sum(calls[1::2]) == len(long_prompt)
    assert set(backend.pass_counts[calls_before:]) == {1}
    assert engine.stats.filler_rows >= steps
    drive(engine)
    for i in (0, 2):
        assert list(finish_of(events[i]).candidates[0].tokens) == greedy_reference(
            backend, prompts[i], 60
        )
    for slot in engine.slots.slots:
        assert slot.tokens == backend.kv[slot.seq_id]


def test_prompt_alone_is_prefilled_in_chunks_of_prefill_chunk(
    make_engine: MakeEngine, tokenize: Tokenize
) -> None:
    engine = make_engine(start=False, n_batch=32, prefill_chunk=24)
    events: list[Event] = []
    engine.submit(request(tokenize("y" * 99), max_tokens=1), events.append)

    while not events:
        engine.step()

    assert fake(engine).batch_sizes == [24, 24, 24, 24, 4]


def test_a_request_arriving_during_a_long_prompt_waits_for_one_chunk_of_it(
    make_engine: MakeEngine, tokenize: Tokenize
) -> None:
    engine = make_engine(start=False, n_batch=64, prefill_chunk=16)
    long_events: list[Event] = []
    engine.submit(request(list(b"x" * 300), max_tokens=1), long_events.append)
    engine.step()  # the long prompt's first chunk
    short = tokenize("Hi there")
    short_events: list[Event] = []
    engine.submit(request(short, max_tokens=1), short_events.append)
    engine.step()

    # Computed in the next step, before the long prompt's next chunk, not after its 300
    # tokens (with calls of n_batch, four more of 64).
    assert short_events and not long_events
    assert fake(engine).batch_sizes[1:3] == [len(short), 16 - len(short)]


def test_a_short_prompt_is_not_held_behind_a_long_cold_one(
    make_engine: MakeEngine, tokenize: Tokenize
) -> None:
    engine = make_engine(start=False, n_batch=32, prefill_chunk=32)
    long_events: list[Event] = []
    short_events: list[Event] = []
    engine.submit(request(list(b"x" * 300), max_tokens=1), long_events.append)
    short = tokenize("Hi there")
    engine.submit(request(short, max_tokens=1), short_events.append)

    steps = 0
    while not short_events:
        engine.step()
        steps += 1

    # The long prompt needs ten full chunks; the short one is computed in the first step,
    # beside the long prompt's first chunk, which takes what is left of the step's budget.
    assert steps == 1
    assert not long_events
    assert fake(engine).batch_sizes[:2] == [len(short), 32 - len(short)]


def test_short_prompts_arriving_without_end_do_not_starve_a_long_one(
    make_engine: MakeEngine, tokenize: Tokenize
) -> None:
    engine = make_engine(start=False, n_batch=64, prefill_chunk=8, n_seq_max=4)
    streaming: list[Event] = []
    engine.submit(request(tokenize("Go"), max_tokens=1_500, ignore_eos=True), streaming.append)
    while not streaming:
        engine.step()  # from here on every step decodes: prompts get 8 tokens a step
    long_events: list[Event] = []
    engine.submit(request(list(b"y" * 64), max_tokens=1), long_events.append)

    steps = 0
    while not long_events:
        # A new short prompt every step, sharing nothing with the last one, each alone enough
        # to spend the step's budget.
        engine.submit(request([40 + steps % 80] * 12, max_tokens=1), lambda e: None)
        engine.step()
        steps += 1
        assert steps < 200, "the long prompt was starved"

    # 64 tokens at 8 a step, and it gets a chunk at least every fifth step.
    assert steps <= 8 * 5 + 5


def test_batches_never_exceed_n_batch(
    make_engine: MakeEngine, tokenize: Tokenize, drive: Drive
) -> None:
    engine = make_engine(start=False, n_batch=16, prefill_chunk=4, n_seq_max=4)
    for i in range(6):
        engine.submit(request(tokenize(f"prompt {i} " * (3 + i)), max_tokens=20), lambda e: None)

    drive(engine)

    assert max(fake(engine).batch_sizes) <= 16
    assert engine.stats.requests_finished == 6


def test_seeded_sampling_gives_the_same_tokens_alone_and_batched(
    make_engine: MakeEngine, tokenize: Tokenize, drive: Drive
) -> None:
    def seeded() -> GenerationRequest:
        return request(tokenize("Roll the dice"), max_tokens=30, temperature=0.9, seed=42)

    alone = make_engine().generate(seeded())
    engine = make_engine(start=False, n_seq_max=4)
    events: list[Event] = []
    for i in range(3):
        neighbour = request(tokenize(f"neighbour {i}"), max_tokens=40, temperature=1.2, seed=i)
        engine.submit(neighbour, lambda e: None)
    engine.submit(seeded(), events.append)

    engine.step()
    assert engine.stats.active_sequences == 4
    drive(engine)

    assert finish_of(events).candidates[0].tokens == alone.candidates[0].tokens


def test_concurrent_greedy_requests_equal_serial_runs(
    make_engine: MakeEngine, tokenize: Tokenize, greedy_reference: Reference
) -> None:
    prompts = [tokenize(f"Request number {i}: " + "abc" * i) for i in range(8)]
    serial_engine = make_engine(n_seq_max=4)
    serial = [serial_engine.generate(request(prompt, max_tokens=30)) for prompt in prompts]
    engine = make_engine(n_seq_max=4)
    results: dict[int, FinishEvent] = {}
    ready = threading.Barrier(8)

    def run(i: int) -> None:
        ready.wait()
        results[i] = engine.generate(request(prompts[i], max_tokens=30))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    for i, prompt in enumerate(prompts):
        assert results[i].candidates[0].tokens == serial[i].candidates[0].tokens
        assert list(serial[i].candidates[0].tokens) == greedy_reference(fake(engine), prompt, 30)


def test_requests_beyond_the_slots_wait_for_a_free_slot(
    make_engine: MakeEngine, tokenize: Tokenize, drive: Drive
) -> None:
    engine = make_engine(start=False, n_seq_max=2)
    events: list[list[Event]] = [[] for _ in range(3)]
    for i in range(3):
        engine.submit(request(tokenize(f"queued {i}"), max_tokens=10), events[i].append)

    engine.step()

    assert engine.stats.waiting_requests == 1
    drive(engine)
    assert all(finish_of(e).candidates[0].finish_reason == "length" for e in events)


def _admission_order(engine: Engine, drive: Drive, queued: dict[str, str | None]) -> list[str]:
    """Submit a request that takes the only slot, then `queued` (name: session id) while
    it runs; the order in which the queued ones started."""
    started: list[str] = []
    engine.submit(request([5, 6, 7], max_tokens=6), lambda event: None)
    engine.step()
    for name, session in queued.items():
        queued_request = GenerationRequest([9, 3], SamplingParams(max_tokens=3), session_id=session)

        def emit(event: Event, name: str = name) -> None:
            if name not in started:
                started.append(name)

        engine.submit(queued_request, emit)
    drive(engine)
    return started


def test_a_conversation_turn_starts_before_earlier_requests_naming_no_session(
    make_engine: MakeEngine, drive: Drive
) -> None:
    engine = make_engine(start=False, n_seq_max=1)

    order = _admission_order(engine, drive, {"batch 1": None, "batch 2": None, "turn": "chat"})

    assert order == ["turn", "batch 1", "batch 2"]


def test_without_sessions_first_requests_start_in_arrival_order(
    make_engine: MakeEngine, drive: Drive
) -> None:
    engine = make_engine(start=False, n_seq_max=1, sessions_first=False)

    order = _admission_order(engine, drive, {"batch 1": None, "batch 2": None, "turn": "chat"})

    assert order == ["batch 1", "batch 2", "turn"]


def test_a_waiting_request_is_passed_by_at_most_as_many_turns_as_there_are_slots(
    make_engine: MakeEngine, drive: Drive
) -> None:
    engine = make_engine(start=False, n_seq_max=1)

    order = _admission_order(engine, drive, {"batch": None, "a": "chat a", "b": "chat b"})

    assert order == ["a", "batch", "b"]


# ---------------------------------------------------------------- prefix reuse


def test_prompt_sharing_a_prefix_reuses_resident_kv(
    make_engine: MakeEngine, tokenize: Tokenize
) -> None:
    engine = make_engine()
    shared = "You are a helpful assistant. "
    engine.generate(request(tokenize(shared + "First question?"), max_tokens=10))
    second = tokenize(shared + "Second question?")

    warm = engine.generate(request(second, max_tokens=20))
    cold = make_engine().generate(request(second, max_tokens=20))

    assert warm.usage.cached_tokens == len(tokenize(shared))
    assert cold.usage.cached_tokens == 0
    assert warm.candidates[0].tokens == cold.candidates[0].tokens


def test_repeated_prompt_reuses_all_but_its_last_two_tokens(
    make_engine: MakeEngine, tokenize: Tokenize
) -> None:
    engine = make_engine()
    prompt = tokenize("Say it again")
    first = engine.generate(request(prompt, max_tokens=10))

    again = engine.generate(request(prompt, max_tokens=10))

    assert again.usage.cached_tokens == len(prompt) - 2
    assert again.candidates[0].tokens == first.candidates[0].tokens


def test_a_prompt_stays_resident_whole_when_another_shares_its_beginning(
    make_engine: MakeEngine, tokenize: Tokenize
) -> None:
    # The second request copies the shared instructions into a free slot instead of cutting
    # the first one's slot back to them, so the first prompt, sent again, is all reused.
    engine = make_engine(n_seq_max=2)
    shared = "Extract the fields of the document below. "
    first = tokenize(shared + "Invoice 17 from Officina Verdi.")
    engine.generate(request(first, max_tokens=10))
    second = engine.generate(request(tokenize(shared + "Ticket 4 from Mark."), max_tokens=10))

    again = engine.generate(request(first, max_tokens=10))

    assert second.usage.cached_tokens == len(tokenize(shared))
    assert again.usage.cached_tokens == len(first) - 2


def test_a_slot_holding_no_more_than_the_shared_prefix_is_taken_over(
    make_engine: MakeEngine, tokenize: Tokenize
) -> None:
    # A conversation's next turn continues in the slot of the turn before: nothing beyond
    # the shared part was reusable there, so no other slot is given up.
    engine = make_engine(n_seq_max=2)
    turn = tokenize("User: hello. Assistant:")
    first = engine.generate(request(turn, max_tokens=6))
    engine.generate(request(tokenize("Unrelated request"), max_tokens=6))
    follow_up = [*turn, *first.candidates[0].tokens, *tokenize(" User: and then?")]

    engine.generate(request(follow_up, max_tokens=6))

    holders = [slot for slot in engine.slots.slots if slot.tokens[: len(turn)] == turn]
    assert len(holders) == 1


class MemoryPrefixStore:
    """A prefix cache kept in a dict: snapshots every 8 prompt tokens, serves the longest."""

    def __init__(self) -> None:
        self.states: dict[tuple[int, ...], bytes] = {}

    @hookimpl
    def reame_prefix_store_points(self, tokens: Sequence[int], model: ModelInfo) -> Iterable[int]:
        return range(8, len(tokens), 8)

    @hookimpl
    def reame_prefix_store(self, tokens: Sequence[int], state: bytes, model: ModelInfo) -> None:
        self.states[tuple(tokens)] = state

    @hookimpl
    def reame_prefix_lookup(
        self, tokens: Sequence[int], reused: int, model: ModelInfo
    ) -> PrefixHit | None:
        stored = [k for k in self.states if len(k) > reused and tuple(tokens[: len(k)]) == k]
        if not stored:
            return None
        longest = max(stored, key=len)
        return PrefixHit(len(longest), self.states[longest], "memory")


def test_restored_prefix_generates_identical_tokens(
    make_engine: MakeEngine, tokenize: Tokenize
) -> None:
    store = MemoryPrefixStore()
    host = PluginHost(discover=False)
    host.register(store, "memory")
    prompt = tokenize("A long system prompt that many requests share")
    first = make_engine(plugins=host).generate(request(prompt, max_tokens=20))
    stored_lengths = sorted(len(tokens) for tokens in store.states)
    assert stored_lengths == list(range(8, len(prompt), 8))

    restarted = make_engine(plugins=host)
    again = restarted.generate(request(prompt, max_tokens=20))

    assert again.candidates[0].tokens == first.candidates[0].tokens
    assert again.usage.cached_tokens == again.usage.restored_tokens == stored_lengths[-1]
    assert restarted.stats.restored_tokens == stored_lengths[-1]
    assert restarted.stats.prefill_tokens == len(prompt) - stored_lengths[-1]


class SessionAwareStore:
    """Asks for a snapshot of a session's prompts only, and records what it was told."""

    def __init__(self) -> None:
        self.asked: list[str | None] = []
        self.stored: list[int] = []

    @hookimpl
    def reame_prefix_store_points(
        self, tokens: Sequence[int], model: ModelInfo, session: str | None
    ) -> Iterable[int]:
        self.asked.append(session)
        return [8] if session is not None else []

    @hookimpl
    def reame_prefix_store(self, tokens: Sequence[int], state: bytes, model: ModelInfo) -> None:
        self.stored.append(len(tokens))


def test_store_points_hear_the_requests_session(
    make_engine: MakeEngine, tokenize: Tokenize
) -> None:
    store = SessionAwareStore()
    host = PluginHost(discover=False)
    host.register(store, "sessions")
    engine = make_engine(plugins=host)
    one_shot = tokenize("A question asked once and never again, by anyone")
    engine.generate(request(one_shot, max_tokens=4))
    turn = tokenize("A conversation that will come back for another turn")
    engine.generate(GenerationRequest(turn, SamplingParams(max_tokens=4), session_id="chat-1"))
    assert store.asked == [None, "chat-1"]
    assert store.stored == [8]


def fake_state(tokens: Sequence[int]) -> bytes:
    """The serialized state of a fake sequence whose KV holds `tokens`."""
    backend = FakeBackend()
    backend.kv[0] = list(tokens)
    return backend.get_seq_state(0)


class LongerStateStore:
    """Serves the state of a longer prompt that shares only its beginning with the next one."""

    def __init__(self, state: bytes, tokens: Sequence[int]) -> None:
        self.state = state
        self.tokens = tuple(tokens)

    @hookimpl
    def reame_prefix_lookup(
        self, tokens: Sequence[int], reused: int, model: ModelInfo
    ) -> PrefixHit | None:
        shared = 0
        while shared < min(len(tokens), len(self.tokens)) and tokens[shared] == self.tokens[shared]:
            shared += 1
        return PrefixHit(shared, self.state, "longer", state_tokens=self.tokens)


def test_longer_stored_state_is_cut_back_to_the_shared_prefix(
    make_engine: MakeEngine, tokenize: Tokenize, greedy_reference: Reference
) -> None:
    stored = tokenize("Shared instructions, then question one")
    state = fake_state(stored)
    host = PluginHost(discover=False)
    host.register(LongerStateStore(state, stored), "longer")
    engine = make_engine(plugins=host)
    prompt = tokenize("Shared instructions, then question two")
    shared = len(tokenize("Shared instructions, then question "))

    result = engine.generate(request(prompt, max_tokens=12))

    assert list(result.candidates[0].tokens) == greedy_reference(fake(engine), prompt, 12)
    assert result.usage.cached_tokens == result.usage.restored_tokens == shared
    assert engine.stats.prefill_tokens == len(prompt) - shared


def test_longer_stored_state_is_not_restored_on_a_model_that_cannot_be_cut_back(
    make_engine: MakeEngine, tokenize: Tokenize, greedy_reference: Reference
) -> None:
    stored = tokenize("Shared instructions, then question one")
    state = fake_state(stored)
    host = PluginHost(discover=False)
    host.register(LongerStateStore(state, stored), "longer")
    engine = make_engine(plugins=host, prefix_trim_safe=False)
    prompt = tokenize("Shared instructions, then question two")

    result = engine.generate(request(prompt, max_tokens=12))

    assert list(result.candidates[0].tokens) == greedy_reference(fake(engine), prompt, 12)
    assert result.usage.cached_tokens == result.usage.restored_tokens == 0


class MismatchedPrefixStore:
    """Claims a shared prefix its state's tokens do not have (a plugin bug)."""

    @hookimpl
    def reame_prefix_lookup(
        self, tokens: Sequence[int], reused: int, model: ModelInfo
    ) -> PrefixHit | None:
        other = [tokens[0], *(t ^ 1 for t in tokens[1:])]
        return PrefixHit(len(tokens) - 2, fake_state(other), "mismatched", tuple(other))


def test_stored_state_whose_tokens_differ_from_the_prompt_is_refused(
    make_engine: MakeEngine, tokenize: Tokenize, greedy_reference: Reference
) -> None:
    host = PluginHost(discover=False)
    host.register(MismatchedPrefixStore(), "mismatched")
    engine = make_engine(plugins=host)
    prompt = tokenize("Nothing here was stored")

    result = engine.generate(request(prompt, max_tokens=8))

    assert list(result.candidates[0].tokens) == greedy_reference(fake(engine), prompt, 8)
    assert result.usage.cached_tokens == 0


class CorruptPrefixStore:
    """A prefix cache whose stored state the model refuses."""

    @hookimpl
    def reame_prefix_lookup(
        self, tokens: Sequence[int], reused: int, model: ModelInfo
    ) -> PrefixHit | None:
        return PrefixHit(len(tokens) - 1, b"corrupt", "corrupt-store")


def test_refused_stored_prefix_falls_back_to_prefilling_the_prompt(
    make_engine: MakeEngine, tokenize: Tokenize, greedy_reference: Reference
) -> None:
    host = PluginHost(discover=False)
    host.register(CorruptPrefixStore(), "corrupt-store")
    engine = make_engine(plugins=host)
    prompt = tokenize("Shared start, first")
    engine.generate(request(prompt, max_tokens=5))
    second = tokenize("Shared start, second")

    result = engine.generate(request(second, max_tokens=10))

    assert result.error is None
    assert list(result.candidates[0].tokens) == greedy_reference(fake(engine), second, 10)


# --------------------------------------------------------------------- logprobs


def test_logprobs_are_the_log_softmax_of_the_model_for_every_token(
    make_engine: MakeEngine, tokenize: Tokenize
) -> None:
    engine = make_engine()
    prompt = tokenize("Be sure")
    events: list[TokenEvent] = []

    result = engine.generate(request(prompt, max_tokens=12, logprobs=2), events.append)

    output = list(result.candidates[0].tokens)
    reported = [item for event in events for item in event.logprobs]
    assert [item.token for item in reported] == output
    for i, item in enumerate(reported):
        logits = fake(engine).logits_after([*prompt, *output[:i]]).astype(np.float64)
        log_softmax = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        assert item.logprob == pytest.approx(log_softmax[item.token], abs=1e-6)
        assert item.top[0][0] == item.token  # greedy: the token chosen is the likeliest


# ------------------------------------------------------------------ cancelling


SHARED = list(b"You file documents by these rules. " * 3)  # 105 tokens: 104 on a grid of 8


def follow_setup(
    make_engine: MakeEngine, **options: Any
) -> tuple[Engine, list[list[int]], list[list[Event]]]:
    """A prompt behind `SHARED` whose first chunk is computed, then two more behind it."""
    engine = make_engine(start=False, prefill_chunk=16, chunk_grid=8, **options)
    prompts = [SHARED + list(f"Document {name}: text.".encode()) for name in "ABC"]
    events: list[list[Event]] = [[], [], []]
    engine.submit(request(prompts[0], max_tokens=6), events[0].append)
    engine.step()  # its first chunk of 16
    for prompt, sink in zip(prompts[1:], events[1:], strict=True):
        engine.submit(request(prompt, max_tokens=6), sink.append)
    return engine, prompts, events


def test_requests_arriving_while_their_shared_prefix_is_computed_compute_it_once(
    make_engine: MakeEngine, greedy_reference: Reference, drive: Drive
) -> None:
    engine, prompts, events = follow_setup(make_engine)
    drive(engine)

    shared = len(SHARED + list(b"Document ")) // 8 * 8  # where the prompts part, on the grid
    finishes = [finish_of(e) for e in events]
    assert [f.usage.cached_tokens for f in finishes] == [0, shared, shared]
    # The shared beginning was computed once, not three times.
    assert engine.stats.prefill_tokens == len(prompts[0]) + 2 * (len(prompts[1]) - shared)
    for prompt, finish in zip(prompts, finishes, strict=True):
        assert list(finish.candidates[0].tokens) == greedy_reference(fake(engine), prompt, 6)


def test_candidates_of_a_request_that_waited_for_a_shared_prefix_clone_it(
    make_engine: MakeEngine, greedy_reference: Reference, drive: Drive
) -> None:
    engine = make_engine(start=False, prefill_chunk=16, chunk_grid=8, n_seq_max=4)
    first, second = SHARED + list(b"one"), SHARED + list(b"two")
    first_events: list[Event] = []
    second_events: list[Event] = []
    engine.submit(request(first, max_tokens=4), first_events.append)
    engine.step()
    engine.submit(request(second, n=2, max_tokens=4), second_events.append)
    drive(engine)

    finish = finish_of(second_events)
    assert finish.usage.cached_tokens == len(SHARED) - len(SHARED) % 8
    expected = greedy_reference(fake(engine), second, 4)
    assert [list(c.tokens) for c in finish.candidates] == [expected, expected]


def test_a_request_whose_shared_prefix_was_cancelled_computes_the_rest_itself(
    make_engine: MakeEngine, greedy_reference: Reference, drive: Drive
) -> None:
    engine = make_engine(start=False, prefill_chunk=16, chunk_grid=8)
    leader, follower = SHARED + list(b"one"), SHARED + list(b"two")
    ticket = engine.submit(request(leader, max_tokens=4), lambda event: None)
    engine.step()
    events: list[Event] = []
    engine.submit(request(follower, max_tokens=4), events.append)
    engine.step()  # the leader's second chunk
    ticket.cancel()
    drive(engine)

    finish = finish_of(events)
    assert 0 < finish.usage.cached_tokens < len(SHARED) - len(SHARED) % 8
    assert list(finish.candidates[0].tokens) == greedy_reference(fake(engine), follower, 4)


def test_a_model_that_cannot_cut_a_copied_state_back_does_not_wait_for_a_prefix(
    make_engine: MakeEngine, greedy_reference: Reference, drive: Drive
) -> None:
    engine, prompts, events = follow_setup(make_engine, prefix_trim_safe=False)
    drive(engine)

    for prompt, sink in zip(prompts, events, strict=True):
        finish = finish_of(sink)
        assert finish.usage.cached_tokens <= 16  # at most the first chunk, whole
        assert list(finish.candidates[0].tokens) == greedy_reference(fake(engine), prompt, 6)


def test_cancelled_request_finishes_cancelled_and_frees_its_slot(
    make_engine: MakeEngine, tokenize: Tokenize, greedy_reference: Reference, drive: Drive
) -> None:
    engine = make_engine(start=False, n_seq_max=1)
    long_events: list[Event] = []
    ticket = engine.submit(request(tokenize("Go on forever"), max_tokens=500), long_events.append)
    while not long_events:
        engine.step()
    queued_prompt = tokenize("My turn")
    queued_events: list[Event] = []
    engine.submit(request(queued_prompt, max_tokens=10), queued_events.append)
    engine.step()
    assert engine.stats.waiting_requests == 1

    ticket.cancel()
    drive(engine)

    cancelled = finish_of(long_events).candidates[0]
    assert cancelled.finish_reason == "cancelled"
    assert len(cancelled.tokens) < 500
    queued = finish_of(queued_events).candidates[0]
    assert list(queued.tokens) == greedy_reference(fake(engine), queued_prompt, 10)


def test_cancelled_waiting_request_finishes_without_running(
    make_engine: MakeEngine, tokenize: Tokenize, drive: Drive
) -> None:
    engine = make_engine(start=False, n_seq_max=1)
    engine.submit(request(tokenize("Running"), max_tokens=20), lambda e: None)
    waiting: list[Event] = []
    ticket = engine.submit(request(tokenize("Waiting"), max_tokens=20), waiting.append)
    engine.step()

    ticket.cancel()
    drive(engine)

    assert finish_of(waiting).candidates == ()
    assert token_events(waiting) == []


def test_stopping_the_engine_cancels_requests_in_flight(
    make_engine: MakeEngine, tokenize: Tokenize
) -> None:
    engine = make_engine(step_cost_s=0.001)
    events: list[Event] = []
    engine.submit(request(tokenize("Slow"), max_tokens=1000), events.append)
    deadline = time.monotonic() + 5
    while not events and time.monotonic() < deadline:
        time.sleep(0.001)

    engine.stop()

    assert finish_of(events).candidates[0].finish_reason == "cancelled"


# --------------------------------------------------------------- refusing requests


def test_prompt_plus_max_tokens_beyond_the_context_is_refused_at_submit(
    make_engine: MakeEngine,
) -> None:
    engine = make_engine(start=False, n_ctx_seq=64)

    with pytest.raises(ContextOverflowError) as raised:
        engine.submit(request([1] * 60, max_tokens=5), lambda e: None)

    assert raised.value.code == "context_length_exceeded"
    engine.submit(request([1] * 60, max_tokens=4), lambda e: None)


@pytest.mark.parametrize("token", [-1, 272, 10_000])
def test_token_ids_outside_the_vocabulary_are_refused(make_engine: MakeEngine, token: int) -> None:
    engine = make_engine(start=False)

    with pytest.raises(RequestError) as raised:
        engine.submit(request([1, token, 2]), lambda e: None)

    assert raised.value.param == "prompt"


@pytest.mark.parametrize("token", [-1, 272])
def test_logit_bias_for_a_token_outside_the_vocabulary_is_refused(
    make_engine: MakeEngine, token: int
) -> None:
    engine = make_engine(start=False)

    with pytest.raises(RequestError) as raised:
        engine.submit(request([1, 2, 3], logit_bias={token: 1.0}), lambda e: None)

    assert raised.value.param == "logit_bias"


def test_more_candidates_than_slots_are_refused(make_engine: MakeEngine) -> None:
    engine = make_engine(start=False, n_seq_max=2)

    with pytest.raises(RequestError) as raised:
        engine.submit(request([1, 2, 3], n=3), lambda e: None)

    assert raised.value.param == "n"


def test_empty_prompt_is_refused() -> None:
    with pytest.raises(RequestError) as raised:
        GenerationRequest([])

    assert raised.value.param == "prompt"


def test_zero_candidates_are_refused() -> None:
    with pytest.raises(RequestError) as raised:
        GenerationRequest([1, 2], n=0)

    assert raised.value.param == "n"


# ------------------------------------------------------------------ n candidates


def test_candidates_share_one_prefill(make_engine: MakeEngine, tokenize: Tokenize) -> None:
    engine = make_engine(n_seq_max=4)
    prompt = tokenize("One prompt, three answers")

    result = engine.generate(
        request(prompt, n=3, max_tokens=10, temperature=1.0, seed=5, ignore_eos=True)
    )

    assert [c.candidate for c in result.candidates] == [0, 1, 2]
    # Each candidate decodes every token it generated but its last.
    assert fake(engine).decoded_tokens == len(prompt) + 3 * (10 - 1)
    assert result.usage.completion_tokens == 30


def test_seeded_candidates_differ_from_each_other_and_repeat_across_runs(
    make_engine: MakeEngine, tokenize: Tokenize
) -> None:
    prompt = tokenize("Three ways to say it")
    params: dict[str, Any] = {"max_tokens": 20, "temperature": 1.0, "seed": 9, "ignore_eos": True}

    first = make_engine(n_seq_max=4).generate(request(prompt, n=3, **params))
    second = make_engine(n_seq_max=4).generate(request(prompt, n=3, **params))

    tokens = [c.tokens for c in first.candidates]
    assert len(set(tokens)) == 3
    assert tokens == [c.tokens for c in second.candidates]


def test_candidate_i_samples_like_a_single_request_seeded_with_seed_plus_i(
    make_engine: MakeEngine, tokenize: Tokenize
) -> None:
    engine = make_engine(n_seq_max=4)
    prompt = tokenize("Fork the sampler")
    params: dict[str, Any] = {"max_tokens": 15, "temperature": 1.0, "ignore_eos": True}

    together = engine.generate(request(prompt, n=3, seed=100, **params))
    third = engine.generate(request(prompt, seed=102, **params))

    assert together.candidates[2].tokens == third.candidates[0].tokens


class StopTheOthers:
    """Ends a request's other candidates as soon as one finishes."""

    @hookimpl
    def reame_select_candidates(
        self, request: GenerationRequest, candidates: Sequence[CandidateView], final: bool
    ) -> Selection | None:
        return None if final else Selection((0,), stop_others=True)


def test_candidates_stopped_mid_step_leave_the_next_sequences_their_own_logits(
    make_engine: MakeEngine, tokenize: Tokenize, greedy_reference: Reference
) -> None:
    host = PluginHost(discover=False)
    host.register(StopTheOthers(), "stop-the-others")
    engine = make_engine(plugins=host, n_seq_max=4, speculate="off", start=False)
    stopped = tokenize("Two answers, one ends the other")
    other = tokenize("A bystander in the same batch")
    results: dict[str, FinishEvent] = {}
    requests = [request(stopped, n=2, max_tokens=5), request(other, max_tokens=12)]
    for item in requests:
        engine.submit(item, lambda e, rid=item.request_id: results.update({rid: e}))
    while engine.step():
        pass

    # Candidate 0 finishes first in the decode batch and stops candidate 1, which comes
    # before the bystander: the bystander must still read its own row.
    bystander = results[requests[1].request_id].candidates[0].tokens
    assert list(bystander) == greedy_reference(fake(engine), other, 12)


# ------------------------------------------------------------------ async stream


def test_stream_yields_token_events_then_one_finish_event(
    make_engine: MakeEngine, tokenize: Tokenize
) -> None:
    engine = make_engine()

    async def collect() -> list[Event]:
        return [event async for event in engine.stream(request(tokenize("Async"), max_tokens=12))]

    events = asyncio.run(collect())

    assert all(isinstance(event, TokenEvent) for event in events[:-1])
    assert isinstance(events[-1], FinishEvent)
    streamed = [t for event in token_events(events) for t in event.tokens]
    assert tuple(streamed) == events[-1].candidates[0].tokens


def test_leaving_the_stream_early_cancels_the_request(
    make_engine: MakeEngine, tokenize: Tokenize
) -> None:
    engine = make_engine(step_cost_s=0.001)

    async def read_one_event() -> None:
        async for _ in engine.stream(request(tokenize("Never mind"), max_tokens=2000)):
            break
        for _ in range(2000):
            if not engine.busy:
                return
            await asyncio.sleep(0.001)

    asyncio.run(read_one_event())

    assert not engine.busy
    assert engine.slots.free_count() == engine.info.n_seq_max
    assert engine.stats.generated_tokens < 2000


# ------------------------------------------------------------------------ usage


def test_usage_counts_prompt_completion_and_cached_tokens(
    make_engine: MakeEngine, tokenize: Tokenize
) -> None:
    engine = make_engine()
    prompt = tokenize("Count my tokens, please")
    first = engine.generate(request(prompt, max_tokens=9))

    second = engine.generate(request(prompt, max_tokens=4))

    assert (first.usage.prompt_tokens, first.usage.completion_tokens) == (len(prompt), 9)
    assert first.usage.cached_tokens == 0
    assert (second.usage.prompt_tokens, second.usage.completion_tokens) == (len(prompt), 4)
    assert second.usage.cached_tokens == len(prompt) - 2
    assert second.usage.computed_prompt_tokens == 2


def test_engine_stats_count_requests_and_tokens(
    make_engine: MakeEngine, tokenize: Tokenize
) -> None:
    engine = make_engine()
    prompt = tokenize("Statistics")

    engine.generate(request(prompt, max_tokens=6))
    engine.generate(request(prompt, max_tokens=6))

    stats = engine.stats
    assert (stats.requests_submitted, stats.requests_finished) == (2, 2)
    assert stats.prompt_tokens == 2 * len(prompt)
    assert stats.reused_tokens == len(prompt) - 2
    assert stats.prefill_tokens == len(prompt) + 2
    assert stats.generated_tokens == 12
    assert stats.decode_steps == fake(engine).decode_calls
    assert stats.batch_tokens == fake(engine).decoded_tokens
