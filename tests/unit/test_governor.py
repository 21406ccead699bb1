"""The speculation governor: where drafts pay it verifies them, where they do not it stops,
and a request may choose its own mode.

Hosts are scripted with the fake backend's costs: `step_cost_s` per pass over the weights,
`token_cost_s` per token. Where a pass is expensive and tokens cheap (a CPU running a
model), verifying a few drafts costs little more than decoding one token; where every
token costs as much as a pass, a draft can never pay. Time is virtual here: a decode
advances the engine's clock by exactly its scripted cost, so what the governor measures
is the host, not the load on the machine running the tests. Engines are stepped by the
test (``start=False``); assertions read the governor's state and the drafts counted in
usage. The probing schedule is checked on a `Governor` with a scripted cost curve.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from draft_sources import SOURCE, AlwaysWrong, KnownAnswers, drafting, fake, request

from reame_core.backend import fake as fake_module
from reame_core.backend.base import Batch, equal_split_passes
from reame_core.backend.fake import FakeBackend
from reame_core.engine import engine as engine_module
from reame_core.engine.engine import Engine
from reame_core.engine.governor import (
    MIN_DRAFTS,
    PROBE_BUDGET,
    PROBE_DRAFTS,
    PROBE_EVERY,
    PROBE_TOKENS,
    Acceptance,
    Governor,
    accepted_by_length,
)
from reame_core.hooktypes import DraftProposal
from reame_core.request import Event, FinishEvent, GenerationRequest, SamplingParams

MakeEngine = Callable[..., Engine]
Reference = Callable[[FakeBackend, Sequence[int], int], list[int]]
Tokenize = Callable[[str], list[int]]
Drive = Callable[[Engine], None]

# A pass costs 40 tokens: verifying 8 drafts costs 1.2x a plain step.
EXPENSIVE_PASS: dict[str, float] = {"step_cost_s": 0.004, "token_cost_s": 0.0001}
# A pass costs nothing beyond its tokens: k drafts cost (1 + k)x a plain step.
TOKEN_PRICED: dict[str, float] = {"step_cost_s": 0.0, "token_cost_s": 0.003}
# A draft token costs 0.4 of a plain step: worth it only if 40% of draft tokens are right.
DRAFT_TOKEN_COSTLY: dict[str, float] = {"step_cost_s": 0.0015, "token_cost_s": 0.001}
PROMPTS = ("The cat sat on", "Speculation must not", "Once upon a time", "x")


# -------------------------------------------------------------------- draft sources


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
    """The fake backend sleeps on it and the engine times decodes with it."""

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
    monkeypatch.setattr(engine_module, "time", clock)
    return clock


@pytest.fixture
def answers(tokenize: Tokenize, greedy_reference: Reference) -> dict[tuple[int, ...], list[int]]:
    model = FakeBackend()
    return {tuple(tokenize(p)): greedy_reference(model, tokenize(p), 80) for p in PROMPTS}


# ------------------------------------------------------------ what a draft is worth


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_expected_accepted_sums_the_chance_of_each_draft_prefix(alpha: float, k: int) -> None:
    # Draft token i is kept only if tokens 1..i are all right: probability alpha ** i.
    expected = accepted_by_length([alpha] * k)

    assert expected[k] == pytest.approx(sum(alpha**i for i in range(1, k + 1)))
    assert expected[0] == 0.0


def test_acceptance_counts_each_position_a_draft_reached() -> None:
    acceptance = Acceptance()

    acceptance.add(4, 2)  # tokens 0 and 1 right, token 2 wrong, token 3 never checked
    acceptance.add(2, 2)

    assert acceptance.reached == [2.0, 2.0, 1.0, 0.0]
    assert acceptance.passed == [2.0, 2.0, 0.0, 0.0]


def test_what_a_draft_brings_follows_how_drafts_really_fared() -> None:
    # Half the drafts miss at once; the others are right to the end (a copy on track):
    # an 8-token draft brings 4 tokens on average, which one rate for all positions
    # (about 0.88 here) overestimates.
    acceptance = Acceptance()
    for _ in range(10):
        acceptance.add(8, 0)
        acceptance.add(8, 8)

    rates = acceptance.rates(8, [acceptance.pooled] * 8, 1.0)

    assert rates[0] < 0.6 and rates[7] > 0.9
    assert accepted_by_length(rates)[8] == pytest.approx(4.0, abs=0.1)
    assert accepted_by_length([acceptance.pooled] * 8)[8] > 4.5


def test_positions_without_evidence_take_the_prior() -> None:
    rates = Acceptance().rates(3, [0.2, 0.4, 0.6], 2.0)

    assert rates == pytest.approx([0.2, 0.4, 0.6])


# ------------------------------------------------------------------ auto on a host


def test_auto_keeps_a_perfect_source_on_where_a_pass_is_expensive(
    make_engine: MakeEngine,
    tokenize: Tokenize,
    drive: Drive,
    answers: dict[tuple[int, ...], list[int]],
) -> None:
    engine = make_engine(plugins=drafting(KnownAnswers(answers)), start=False, **EXPENSIVE_PASS)

    [result] = run(engine, drive, request(tokenize(PROMPTS[0]), max_tokens=40))

    state = engine.governor.sources[SOURCE]
    assert state.enabled
    assert state.gain is not None and state.gain > 1
    assert result.usage.draft_proposed[SOURCE] > 0
    assert result.usage.draft_accepted[SOURCE] == result.usage.draft_proposed[SOURCE]


def test_auto_switches_off_a_useless_source_and_stops_asking_it(
    make_engine: MakeEngine, tokenize: Tokenize, drive: Drive
) -> None:
    source = AlwaysWrong()
    engine = make_engine(plugins=drafting(source), start=False, **DRAFT_TOKEN_COSTLY)

    for prompt in PROMPTS * 2:
        run(engine, drive, request(tokenize(prompt), max_tokens=10))

    state = engine.governor.sources[SOURCE]
    assert not state.enabled
    assert "< 1" in state.reason
    # Proposing costs time too (a draft model decodes): once off, only probes ask it.
    assert source.calls < engine.stats.decode_steps / 2


def test_auto_does_not_speculate_where_each_token_costs_as_much_as_a_pass(
    make_engine: MakeEngine,
    tokenize: Tokenize,
    drive: Drive,
    answers: dict[tuple[int, ...], list[int]],
) -> None:
    mostly_right = KnownAnswers(answers, wrong_every=4)
    engine = make_engine(plugins=drafting(mostly_right), start=False, **TOKEN_PRICED)

    run(engine, drive, request(tokenize(PROMPTS[0]), max_tokens=24))

    # A draft of k tokens costs k more steps' worth: at most a few to find that out.
    assert engine.governor.sources[SOURCE].drafts <= MIN_DRAFTS


def test_on_verifies_drafts_where_each_token_costs_as_much_as_a_pass(
    make_engine: MakeEngine,
    tokenize: Tokenize,
    drive: Drive,
    answers: dict[tuple[int, ...], list[int]],
) -> None:
    mostly_right = KnownAnswers(answers, wrong_every=4)
    engine = make_engine(
        speculate="on", plugins=drafting(mostly_right), start=False, **TOKEN_PRICED
    )

    [result] = run(engine, drive, request(tokenize(PROMPTS[0]), max_tokens=24))

    # Every decode step verifies a draft, but maybe the last (one token left: no room).
    assert engine.governor.sources[SOURCE].drafts >= engine.stats.decode_steps - 2
    assert result.usage.draft_accepted[SOURCE] > 0


def test_auto_speculates_for_several_sequences_decoding_together(
    make_engine: MakeEngine,
    tokenize: Tokenize,
    drive: Drive,
    answers: dict[tuple[int, ...], list[int]],
) -> None:
    engine = make_engine(
        plugins=drafting(KnownAnswers(answers)), start=False, n_seq_max=4, **EXPENSIVE_PASS
    )

    results = run(engine, drive, *(request(tokenize(p), max_tokens=40) for p in PROMPTS))

    # Four sequences each verifying 8 perfect drafts: one pass of 36 tokens commits 36.
    assert all(result.usage.draft_accepted.get(SOURCE, 0) > 0 for result in results)


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


# ------------------------------------------------------ switching off and probing


@dataclass
class Decoding:
    """A decoding sequence as the governor reads it."""

    seq_id: int = 0
    n_kv: int = 20
    output: list[int] = field(default_factory=list)
    params: SamplingParams = field(default_factory=lambda: SamplingParams(max_tokens=10_000))


def scripted_governor() -> Governor:
    """A governor that has timed this host: 3 ms a pass, 1 ms a token."""
    governor = Governor([SOURCE], lambda layout: equal_split_passes(layout, 512), draft_max=8)
    for n in (1, 2, 3, 5, 9, 17):
        governor.cost.observe([n], 0.003 + 0.001 * n)
    return governor


def step(governor: Governor, seq: Decoding, accepted: int = 0) -> DraftProposal | None:
    """One engine step as the governor sees it: ask, propose 8 tokens, verify what it
    chose with `accepted` of its tokens right. Returns the verified draft, if any."""
    requests, asked = governor.requests([seq], 2048, 512)
    if SOURCE not in asked:
        return None
    offered = DraftProposal(seq, SOURCE, (0,) * 8)
    chosen = governor.choose([seq], requests, [offered]).get(id(seq))
    if chosen is not None:
        governor.record(seq, chosen, min(accepted, len(chosen.tokens)))
    return chosen


def switched_off(governor: Governor, seq: Decoding) -> None:
    """Verify useless drafts until the governor switches the source off."""
    governor.requests([seq], 2048, 512)
    for _ in range(MIN_DRAFTS):
        governor.record(seq, DraftProposal(seq, SOURCE, (0,) * 4), 0)
    assert not governor.sources[SOURCE].enabled


def first_wait(governor: Governor) -> int:
    """Steps before the first probe: PROBE_EVERY, stretched to keep probing within budget."""
    return PROBE_EVERY * max(1, math.ceil(governor.probe_spacing() / PROBE_EVERY))


def steps_until_asked(governor: Governor, seq: Decoding) -> int:
    for count in range(1, 100 * PROBE_EVERY):
        if SOURCE in governor.requests([seq], 2048, 512)[1]:
            return count
    raise AssertionError("the source was never asked again")


def test_source_is_switched_off_after_min_drafts_all_rejected_saying_why() -> None:
    governor, seq = scripted_governor(), Decoding()
    governor.requests([seq], 2048, 512)
    state = governor.sources[SOURCE]
    rejected = DraftProposal(seq, SOURCE, (0,) * 4)

    for _ in range(MIN_DRAFTS - 1):
        governor.record(seq, rejected, 0)
    on_before = state.enabled
    governor.record(seq, rejected, 0)

    assert on_before
    assert not state.enabled
    assert state.gain is not None and state.gain < 1
    assert "< 1" in state.reason
    assert f"tried again in {first_wait(governor)} steps" in state.reason


def test_switched_off_source_is_probed_again_after_the_first_wait() -> None:
    governor, seq = scripted_governor(), Decoding()
    switched_off(governor, seq)

    assert steps_until_asked(governor, seq) == first_wait(governor) >= PROBE_EVERY


def test_probing_a_useless_source_costs_at_most_the_probe_budget() -> None:
    governor, seq = scripted_governor(), Decoding()
    switched_off(governor, seq)
    plain = governor.cost.pass_seconds(1)
    steps = first_wait(governor) + PROBE_DRAFTS  # one whole probing cycle

    probes = [step(governor, seq, accepted=0) for _ in range(steps)]

    extra = sum(
        governor.cost.pass_seconds(1 + len(p.tokens)) - plain for p in probes if p is not None
    )
    assert any(probes)
    assert extra <= PROBE_BUDGET * steps * plain


def test_probe_verifies_a_few_short_drafts() -> None:
    governor, seq = scripted_governor(), Decoding()
    switched_off(governor, seq)
    for _ in range(first_wait(governor) - 1):
        assert step(governor, seq) is None

    probes = [step(governor, seq) for _ in range(PROBE_DRAFTS)]

    assert [len(p.tokens) if p else 0 for p in probes] == [PROBE_TOKENS] * PROBE_DRAFTS


def test_source_still_useless_when_probed_stays_off_twice_as_long() -> None:
    governor, seq = scripted_governor(), Decoding()
    switched_off(governor, seq)
    steps_until_asked(governor, seq)

    for _ in range(PROBE_DRAFTS):
        step(governor, seq, accepted=0)

    state = governor.sources[SOURCE]
    assert not state.enabled
    assert f"tried again in {2 * first_wait(governor)} steps" in state.reason
    assert steps_until_asked(governor, seq) == 2 * first_wait(governor)


def test_source_that_has_become_useful_when_probed_is_switched_back_on() -> None:
    governor, seq = scripted_governor(), Decoding()
    switched_off(governor, seq)
    for _ in range(first_wait(governor) - 1):
        step(governor, seq)

    for _ in range(PROBE_DRAFTS):
        step(governor, seq, accepted=PROBE_TOKENS)

    assert governor.sources[SOURCE].enabled
