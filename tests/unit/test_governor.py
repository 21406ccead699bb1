"""The speculation governor: which sources it asks, which drafts it verifies, and what it
learns, from a cold start; and a request may choose its own mode.

Hosts are scripted with the fake backend's costs: `step_cost_s` per pass over the weights,
`token_cost_s` per token, `multi_token_cost_s` per pass whose sequences carry several tokens.
Where a pass is expensive and tokens cheap (a CPU running a model), verifying a few drafts
costs little more than decoding one token; where every token costs as much as a pass, a
draft can never pay. Time is virtual here: a decode (and a slow source's propose call)
advances the engine's clock by exactly its scripted cost, so what the governor measures is
the host, not the load on the machine running the tests. Engines are stepped by the test
(``start=False``). The probing schedule is checked on a `Governor` driven step by step.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from draft_sources import (
    SOURCE,
    AlwaysWrong,
    KnownAnswers,
    RightFor,
    Slow,
    drafting,
    fake,
    request,
)

from reame_core.backend import fake as fake_module
from reame_core.backend.base import Batch, equal_split_passes
from reame_core.backend.fake import FakeBackend
from reame_core.engine import committer, decode_cost, runner, scheduler
from reame_core.engine import governor as governor_module
from reame_core.engine.acceptance import Calibration
from reame_core.engine.engine import Engine
from reame_core.engine.governor import PROBE_BUDGET, PROBE_EVERY, RETIME_AFTER, Governor
from reame_core.engine.propose_cost import SETTLED_CALLS
from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import DraftCost, DraftProposal, DraftRequest
from reame_core.request import Event, FinishEvent, GenerationRequest, SamplingParams

MakeEngine = Callable[..., Engine]
Reference = Callable[[FakeBackend, Sequence[int], int], list[int]]
Tokenize = Callable[[str], list[int]]
Drive = Callable[[Engine], None]
Answers = dict[tuple[int, ...], list[int]]

# A pass costs 40 tokens: verifying 8 drafts costs 1.2x a plain step.
EXPENSIVE_PASS: dict[str, float] = {"step_cost_s": 0.004, "token_cost_s": 0.0001}
# A pass costs nothing beyond its tokens: k drafts cost (1 + k)x a plain step.
TOKEN_PRICED: dict[str, float] = {"step_cost_s": 0.0, "token_cost_s": 0.003}
# The 2-core EPYC running SmolLM2: a one-token pass 7.3 ms, a pass of 2 tokens of one
# sequence 17 ms (another kernel path), 17 tokens 54.5 ms. Perfect 16-token drafts make
# decoding 2.3x faster; a guess at the prior's 50% never pays.
TWO_KERNEL_PATHS: dict[str, float] = {
    "step_cost_s": 0.0048,
    "token_cost_s": 0.0025,
    "multi_token_cost_s": 0.0072,
}
PROMPTS = ("The cat sat on", "Speculation must not", "Once upon a time", "x")
SLOW_SOURCE = "slow-drafts"


# -------------------------------------------------------------------------- helpers


def run(engine: Engine, drive: Drive, *requests: GenerationRequest) -> list[FinishEvent]:
    """Submit the requests together, step the engine until they are over, return their
    results in order."""
    results: dict[str, FinishEvent] = {}
    for item in requests:

        def keep(event: Event, request_id: str = item.request_id) -> None:
            if isinstance(event, FinishEvent):
                results[request_id] = event

        engine.submit(item, keep)
    drive(engine)
    return [results[item.request_id] for item in requests]


class VirtualClock:
    """The fake backend and slow sources sleep on it; the engine times with it."""

    def __init__(self) -> None:
        self.now = 0.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> VirtualClock:
    clock = VirtualClock()
    monkeypatch.setattr(fake_module, "time", clock)
    for module in (scheduler, runner, committer):  # the engine's parts that keep time
        monkeypatch.setattr(module, "time", clock)
    return clock


@pytest.fixture
def answers(tokenize: Tokenize, greedy_reference: Reference) -> Answers:
    model = FakeBackend()
    return {tuple(tokenize(p)): greedy_reference(model, tokenize(p), 160) for p in PROMPTS}


def timed(
    clock: VirtualClock, engine: Engine, drive: Drive, *requests: GenerationRequest
) -> tuple[float, list[FinishEvent]]:
    """Run the requests one after another; the virtual seconds it took, and the results."""
    started = clock.now
    results = [run(engine, drive, item)[0] for item in requests]
    return clock.now - started, results


def copying(tokenize: Tokenize, prompt: str = PROMPTS[0]) -> GenerationRequest:
    return request(tokenize(prompt), max_tokens=120, ignore_eos=True)


def report(engine: Engine, source: str = SOURCE) -> dict[str, Any]:
    rows = {row["source"]: row for row in engine.governor.report()["sources"]}
    return dict(rows[source])


# ------------------------------------------------------------ from a cold start


def test_a_copying_request_drafts_from_a_cold_start_where_a_guess_would_not_pay(
    make_engine: MakeEngine,
    tokenize: Tokenize,
    drive: Drive,
    answers: Answers,
    clock: VirtualClock,
) -> None:
    # The answer starts with a preamble the source gets wrong, then copies. A few missed
    # drafts must not keep the source from the copy; a guess at the prior's 50% does not
    # pay on this host, but the request's drafts, scored as it goes, soon show it copies.
    def seconds(mode: str) -> float:
        source = KnownAnswers(answers, wrong_before=10)
        engine = make_engine(
            speculate=mode, plugins=drafting(source), start=False, draft_max=16,
            **TWO_KERNEL_PATHS,
        )  # fmt: skip
        return timed(clock, engine, drive, copying(tokenize))[0]

    # Drafting all of the copy would make it 1.9x faster than plain decoding.
    assert seconds("auto") <= seconds("off") / 1.5


def test_auto_keeps_a_perfect_source_on_where_a_pass_is_expensive(
    make_engine: MakeEngine, tokenize: Tokenize, drive: Drive, answers: Answers
) -> None:
    engine = make_engine(plugins=drafting(KnownAnswers(answers)), start=False, **EXPENSIVE_PASS)

    [result] = run(engine, drive, request(tokenize(PROMPTS[0]), max_tokens=40))

    row = report(engine)
    assert row["enabled"]
    assert row["expected_gain"] > 1
    assert result.usage.draft_proposed[SOURCE] > 0
    assert result.usage.draft_accepted[SOURCE] == result.usage.draft_proposed[SOURCE]


def test_auto_costs_almost_nothing_where_drafts_miss(
    make_engine: MakeEngine, tokenize: Tokenize, drive: Drive, clock: VirtualClock
) -> None:
    requests = [request(tokenize(p), max_tokens=120, ignore_eos=True) for p in PROMPTS]

    def seconds(mode: str) -> float:
        engine = make_engine(
            speculate=mode, plugins=drafting(AlwaysWrong()), start=False, **TWO_KERNEL_PATHS
        )
        return timed(clock, engine, drive, *requests)[0]

    assert seconds("auto") <= 1.03 * seconds("off")


def test_auto_stops_verifying_a_useless_source_saying_why(
    make_engine: MakeEngine, tokenize: Tokenize, drive: Drive
) -> None:
    engine = make_engine(plugins=drafting(AlwaysWrong()), start=False, **TWO_KERNEL_PATHS)

    results = [
        run(engine, drive, request(tokenize(p), max_tokens=40, ignore_eos=True))[0] for p in PROMPTS
    ]

    row = report(engine)
    assert not row["enabled"]
    assert row["state"] == "watched"  # asking it costs nothing: it stays asked, unverified
    assert "< 1" in row["reason"]
    assert sum(r.usage.draft_proposed.get(SOURCE, 0) for r in results[1:]) == 0


def test_auto_does_not_speculate_where_each_token_costs_as_much_as_a_pass(
    make_engine: MakeEngine, tokenize: Tokenize, drive: Drive, answers: Answers
) -> None:
    mostly_right = KnownAnswers(answers, wrong_every=4)
    engine = make_engine(plugins=drafting(mostly_right), start=False, **TOKEN_PRICED)

    run(engine, drive, request(tokenize(PROMPTS[0]), max_tokens=24))

    # A draft of k tokens costs k more steps' worth, and the cost curve says so.
    assert engine.governor.sources[SOURCE].drafts == 0


class Silent:
    """A source with nothing to offer (the draft-model hook with no draft model loaded)."""

    def __init__(self) -> None:
        self.calls = 0

    @hookimpl
    def reame_propose_drafts(self, requests: Sequence[DraftRequest]) -> list[DraftProposal]:
        self.calls += 1
        return []


def test_a_source_that_offers_nothing_is_seldom_asked(
    make_engine: MakeEngine, tokenize: Tokenize, drive: Drive
) -> None:
    silent = Silent()
    engine = make_engine(plugins=drafting(silent), start=False, **TWO_KERNEL_PATHS)

    run(engine, drive, request(tokenize(PROMPTS[0]), max_tokens=600, ignore_eos=True))

    assert silent.calls < engine.stats.decode_steps / 4


def test_a_source_silent_for_one_request_is_asked_at_once_for_the_next(
    make_engine: MakeEngine, tokenize: Tokenize, drive: Drive, answers: Answers
) -> None:
    copy_prompt = tuple(tokenize(PROMPTS[0]))
    only_the_copy = KnownAnswers({copy_prompt: answers[copy_prompt]})  # silent for the rest
    engine = make_engine(plugins=drafting(only_the_copy), start=False, **TWO_KERNEL_PATHS)
    run(engine, drive, request(tokenize(PROMPTS[1]), max_tokens=600, ignore_eos=True))

    [copied] = run(engine, drive, copying(tokenize))

    assert copied.usage.draft_accepted[SOURCE] > 100  # of its 120 tokens


def test_a_declined_draft_teaches_acceptance_from_the_tokens_committed_after_it(
    make_engine: MakeEngine, tokenize: Tokenize, drive: Drive, answers: Answers
) -> None:
    # Every fourth token wrong: drafts are rarely worth verifying on this host, yet the
    # governor learns how they fare by comparing them with what the model then says. A
    # draft starting anywhere has its first token right 3 times in 4, its second (given
    # the first) 2 in 3, its third 1 in 2, its fourth never.
    engine = make_engine(
        plugins=drafting(KnownAnswers(answers, wrong_every=4)), start=False, **TWO_KERNEL_PATHS
    )

    run(engine, drive, request(tokenize(PROMPTS[0]), max_tokens=120, ignore_eos=True))

    state = engine.governor.sources[SOURCE]
    assert state.shadowed > 50 > state.drafts
    assert state.acceptance.rates(4) == pytest.approx([3 / 4, 2 / 3, 1 / 2, 0], abs=0.1)


# ------------------------------------------------------------------ per request


def test_a_new_request_that_copies_gets_its_own_drafts_where_others_did_not(
    make_engine: MakeEngine,
    tokenize: Tokenize,
    drive: Drive,
    answers: Answers,
    clock: VirtualClock,
) -> None:
    # The source is useless for the first requests and right for the last one.
    copy_prompt = tuple(tokenize(PROMPTS[0]))
    only_the_copy = {copy_prompt: answers[copy_prompt]}
    others = [request(tokenize(p), max_tokens=120, ignore_eos=True) for p in PROMPTS[1:]]

    def copy_seconds(mode: str) -> float:
        engine = make_engine(
            speculate=mode, plugins=drafting(RightFor(only_the_copy)), start=False,
            draft_max=16, **TWO_KERNEL_PATHS,
        )  # fmt: skip
        timed(clock, engine, drive, *others)
        return timed(clock, engine, drive, copying(tokenize))[0]

    assert copy_seconds("auto") <= copy_seconds("on") / 0.9


# ------------------------------------------------------------- sources compete


def test_a_slow_source_loses_to_a_fast_one_that_yields_more_per_second(
    make_engine: MakeEngine,
    tokenize: Tokenize,
    drive: Drive,
    answers: Answers,
    clock: VirtualClock,
) -> None:
    # The slow source is always right but takes a plain step's time per drafted token; the
    # fast one gets every fourth token wrong. Per step the slow one's drafts bring more;
    # per second, counting its propose time, the fast one's do.
    slow = Slow(KnownAnswers(answers), EXPENSIVE_PASS["step_cost_s"], clock.sleep)
    fast = KnownAnswers(answers, wrong_every=4)
    engine = make_engine(
        plugins=drafting(fast, slow, names=(SOURCE, SLOW_SOURCE)), start=False, **EXPENSIVE_PASS
    )
    requests = [request(tokenize(p), max_tokens=80, ignore_eos=True) for p in PROMPTS]

    _, results = timed(clock, engine, drive, *requests)

    assert all(r.usage.draft_accepted.get(SOURCE, 0) > 20 for r in results)
    # It is timed at the start (its first call warms up, then its price settles) and its
    # drafts in hand may be verified then; never asked again.
    assert slow.calls <= 1 + SETTLED_CALLS


def test_a_source_slower_to_propose_than_its_drafts_save_is_left_alone(
    make_engine: MakeEngine,
    tokenize: Tokenize,
    drive: Drive,
    answers: Answers,
    clock: VirtualClock,
) -> None:
    # Always right, but proposing 16 tokens takes longer than decoding them.
    requests = [request(tokenize(p), max_tokens=80, ignore_eos=True) for p in PROMPTS]

    def seconds(mode: str) -> float:
        slow = Slow(KnownAnswers(answers), 1.2 * EXPENSIVE_PASS["step_cost_s"], clock.sleep)
        engine = make_engine(speculate=mode, plugins=drafting(slow), start=False, **EXPENSIVE_PASS)
        return timed(clock, engine, drive, *requests)[0]

    assert seconds("auto") <= 1.05 * seconds("off")


def test_a_slow_source_that_yields_more_per_second_wins(
    make_engine: MakeEngine,
    tokenize: Tokenize,
    drive: Drive,
    answers: Answers,
    clock: VirtualClock,
) -> None:
    # The fast source gets every other token wrong; the slow one is right, at a tenth of
    # a plain step per drafted token.
    slow = Slow(KnownAnswers(answers), EXPENSIVE_PASS["step_cost_s"] / 10, clock.sleep)
    engine = make_engine(
        plugins=drafting(KnownAnswers(answers, wrong_every=2), slow, names=(SOURCE, SLOW_SOURCE)),
        start=False, **EXPENSIVE_PASS,
    )  # fmt: skip
    requests = [request(tokenize(p), max_tokens=80, ignore_eos=True) for p in PROMPTS]

    _, results = timed(clock, engine, drive, *requests)

    slow_tokens = sum(r.usage.draft_accepted.get(SLOW_SOURCE, 0) for r in results)
    fast_tokens = sum(r.usage.draft_accepted.get(SOURCE, 0) for r in results)
    assert slow_tokens > 4 * fast_tokens


def test_probing_a_slow_useless_source_costs_at_most_the_probe_budget(
    make_engine: MakeEngine, tokenize: Tokenize, drive: Drive, clock: VirtualClock
) -> None:
    # Each call takes 4 plain steps' time (it would pay if its drafts came true); its drafts
    # never hit.
    per_token = TWO_KERNEL_PATHS["step_cost_s"] / 4
    slow = Slow(AlwaysWrong(), per_token, clock.sleep)
    engine = make_engine(plugins=drafting(slow), start=False, draft_max=16, **TWO_KERNEL_PATHS)
    requests = [request(tokenize(p), max_tokens=400, ignore_eos=True) for p in PROMPTS * 2]

    timed(clock, engine, drive, *requests)

    row = report(engine)
    first_look = per_token * 5  # a call of 4 tokens, before its cost is known
    assert row["state"] == "probed"
    assert row["probes"] >= 2
    assert row["probe_ms"] / 1000 <= PROBE_BUDGET * engine.stats.decode_seconds + first_look


class Mirroring:
    """A draft model's shape: before drafting for a sequence it reads what the sequence
    committed since it last looked (the whole prompt the first time) at `read_s` a token,
    then drafts `inner`'s drafts at `draft_s` a token. Like the draft model, it gives that
    cost before its first call; it counts its calls and the tokens it read."""

    def __init__(
        self, inner: Any, draft_s: float, read_s: float, sleep: Callable[[float], None]
    ) -> None:
        self.inner, self.draft_s, self.read_s, self.sleep = inner, draft_s, read_s, sleep
        self.seen: dict[int, int] = {}
        self.calls = 0
        self.read = 0
        self.first_asked_at: int | None = None  # output length of the first sequence asked

    @hookimpl
    def reame_draft_cost(self) -> DraftCost:
        return DraftCost(self.read_s + 4 * self.draft_s, drafted=4, caught_up=1)

    @hookimpl
    def reame_propose_drafts(self, requests: Sequence[DraftRequest]) -> list[DraftProposal]:
        self.calls += 1
        seconds = 0.0
        for r in requests:
            if self.first_asked_at is None:
                self.first_asked_at = len(r.seq.output_tokens)
            length = len(r.seq.prompt_tokens) + len(r.seq.output_tokens)
            new = length - self.seen.get(r.seq.key, 0)
            self.seen[r.seq.key] = length
            self.read += new
            seconds += self.read_s * new
        proposals: list[DraftProposal] = self.inner.reame_propose_drafts(requests)
        longest = max((len(p.tokens) for p in proposals), default=0)
        self.sleep(seconds + self.draft_s * longest)
        return proposals


def test_a_draft_model_too_dear_to_pay_never_reads_a_prompt(
    make_engine: MakeEngine, tokenize: Tokenize, drive: Drive, answers: Answers, clock: VirtualClock
) -> None:
    # Always right, but drafting a token takes 0.8 of a plain step and verifying 4 drafts
    # costs 3.4 plain steps: even all of its drafts right would not pay. Calling it once to
    # find that out would cost a prompt's reading.
    plain_step = pass_seconds(1)
    source = Mirroring(KnownAnswers(answers), 0.8 * plain_step, 0.3 * plain_step, clock.sleep)
    engine = make_engine(plugins=drafting(source), start=False, draft_max=16, **TWO_KERNEL_PATHS)
    requests = [request(tokenize(p), max_tokens=120, ignore_eos=True) for p in PROMPTS]

    timed(clock, engine, drive, *requests)

    assert source.calls == source.read == 0
    assert report(engine)["state"] == "too dear"


def test_a_cheap_accurate_draft_model_drafts_from_the_first_steps(
    make_engine: MakeEngine, tokenize: Tokenize, drive: Drive, answers: Answers, clock: VirtualClock
) -> None:
    # Always right, a tenth of a plain step a drafted token, where verifying 8 drafts
    # costs 1.2 plain steps.
    step_s = EXPENSIVE_PASS["step_cost_s"]
    source = Mirroring(KnownAnswers(answers), step_s / 10, step_s / 100, clock.sleep)
    engine = make_engine(plugins=drafting(source), start=False, **EXPENSIVE_PASS)

    [result] = run(engine, drive, request(tokenize(PROMPTS[0]), max_tokens=60, ignore_eos=True))

    assert source.first_asked_at is not None and source.first_asked_at <= 2
    assert result.usage.draft_accepted[SOURCE] >= 0.75 * result.usage.completion_tokens


def slow_verifications(
    monkeypatch: pytest.MonkeyPatch, clock: VirtualClock, count: int, sized: Callable[[int], bool]
) -> list[int]:
    """The first `count` decodes after the prompt whose batch holds a number of tokens that
    `sized` accepts take 30 plain steps more each; the list holds one entry per decode not
    slowed yet."""
    decode = FakeBackend.decode
    left = [0] * count

    def decode_slowed(backend: FakeBackend, batch: Batch) -> np.ndarray:
        if left and sized(len(batch)) and min(batch.positions) > 0:  # not a prompt
            left.pop()
            clock.sleep(30 * EXPENSIVE_PASS["step_cost_s"])
        return decode(backend, batch)

    monkeypatch.setattr(FakeBackend, "decode", decode_slowed)
    return left


def test_a_preempted_first_verification_does_not_switch_speculation_off(
    make_engine: MakeEngine,
    tokenize: Tokenize,
    drive: Drive,
    answers: Answers,
    clock: VirtualClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The first pass verifying a draft takes 30 plain steps (a neighbour's burst on the
    # core). Priced by it, a draft of that length and every length near it would never
    # be verified again to show the true cost.
    left = slow_verifications(monkeypatch, clock, 1, lambda tokens: tokens > 1)
    engine = make_engine(plugins=drafting(KnownAnswers(answers)), start=False, **EXPENSIVE_PASS)
    prompts = [request(tokenize(p), max_tokens=60, ignore_eos=True) for p in PROMPTS[:2]]

    _, results = timed(clock, engine, drive, *prompts)

    assert not left
    drafted = [r.usage.draft_accepted.get(SOURCE, 0) for r in results]
    assert all(n >= 0.75 * r.usage.completion_tokens for n, r in zip(drafted, results, strict=True))


def test_a_draft_length_priced_out_by_its_first_passes_is_verified_again_later(
    make_engine: MakeEngine,
    tokenize: Tokenize,
    drive: Drive,
    answers: Answers,
    clock: VirtualClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Drafts of one token, always right, but the first three passes verifying one took 30
    # plain steps each (a process's first passes of a size, or a neighbour's burst): the
    # size settles that dear and nothing verifies it again, unless a price that old is
    # forgotten (after 40 timings here) and timed anew.
    monkeypatch.setattr(decode_cost, "STALE_AFTER", 40)
    monkeypatch.setattr(decode_cost, "STALE_CHECK", 8)
    left = slow_verifications(monkeypatch, clock, 3, lambda tokens: tokens == 2)
    engine = make_engine(
        plugins=drafting(KnownAnswers(answers)), start=False, draft_max=1, **EXPENSIVE_PASS
    )

    answer = request(tokenize(PROMPTS[0]), max_tokens=150, ignore_eos=True)

    _, (result,) = timed(clock, engine, drive, answer)

    assert not left
    assert result.usage.draft_accepted.get(SOURCE, 0) >= 0.25 * result.usage.completion_tokens


class BusyAtStart(Mirroring):
    """A draft model timed beside a busy neighbour at start: its first figure is fifty times
    what its calls cost; it counts the times it is asked."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.priced = 0

    @hookimpl
    def reame_draft_cost(self) -> DraftCost:
        self.priced += 1
        cost = super().reame_draft_cost()
        return cost if self.priced > 1 else dataclasses.replace(cost, seconds=50 * cost.seconds)


def test_a_draft_model_priced_out_at_start_is_timed_again_and_drafts(
    make_engine: MakeEngine,
    tokenize: Tokenize,
    drive: Drive,
    answers: Answers,
    clock: VirtualClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Cheap and always right, but priced out by its first figure; asked again after
    # RETIME_AFTER steps (40 here), it drafts the rest of the answer.
    monkeypatch.setattr(governor_module, "RETIME_AFTER", 40)
    step_s = EXPENSIVE_PASS["step_cost_s"]
    source = BusyAtStart(KnownAnswers(answers), step_s / 10, step_s / 100, clock.sleep)
    engine = make_engine(plugins=drafting(source), start=False, **EXPENSIVE_PASS)

    [result] = run(engine, drive, request(tokenize(PROMPTS[0]), max_tokens=200, ignore_eos=True))

    assert source.priced == 2
    assert source.first_asked_at is not None and source.first_asked_at >= 40
    assert result.usage.draft_accepted[SOURCE] >= 0.5 * result.usage.completion_tokens


class TimedAtStart:
    """Says what a call costs, noting the thread that asked; offers no drafts."""

    def __init__(self) -> None:
        self.asked_on: list[str] = []

    @hookimpl
    def reame_draft_cost(self) -> DraftCost:
        self.asked_on.append(threading.current_thread().name)
        return DraftCost(0.001, drafted=4)

    @hookimpl
    def reame_propose_drafts(self, requests: Sequence[DraftRequest]) -> list[DraftProposal]:
        return []


def test_a_source_gives_its_cost_once_on_the_engine_thread(
    make_engine: MakeEngine, tokenize: Tokenize
) -> None:
    # A draft model times its decodes there: a second thread decoding would leave idle
    # OpenMP workers spinning beside the engine's.
    source = TimedAtStart()
    engine = make_engine(plugins=drafting(source))

    for prompt in PROMPTS[:2]:
        engine.generate(request(tokenize(prompt), max_tokens=8))

    assert source.asked_on == ["reame-engine"]


# ---------------------------------------------------------------------------- modes


def test_mode_off_never_asks_the_sources(
    make_engine: MakeEngine, tokenize: Tokenize, drive: Drive
) -> None:
    source = AlwaysWrong()
    engine = make_engine(speculate="off", plugins=drafting(source), start=False)

    [result] = run(engine, drive, request(tokenize(PROMPTS[0]), max_tokens=20))

    assert source.calls == 0
    assert result.usage.draft_proposed == {}


def test_request_speculate_off_turns_drafting_off_under_server_on(
    make_engine: MakeEngine, tokenize: Tokenize, drive: Drive
) -> None:
    source = AlwaysWrong()
    engine = make_engine(speculate="on", plugins=drafting(source), start=False)
    prompt = tokenize(PROMPTS[0])

    [off] = run(engine, drive, request(prompt, max_tokens=20, speculate="off"))
    calls_while_off = source.calls
    [default] = run(engine, drive, request(prompt, max_tokens=20))

    assert calls_while_off == 0
    assert off.usage.draft_proposed == {}
    assert default.usage.draft_proposed[SOURCE] > 0


def test_request_speculate_on_verifies_every_draft_under_server_auto(
    make_engine: MakeEngine, tokenize: Tokenize, drive: Drive
) -> None:
    prompt = tokenize(PROMPTS[0])
    server_on = make_engine(speculate="on", plugins=drafting(AlwaysWrong()), start=False)
    # A host where auto, left to itself, would verify no drafts at all.
    server_auto = make_engine(
        speculate="auto", plugins=drafting(AlwaysWrong()), start=False, **TOKEN_PRICED
    )

    [expected] = run(server_on, drive, request(prompt, max_tokens=16))
    [forced] = run(server_auto, drive, request(prompt, max_tokens=16, speculate="on"))

    assert forced.usage.draft_proposed == expected.usage.draft_proposed
    assert forced.usage.draft_proposed[SOURCE] > 0


# ------------------------------------------------------------------------ exactness


def test_several_sequences_speculating_in_one_batch_equal_their_greedy_references(
    make_engine: MakeEngine,
    tokenize: Tokenize,
    drive: Drive,
    greedy_reference: Reference,
    answers: dict[tuple[int, ...], list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = make_engine(
        speculate="on",
        plugins=drafting(KnownAnswers(answers, wrong_every=5)),
        start=False,
        n_seq_max=4,
    )
    drafters_per_batch: list[int] = []
    decode = fake(engine).decode

    def counting_decode(batch: Batch) -> np.ndarray:
        drafters_per_batch.append(sum(batch.seq_ids.count(s) > 1 for s in set(batch.seq_ids)))
        return decode(batch)

    monkeypatch.setattr(fake(engine), "decode", counting_decode)
    prompts = [tokenize(p) for p in PROMPTS]

    results = run(engine, drive, *(request(p, max_tokens=40) for p in prompts))

    for prompt, result in zip(prompts, results, strict=True):
        assert list(result.candidates[0].tokens) == greedy_reference(fake(engine), prompt, 40)
    # Prompt chunks have calls of their own; decode batches held drafts of all four.
    assert max(drafters_per_batch) == len(PROMPTS)


@pytest.mark.parametrize("wrong_every", [0, 3], ids=["perfect-drafts", "mostly-right-drafts"])
def test_seeded_sampling_with_deterministic_drafts_equals_sampling_without(
    make_engine: MakeEngine, tokenize: Tokenize, drive: Drive, wrong_every: int
) -> None:
    prompt = tokenize("Once upon")
    params: dict[str, Any] = {"max_tokens": 40, "temperature": 1.0, "seed": 8, "ignore_eos": True}
    [plain] = run(make_engine(speculate="off", start=False), drive, request(prompt, **params))
    sampled = {tuple(prompt): list(plain.candidates[0].tokens)}
    engine = make_engine(
        speculate="on", plugins=drafting(KnownAnswers(sampled, wrong_every)), start=False
    )

    [drafted] = run(engine, drive, request(prompt, **params))

    assert drafted.candidates[0].tokens == plain.candidates[0].tokens
    assert drafted.usage.draft_accepted[SOURCE] > 0


# --------------------------------------------------------- the probing schedule

RIGHT, WRONG = 5, 0
COPY_STEPS = 20  # steps of copying after which a request's drafts must be verified again


@dataclass
class Decoding:
    """A decoding sequence as the governor reads it; its text is RIGHT, RIGHT, ..."""

    seq_id: int = 0
    prompt_tokens: list[int] = field(default_factory=lambda: [1] * 20)
    key: int = field(default_factory=itertools.count().__next__)
    output: list[int] = field(default_factory=list)
    params: SamplingParams = field(default_factory=lambda: SamplingParams(max_tokens=100_000))

    @property
    def n_kv(self) -> int:
        return len(self.prompt_tokens) + len(self.output)

    @property
    def output_tokens(self) -> list[int]:
        return self.output


def pass_seconds(tokens: int, per_seq: int | None = None) -> float:
    """A pass on the TWO_KERNEL_PATHS host."""
    host = TWO_KERNEL_PATHS
    several = (per_seq if per_seq is not None else tokens) > 1
    return (
        host["step_cost_s"]
        + host["token_cost_s"] * tokens
        + (host["multi_token_cost_s"] if several else 0.0)
    )


# A propose call taking 3% of a plain step: too dear to ask every step for nothing
# (that may cost 1%), so the source is probed, from the budget: every third step at most.
PROPOSE_SECONDS = 0.03 * pass_seconds(1)


def scripted_governor() -> Governor:
    """A governor that has timed the TWO_KERNEL_PATHS host, where a guess at 50% never pays."""
    governor = Governor([SOURCE], lambda layout: equal_split_passes(layout, 512), draft_max=8)
    for n in (1, 2, 3, 5, 9, 17, 64):
        governor.observe_decode([(0, n)], pass_seconds(n))
    return governor


def step(
    governor: Governor, seqs: list[Decoding], right: int = 0, seconds: float = PROPOSE_SECONDS
) -> list[DraftRequest]:
    """One engine step as the governor sees it: ask, propose (taking `seconds`) drafts whose
    first `right` tokens are right, verify what it chooses, commit, time the decode. Returns
    what the source was asked."""
    requests = governor.requests(seqs, 100_000, 512)
    asked = governor.ask(SOURCE, requests, [])
    proposals = [
        DraftProposal(
            r.seq, SOURCE, tuple(RIGHT if i < right else WRONG for i in range(r.max_tokens))
        )
        for r in asked
    ]
    if asked:
        governor.proposed(SOURCE, seconds, asked, proposals)
    chosen = governor.choose(seqs, requests, proposals)
    layout = []
    for seq in seqs:
        draft = chosen.get(seq.key)
        accepted = 0
        if draft is not None:
            accepted = min(right, len(draft.tokens))
            governor.record(seq, draft, accepted)
        seq.output += [RIGHT] * (accepted + 1)
        layout.append((seq.seq_id, 1 + (len(draft.tokens) if draft else 0)))
    seconds = sum(pass_seconds(n) for n in equal_split_passes(layout, 512))
    governor.observe_decode(layout, seconds)
    return asked


def steps_until_asked(governor: Governor, seq: Decoding, right: int = 0) -> int:
    for count in range(1, 100 * PROBE_EVERY):
        if step(governor, [seq], right):
            return count
    raise AssertionError("the source was never asked again")


def shown_useless(governor: Governor, seq: Decoding) -> None:
    """Probe with wrong drafts until the request's own evidence shows the source does not
    pay there, then wait for the budget to be repaid."""
    for _ in range(400):
        step(governor, [seq])
        if governor._seqs[seq.key].sources[SOURCE].backoff:
            break
    else:
        raise AssertionError("the source was never shown useless")


def test_a_source_that_costs_nothing_to_ask_is_asked_every_step() -> None:
    governor = Governor([SOURCE], lambda layout: equal_split_passes(layout, 512), draft_max=8)
    for n in (1, 2, 3, 5, 9, 17, 64):
        governor.observe_decode([(0, n)], pass_seconds(n))
    seq = Decoding()
    full_asks = 0

    for _ in range(50):  # after a first, short look that measures what a call costs
        requests = governor.requests([seq], 100_000, 512)
        asked = governor.ask(SOURCE, requests, [])
        full_asks += asked == requests
        wrong = [DraftProposal(seq, SOURCE, (WRONG,) * r.max_tokens) for r in asked]
        governor.proposed(SOURCE, 0.0, asked, wrong)
        governor.choose([seq], requests, wrong)
        seq.output.append(RIGHT)

    assert full_asks == 49
    assert governor.sources[SOURCE].shadowed >= 40  # each step's draft, scored


def test_a_thin_probe_is_retried_as_soon_as_the_budget_allows() -> None:
    governor, seq = scripted_governor(), Decoding()
    first = steps_until_asked(governor, seq)

    asked = [bool(step(governor, [seq], right=0)) for _ in range(9)]

    # A new request probes at once (the source's cost is not known yet), then as often as
    # the budget allows (every third step) while a few missed drafts prove little.
    assert first <= PROBE_EVERY + 1
    assert sum(asked) >= 3


def test_strong_evidence_that_a_source_does_not_pay_makes_the_wait_longer_each_time() -> None:
    governor, seq = scripted_governor(), Decoding()
    shown_useless(governor, seq)

    first = steps_until_asked(governor, seq)
    second = steps_until_asked(governor, seq)

    assert first == PROBE_EVERY
    assert second == 2 * PROBE_EVERY


def test_a_new_request_gets_its_own_probe_while_another_waits() -> None:
    governor, waiting, new = scripted_governor(), Decoding(seq_id=0), Decoding(seq_id=1)
    shown_useless(governor, waiting)
    steps_until_asked(governor, waiting)
    steps_until_asked(governor, waiting)  # now it waits 4 * PROBE_EVERY steps

    asked = [r.seq for _ in range(PROBE_EVERY + 2) for r in step(governor, [waiting, new])]

    assert asked and all(seq is new for seq in asked)


def test_a_dear_source_is_not_probed_where_cheaper_drafts_beat_its_best_case() -> None:
    # The cheaper source's drafts for this request come true; the dear one, even if all
    # of its drafts did, would yield less per second: it takes 10 ms to propose.
    governor = Governor(
        ["cheap", SOURCE], lambda layout: equal_split_passes(layout, 512), draft_max=8
    )
    for n in (1, 2, 3, 5, 9, 17, 64):
        governor.observe_decode([(0, n)], pass_seconds(n))
    governor.learn_costs({SOURCE: DraftCost(0.010, drafted=8, caught_up=1)})
    for _ in range(30):
        governor.sources["cheap"].acceptance.add(8, 8)
    seq = Decoding()

    for _ in range(3 * PROBE_EVERY):
        requests = governor.requests([seq], 100_000, 512)
        assert not governor.ask(SOURCE, requests, [DraftProposal(seq, "cheap", (RIGHT,) * 8)])
        seq.output.append(RIGHT)


def test_a_probe_that_comes_true_ends_the_wait() -> None:
    governor, seq = scripted_governor(), Decoding()
    shown_useless(governor, seq)
    steps_until_asked(governor, seq, right=8)  # the next probe's drafts are right

    asked = [bool(step(governor, [seq], right=8)) for _ in range(6)]

    assert sum(asked) >= 2  # as often as the budget allows again


def test_a_request_whose_text_turns_to_copying_is_drafted_again() -> None:
    governor, seq = scripted_governor(), Decoding()
    shown_useless(governor, seq)
    steps_until_asked(governor, seq, right=8)
    for _ in range(COPY_STEPS):
        step(governor, [seq], right=8)

    before = len(seq.output)
    for _ in range(10):
        step(governor, [seq], right=8)

    assert len(seq.output) - before > 30  # several tokens a step: its drafts are verified


def test_a_source_far_behind_a_request_is_priced_with_its_catch_up() -> None:
    # An always-right source taking 4 ms a drafted token, and a caught-up token a quarter
    # of that (a prompt token's share of a decode step here): worth asking where it has
    # kept up, not where it would first read a prompt of 3000 tokens.
    governor = scripted_governor()
    governor.observe_decode([(0, 512)], 512 * pass_seconds(1) / 4)
    state = governor.sources[SOURCE]
    for _ in range(50):
        state.acceptance.add(8, 8)
    governor.learn_costs({SOURCE: DraftCost(0.004 * 9 + 0.001, drafted=8, caught_up=1)})
    state.credit = -1.0  # no probes: only what is expected to pay is asked
    kept_up, behind = Decoding(seq_id=0), Decoding(seq_id=1, prompt_tokens=[1] * 3000)
    governor.requests([kept_up], 100_000, 512)
    governor.proposed(SOURCE, 0.0, [DraftRequest(kept_up, 8)], [])  # it has read it all

    assert governor.ask(SOURCE, governor.requests([kept_up], 100_000, 512), [])
    assert not governor.ask(SOURCE, governor.requests([behind], 100_000, 512), [])


def test_a_source_that_must_first_read_a_long_prompt_is_probed_only_where_that_can_pay() -> None:
    # It would pay once it has read the request, at 1 ms a drafted token; reading the
    # 3000-token prompt costs 0.75 s. A request that may generate many tokens can repay
    # that; one that ends in 20 tokens cannot.
    def probed(seq: Decoding) -> bool:
        governor = scripted_governor()
        governor.observe_decode([(0, 512)], 512 * pass_seconds(1) / 4)  # a prompt token: 1/4
        governor.learn_costs({SOURCE: DraftCost(0.001 * (1 + 8 + 0.25), drafted=8, caught_up=1)})
        return any(step(governor, [seq]) for _ in range(2 * PROBE_EVERY))

    runs_long = Decoding(prompt_tokens=[1] * 3000)
    ends_soon = Decoding(prompt_tokens=[1] * 3000, params=SamplingParams(max_tokens=20))

    assert probed(runs_long)
    assert not probed(ends_soon)


def asked_at(
    governor: Governor,
    seq: Decoding,
    call_seconds: list[float],
    steps: int,
    right: int = 0,
    then: float = 0.0,
) -> list[int]:
    """The steps at which the source was asked, its calls taking `call_seconds` in turn,
    then `then` each, its drafts' first `right` tokens right."""
    asked: list[int] = []
    for count in range(steps):
        seconds = call_seconds[len(asked)] if len(asked) < len(call_seconds) else then
        if step(governor, [seq], right=right, seconds=seconds):
            asked.append(count)
    return asked


def test_a_cheap_source_whose_first_calls_were_slow_is_timed_again_before_it_is_judged() -> None:
    # Its first call warms its caches and its second is preempted, each taking three plain
    # steps; its usual call costs nothing. Judged by them, it would never be asked again.
    governor, seq = scripted_governor(), Decoding()
    slow = 3 * pass_seconds(1)

    asked = asked_at(governor, seq, [slow, slow], steps=40)

    assert asked == list(range(40))  # timed until its price settles, then asked every step
    assert governor.report()["sources"][0]["state"] != "too dear"


def test_a_source_is_timed_again_for_the_one_request_it_has_least_to_read() -> None:
    # A draft model that gave no cost, its first call slow; then three more requests
    # arrive, their prompts unread. Each call to time it again catches up on the request
    # it has read, not on every prompt.
    governor = scripted_governor()
    seqs = [Decoding(seq_id=i, prompt_tokens=[1] * 300) for i in range(4)]
    slow = 3 * pass_seconds(1)

    step(governor, seqs[:1], seconds=slow)
    again = [step(governor, seqs, seconds=slow) for _ in range(SETTLED_CALLS)]

    assert all([r.seq for r in asked] == [seqs[0]] for asked in again)


def test_a_source_that_gave_its_cost_is_not_condemned_by_one_slow_call() -> None:
    # It said a call costs 3% of a plain step, and its drafts come true; its first timed
    # call was preempted (thirty plain steps).
    governor, seq = scripted_governor(), Decoding()
    governor.learn_costs({SOURCE: DraftCost(PROPOSE_SECONDS, drafted=8, caught_up=1)})

    asked = asked_at(governor, seq, [30 * pass_seconds(1)], steps=60, right=8, then=PROPOSE_SECONDS)

    assert len(asked) >= 50


def test_a_source_timed_anew_reads_one_request_whatever_the_budget() -> None:
    # Condemned long ago, four requests decoding now, none of them read, no budget left.
    governor = scripted_governor()
    seqs = [Decoding(seq_id=i) for i in range(4)]
    slow = 3 * pass_seconds(1)
    for _ in range(1 + SETTLED_CALLS):
        step(governor, seqs[:1], seconds=slow)
    for _ in range(RETIME_AFTER):
        step(governor, seqs[:1], seconds=slow)
    governor.sources[SOURCE].credit = -1.0

    first = step(governor, seqs, seconds=PROPOSE_SECONDS)

    assert len(first) == 1  # not every due request's text


def test_a_source_found_too_dear_is_timed_anew_long_after() -> None:
    # Its calls took three plain steps each (a busy neighbour on its core): too dear, not
    # asked. Long after, it is timed again, and the neighbour has gone.
    governor, seq = scripted_governor(), Decoding()
    slow = 3 * pass_seconds(1)

    asked = asked_at(governor, seq, [slow] * (1 + SETTLED_CALLS), steps=RETIME_AFTER + 40)

    assert asked[: 1 + SETTLED_CALLS] == list(range(1 + SETTLED_CALLS))
    later = asked[1 + SETTLED_CALLS :]
    assert later and later[0] > RETIME_AFTER
    assert later == list(range(later[0], RETIME_AFTER + 40))


def test_a_source_priced_out_before_its_price_settles_is_reported_as_being_timed() -> None:
    # Its calls take three plain steps each: too dear once enough of them are timed, and
    # until then asked again at once to confirm it, which is what the report says.
    governor, seq = scripted_governor(), Decoding()
    slow = 3 * pass_seconds(1)
    states = []
    for _ in range(1 + SETTLED_CALLS):
        step(governor, [seq], seconds=slow)
        states.append(governor.report()["sources"][0]["state"])

    assert states[1:-1] and set(states[1:-1]) == {"timing"}
    assert states[-1] == "too dear"


def test_a_source_priced_out_by_the_figure_it_gave_is_asked_for_a_new_one_long_after() -> None:
    # It said a call costs ten plain steps (timed beside a busy neighbour): never asked.
    # Long after, it is asked to measure itself again, and once it says it is cheap it is.
    governor, seq = scripted_governor(), Decoding()
    governor.learn_costs({SOURCE: DraftCost(10 * pass_seconds(1), drafted=8, caught_up=1)})
    due_at = []
    for count in range(RETIME_AFTER + 2):
        assert not step(governor, [seq])
        if governor.reprice_due():
            due_at.append(count)
        if count % 500 == 0:  # /metrics and /status read the governor's report meanwhile
            assert governor.report()["sources"][0]["state"] == "too dear"

    assert due_at == [RETIME_AFTER]  # once: asked, it counts as measured now
    governor.learn_costs({SOURCE: DraftCost(PROPOSE_SECONDS, drafted=8, caught_up=1)})
    asked = [bool(step(governor, [seq], right=8)) for _ in range(20)]
    assert all(asked[10:])  # probed as the budget allows, then its drafts pay every step
    assert not governor.reprice_due()  # timed calls price it from now on


def test_a_source_cheaper_than_a_step_is_looked_at_though_only_prompt_chunks_were_timed() -> None:
    """Early in a process only one-token steps and prompt chunks are timed: priced at what a
    whole chunk took, no draft could pay, but a source cheaper than a step is looked at
    anyway — looking is how its evidence, and the small passes' times, come."""
    governor = Governor([SOURCE], lambda layout: equal_split_passes(layout, 512), draft_max=8)
    for n in (1, 64):
        governor.observe_decode([(0, n)], pass_seconds(n))
    seq = Decoding()

    asks = sum(bool(step(governor, [seq])) for _ in range(60))

    assert asks >= 3
    assert governor.report()["sources"][0]["state"] != "too dear"


def test_a_certain_draft_is_always_taken_before_any_guess() -> None:
    governor = Governor(
        [SOURCE, "grammar"], lambda layout: equal_split_passes(layout, 512), draft_max=8
    )
    for n in (1, 2, 3, 5, 9, 17, 64):  # a host where a pass of several tokens pays
        governor.observe_decode([(0, n)], 0.01 + 0.001 * n)
    seq = Decoding()
    for _ in range(30):  # the guessing source has been right every time
        requests = governor.requests([seq], 100_000, 512)
        guesses = [DraftProposal(r.seq, SOURCE, (RIGHT,) * r.max_tokens) for r in requests]
        governor.proposed(SOURCE, 0.0, requests, guesses)
        for draft in governor.choose([seq], requests, guesses).values():
            governor.record(seq, draft, len(draft.tokens))
            seq.output += [RIGHT] * (len(draft.tokens) + 1)
    requests = governor.requests([seq], 100_000, 512)
    guess = DraftProposal(seq, SOURCE, (RIGHT,) * 8)  # type: ignore[arg-type]
    certain = DraftProposal(seq, "grammar", (RIGHT,) * 2, certain=True)  # type: ignore[arg-type]

    chosen = governor.choose([seq], requests, [guess, certain])

    assert chosen == {seq.key: certain}
    longer = DraftProposal(seq, "grammar", (RIGHT,) * 12, certain=True)  # type: ignore[arg-type]
    cut = governor.choose([seq], requests, [longer])[seq.key]
    assert cut.certain and len(cut.tokens) == requests[0].max_tokens


# ------------------------------------------------------------------ calibration


def flattering_source_bets(governor: Governor, steps: int) -> int:
    """A source whose drafts come true whenever they are scored in shadow and fail whenever
    they are verified: its record flatters it exactly where the governor bets. Returns how
    many of its drafts the governor verified over `steps` steps of one request."""
    seq, bets = Decoding(), 0
    for _ in range(steps):
        requests = governor.requests([seq], 100_000, 512)
        asked = governor.ask(SOURCE, requests, [])
        drafts = [DraftProposal(r.seq, SOURCE, (RIGHT,) * r.max_tokens) for r in asked]
        if asked:
            governor.proposed(SOURCE, 0.0, asked, drafts)
        chosen = governor.choose([seq], requests, drafts)
        for draft in chosen.values():
            governor.record(seq, draft, 0)
            bets += 1
        seq.output.append(RIGHT)
        tokens = 1 + sum(len(d.tokens) for d in chosen.values())
        governor.observe_decode([(0, tokens)], pass_seconds(tokens))
    return bets


def test_bets_that_lose_where_the_record_says_they_should_win_stop_being_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calibrated = flattering_source_bets(scripted_governor(), 400)
    monkeypatch.setattr(Calibration, "share", lambda self, band, position: 1.0)
    uncalibrated = flattering_source_bets(scripted_governor(), 400)

    assert uncalibrated > 40  # the shadows keep making its case
    assert calibrated < uncalibrated / 3


def test_calibration_judges_each_position_and_each_band_of_estimates_apart() -> None:
    calibration = Calibration()
    for i in range(20):  # bets at 0.9 a token: the first two came true, the third seldom
        calibration.add([0.9, 0.9, 0.9], accepted=3 if i % 5 == 0 else 2)
    for _ in range(20):  # bets made at 0.97 a token delivered all of it
        calibration.add([0.97] * 8, accepted=8)

    rates = calibration.rates([0.9, 0.9, 0.9])
    assert rates[:2] == pytest.approx([0.9, 0.9])  # more came true than promised: kept
    promised = 20 * 0.9**3
    assert rates[0] * rates[1] * rates[2] == pytest.approx(0.9**3 * (4 + 4) / (promised + 4))
    assert calibration.rates([0.86, 0.9, 0.9])[2] == pytest.approx(rates[2])  # the same band
    assert calibration.rates([0.97] * 8) == pytest.approx([0.97] * 8)  # never above
    assert calibration.rates([0.4, 0.9]) == [0.4, 0.9]  # no bets there: believed
    assert set(calibration.report()) == {"0.85", "0.95"}


# ------------------------------------------------------------------ kinds of draft


def mixed_source_steps(
    kinds: bool, steps: int = 300, governor: Governor | None = None
) -> tuple[int, int]:
    """A source that costs nothing to ask, whose drafts are of two kinds, drawn at random:
    one always comes true, the other never. Returns the tokens committed over `steps`
    steps of one request, and the tokens verified of the drafts that never come true, with
    the kinds told apart or (`kinds` false) not; on `governor` if given."""
    governor = scripted_governor() if governor is None else governor
    seq = Decoding()
    wasted = 0
    draw = np.random.default_rng(7)
    for _ in range(steps):
        sure = bool(draw.random() < 0.5)
        requests = governor.requests([seq], 100_000, 512)
        asked = governor.ask(SOURCE, requests, [])
        token = RIGHT if sure else WRONG
        kind = ("long match" if sure else "short match") if kinds else ""
        drafts = [DraftProposal(r.seq, SOURCE, (token,) * r.max_tokens, kind=kind) for r in asked]
        if asked:
            governor.proposed(SOURCE, 0.0, asked, drafts)
        chosen = governor.choose([seq], requests, drafts)
        accepted = verified = 0
        for draft in chosen.values():
            verified = len(draft.tokens)
            accepted = verified if sure else 0
            governor.record(seq, draft, accepted)
            wasted += 0 if sure else verified
        seq.output += [RIGHT] * (accepted + 1)
        governor.observe_decode([(0, 1 + verified)], pass_seconds(1 + verified))
    return len(seq.output), wasted


def test_a_kind_of_draft_that_comes_true_is_verified_though_its_source_is_a_coin_flip() -> None:
    apart, wasted_apart = mixed_source_steps(kinds=True)
    pooled, _ = mixed_source_steps(kinds=False)

    # Pooled, the source is right half the time, which never pays on this host.
    assert pooled < 1.2 * 300
    # Told apart, the sure kind is verified at length and the other is not verified.
    assert apart > 3 * pooled
    assert wasted_apart < 0.02 * apart


def test_a_draft_with_a_kind_is_calibrated_against_what_its_kind_was_estimated_at() -> None:
    governor = scripted_governor()
    mixed_source_steps(kinds=True, governor=governor)
    calibration = governor.sources[SOURCE].calibration

    # Bets were placed at the rates of their draft's kind: high once the sure kind's first
    # drafts came true, never in the bands of the source's coin flip (below 0.7); what
    # they promised came true, so such estimates are believed.
    report = calibration.report()
    assert "0.95" in report
    assert set(report) <= {"0.7", "0.85", "0.95"}
    assert set(report.values()) == {1.0}
    assert calibration.rates([0.99] * 8) == pytest.approx([0.99] * 8)


def test_a_kind_without_evidence_is_priced_as_its_source() -> None:
    governor = scripted_governor()
    seq = Decoding()
    for _ in range(40):  # the source's drafts of no kind always come true
        requests = governor.requests([seq], 100_000, 512)
        drafts = [DraftProposal(r.seq, SOURCE, (RIGHT,) * r.max_tokens) for r in requests]
        governor.proposed(SOURCE, 0.0, requests, drafts)
        for draft in governor.choose([seq], requests, drafts).values():
            governor.record(seq, draft, len(draft.tokens))
            seq.output += [RIGHT] * len(draft.tokens)
        seq.output.append(RIGHT)
    requests = governor.requests([seq], 100_000, 512)
    plain = DraftProposal(seq, SOURCE, (RIGHT,) * 8)  # type: ignore[arg-type]
    new_kind = DraftProposal(seq, SOURCE, (RIGHT,) * 8, kind="never seen")  # type: ignore[arg-type]

    assert len(governor.choose([seq], requests, [new_kind])[seq.key].tokens) == len(
        governor.choose([seq], requests, [plain])[seq.key].tokens
    )


def test_a_middling_source_whose_drafts_have_kinds_is_asked_for_all_it_can_draft() -> None:
    governor, seq = scripted_governor(), Decoding()
    asked_for: list[int] = []
    for _ in range(60):  # a source too dear to ask every step for nothing, right 3 deep
        requests = governor.requests([seq], 100_000, 512)
        asked = governor.ask(SOURCE, requests, [])
        drafts = [
            DraftProposal(
                r.seq, SOURCE, (*[RIGHT] * 3, *[WRONG] * r.max_tokens)[: r.max_tokens], kind="three"
            )
            for r in asked
        ]
        if asked:
            governor.proposed(SOURCE, PROPOSE_SECONDS, asked, drafts)
            asked_for.append(asked[0].max_tokens)
        verified = accepted = 0
        for draft in governor.choose([seq], requests, drafts).values():
            verified, accepted = len(draft.tokens), min(3, len(draft.tokens))
            governor.record(seq, draft, accepted)
        seq.output += [RIGHT] * (accepted + 1)
        governor.observe_decode([(0, 1 + verified)], pass_seconds(1 + verified))

    assert governor.sources[SOURCE].kinds["three"].drafts > 10
    # Its limit every step, though its record says a draft pays to 3 or 4 tokens: the
    # kind of the draft in hand may say otherwise.
    assert asked_for[-10:] == [requests[0].max_tokens] * 10
