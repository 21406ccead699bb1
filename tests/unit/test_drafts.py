"""Draft sources as a third party writes them, and the guarantee that drafts never change output.

These engines run with speculation ``on``: every proposal is verified, whatever the
governor would think of it (its own tests are in test_governor.py).

Each source below is what an outside author would ship: a class with one
``reame_propose_drafts`` hook implementation, registered on a `PluginHost` by name. Greedy
output must be identical with any drafts at all; sampled output must keep the model's
distribution, checked against the exact distribution computed from the fake model.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from draft_sources import SOURCE, AlwaysWrong, KnownAnswers, drafting, fake, request

from reame_core.backend.fake import EOS, FakeBackend
from reame_core.engine.engine import Engine
from reame_core.engine.sampler import TokenSampler
from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import DraftProposal, DraftRequest
from reame_core.request import Event, FinishEvent, SamplingParams, TokenEvent

MakeEngine = Callable[..., Engine]
Reference = Callable[[FakeBackend, Sequence[int], int], list[int]]
Tokenize = Callable[[str], list[int]]
Drive = Callable[[Engine], None]

LETTERS = tuple(b"abcdefghijklmnopqrstuvwxyz ")


# -------------------------------------------------------------------- draft sources


class RandomLetters:
    """Guesses letters at random: now and then right, mostly wrong."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    @hookimpl
    def reame_propose_drafts(self, requests: Sequence[DraftRequest]) -> list[DraftProposal]:
        return [
            DraftProposal(
                r.seq, SOURCE, tuple(int(t) for t in self.rng.choice(LETTERS, r.max_tokens))
            )
            for r in requests
        ]


class LongWinded:
    """Ignores `max_tokens` and always proposes a long guess."""

    @hookimpl
    def reame_propose_drafts(self, requests: Sequence[DraftRequest]) -> list[DraftProposal]:
        return [DraftProposal(r.seq, SOURCE, LETTERS * 4) for r in requests]


class GreedyDraftModel:
    """A small draft model (here: a fake model) proposing its argmax continuation."""

    def __init__(self) -> None:
        self.model = FakeBackend()

    @hookimpl
    def reame_propose_drafts(self, requests: Sequence[DraftRequest]) -> list[DraftProposal]:
        proposals = []
        for asked in requests:
            context = [*asked.seq.prompt_tokens, *asked.seq.output_tokens]
            guess: list[int] = []
            for _ in range(asked.max_tokens):
                guess.append(int(np.argmax(self.model.logits_after(context + guess))))
            proposals.append(DraftProposal(asked.seq, SOURCE, tuple(guess)))
        return proposals


class SamplingDraftModel:
    """A draft model that samples its guesses and says which distribution each came from."""

    def __init__(self, temperature: float) -> None:
        self.model = FakeBackend()
        self.temperature = temperature
        self.rng = np.random.default_rng(0)

    @hookimpl
    def reame_propose_drafts(self, requests: Sequence[DraftRequest]) -> list[DraftProposal]:
        proposals = []
        for asked in requests:
            context = [*asked.seq.prompt_tokens, *asked.seq.output_tokens]
            guess: list[int] = []
            rows = []
            for _ in range(asked.max_tokens):
                logits = self.model.logits_after(context + guess).astype(np.float64)
                q = np.exp((logits - logits.max()) / self.temperature)
                q /= q.sum()
                guess.append(int(self.rng.choice(q.shape[0], p=q)))
                rows.append(q)
            proposals.append(DraftProposal(asked.seq, SOURCE, tuple(guess), np.stack(rows)))
        return proposals


# -------------------------------------------------------------------------- helpers


PROMPTS = ("The cat sat on", "Speculation must not", "x")
GREEDY_SOURCES: dict[str, Callable[[dict[tuple[int, ...], list[int]]], object]] = {
    "perfect": KnownAnswers,
    "always-wrong": lambda answers: AlwaysWrong(),
    "random": lambda answers: RandomLetters(seed=3),
}


@pytest.fixture
def answers(tokenize: Tokenize, greedy_reference: Reference) -> dict[tuple[int, ...], list[int]]:
    model = FakeBackend()
    return {tuple(tokenize(p)): greedy_reference(model, tokenize(p), 40) for p in PROMPTS}


# ---------------------------------------------------------------- greedy exactness


def test_engine_verifies_the_drafts_of_a_registered_source(
    make_engine: MakeEngine, tokenize: Tokenize, answers: dict[tuple[int, ...], list[int]]
) -> None:
    engine = make_engine(speculate="on", plugins=drafting(KnownAnswers(answers)))

    result = engine.generate(request(tokenize(PROMPTS[0]), max_tokens=40))

    proposed = result.usage.draft_proposed[SOURCE]
    assert proposed > 0
    assert result.usage.draft_accepted[SOURCE] == proposed
    assert engine.governor.sources[SOURCE].proposed == proposed
    assert engine.governor.sources[SOURCE].accepted == proposed
    # After the first token, each step adds its accepted drafts plus one token of its own.
    assert proposed + (engine.stats.decode_steps - 1) == 39


def test_perfect_drafts_need_fewer_decode_steps(
    make_engine: MakeEngine, tokenize: Tokenize, answers: dict[tuple[int, ...], list[int]]
) -> None:
    plain = make_engine(speculate="off")  # "auto" may take up prompt lookup as timings go
    speculating = make_engine(speculate="on", plugins=drafting(KnownAnswers(answers)), draft_max=8)
    prompt = tokenize(PROMPTS[0])

    plain.generate(request(prompt, max_tokens=40))
    speculating.generate(request(prompt, max_tokens=40))

    # One step prefills; then each step commits a token plus up to 8 accepted drafts.
    assert plain.stats.decode_steps == 1 + 39
    assert speculating.stats.decode_steps == 1 + math.ceil(39 / 9)


def test_always_wrong_drafts_are_all_rejected(make_engine: MakeEngine, tokenize: Tokenize) -> None:
    engine = make_engine(speculate="on", plugins=drafting(AlwaysWrong()))

    result = engine.generate(request(tokenize(PROMPTS[0]), max_tokens=20))

    assert result.usage.draft_proposed[SOURCE] > 0
    assert result.usage.draft_accepted[SOURCE] == 0


@pytest.mark.parametrize("source", GREEDY_SOURCES)
@pytest.mark.parametrize("text", PROMPTS)
def test_greedy_output_with_drafts_equals_output_without(
    make_engine: MakeEngine,
    tokenize: Tokenize,
    greedy_reference: Reference,
    answers: dict[tuple[int, ...], list[int]],
    source: str,
    text: str,
) -> None:
    engine = make_engine(speculate="on", plugins=drafting(GREEDY_SOURCES[source](answers)))
    prompt = tokenize(text)

    result = engine.generate(request(prompt, max_tokens=40))

    assert list(result.candidates[0].tokens) == greedy_reference(fake(engine), prompt, 40)
    assert result.usage.draft_proposed[SOURCE] > 0


def test_drafts_a_model_cannot_take_back_fail_the_request_instead_of_being_kept(
    make_engine: MakeEngine, tokenize: Tokenize
) -> None:
    engine = make_engine(speculate="on", plugins=drafting(AlwaysWrong()), recurrent=True)

    result = engine.generate(request(tokenize(PROMPTS[0]), max_tokens=20))

    assert result.error == "the model could not take back rejected draft tokens"
    assert all(cells == [] for cells in fake(engine).kv.values())


def test_a_refused_rollback_fails_only_the_request_it_belongs_to(
    make_engine: MakeEngine, tokenize: Tokenize
) -> None:
    engine = make_engine(speculate="off", plugins=drafting(AlwaysWrong()), recurrent=True)
    finished: dict[str, FinishEvent] = {}
    done = threading.Semaphore(0)

    def keep(name: str) -> Callable[[Event], None]:
        def emit(event: Event) -> None:
            if isinstance(event, FinishEvent):
                finished[name] = event
                done.release()

        return emit

    engine.submit(request(tokenize(PROMPTS[1]), max_tokens=20, ignore_eos=True), keep("plain"))
    engine.submit(request(tokenize(PROMPTS[0]), max_tokens=20, speculate="on"), keep("drafted"))
    for _ in range(2):
        assert done.acquire(timeout=10)

    assert finished["drafted"].error is not None
    assert finished["plain"].error is None
    assert len(finished["plain"].candidates[0].tokens) == 20


@pytest.mark.parametrize("source", GREEDY_SOURCES)
def test_rollback_leaves_the_kv_holding_exactly_the_prompt_and_output(
    make_engine: MakeEngine,
    tokenize: Tokenize,
    answers: dict[tuple[int, ...], list[int]],
    source: str,
) -> None:
    engine = make_engine(
        speculate="on", plugins=drafting(GREEDY_SOURCES[source](answers)), n_seq_max=1
    )
    prompt = tokenize(PROMPTS[1])

    result = engine.generate(request(prompt, max_tokens=40))

    # The last token is returned but never decoded.
    output = list(result.candidates[0].tokens)
    assert fake(engine).kv[0] == [*prompt, *output[:-1]]
    assert engine.slots.slots[0].tokens == fake(engine).kv[0]


def test_proposals_longer_than_allowed_are_cut_to_draft_max(
    make_engine: MakeEngine, tokenize: Tokenize, greedy_reference: Reference
) -> None:
    engine = make_engine(speculate="on", plugins=drafting(LongWinded()), draft_max=4)
    prompt = tokenize(PROMPTS[0])

    result = engine.generate(request(prompt, max_tokens=30))

    assert list(result.candidates[0].tokens) == greedy_reference(fake(engine), prompt, 30)
    assert max(fake(engine).batch_sizes[1:]) == 1 + 4


def test_accepted_drafts_never_run_past_max_tokens(
    make_engine: MakeEngine, tokenize: Tokenize, answers: dict[tuple[int, ...], list[int]]
) -> None:
    engine = make_engine(speculate="on", plugins=drafting(KnownAnswers(answers)))

    result = engine.generate(request(tokenize(PROMPTS[0]), max_tokens=13))

    assert len(result.candidates[0].tokens) == 13
    assert result.candidates[0].finish_reason == "length"


def test_stop_string_inside_accepted_drafts_ends_the_output_there(
    make_engine: MakeEngine, tokenize: Tokenize, answers: dict[tuple[int, ...], list[int]]
) -> None:
    engine = make_engine(speculate="on", plugins=drafting(KnownAnswers(answers)), n_seq_max=1)
    prompt = tokenize(PROMPTS[0])
    full = bytes(answers[tuple(prompt)]).decode()
    stop = full[20:23]

    result = engine.generate(request(prompt, max_tokens=40, stop=(stop,)))

    assert result.candidates[0].text == full[: full.index(stop)]
    assert result.candidates[0].finish_reason == "stop"
    assert engine.slots.slots[0].tokens == fake(engine).kv[0]


def test_end_of_sequence_inside_accepted_drafts_ends_the_output_there(
    make_engine: MakeEngine, tokenize: Tokenize, greedy_reference: Reference
) -> None:
    model = FakeBackend(eos_every=3)
    prompts = [tokenize(text) for text in PROMPTS]
    # The known answers run on past the end of sequence, as a careless cache might.
    answers = {tuple(p): [*greedy_reference(model, p, 40), EOS, *b"more"] for p in prompts}
    engine = make_engine(speculate="on", plugins=drafting(KnownAnswers(answers)), eos_every=3)

    for prompt in prompts:
        result = engine.generate(request(prompt, max_tokens=40))

        assert list(result.candidates[0].tokens) == greedy_reference(model, prompt, 40)
        assert result.candidates[0].finish_reason == "stop"


@pytest.mark.parametrize("source", ["perfect", "random"])
def test_penalized_greedy_output_with_drafts_equals_output_without(
    make_engine: MakeEngine, tokenize: Tokenize, source: str
) -> None:
    params: dict[str, Any] = {"max_tokens": 40, "repeat_penalty": 1.3}
    prompt = tokenize(PROMPTS[0])
    plain = make_engine().generate(request(prompt, **params)).candidates[0].tokens
    drafts = KnownAnswers({tuple(prompt): plain}) if source == "perfect" else RandomLetters(5)
    engine = make_engine(speculate="on", plugins=drafting(drafts))

    result = engine.generate(request(prompt, **params))

    assert result.candidates[0].tokens == plain
    assert result.usage.draft_proposed[SOURCE] > 0
    if source == "perfect":
        assert result.usage.draft_accepted[SOURCE] == result.usage.draft_proposed[SOURCE]


def test_logprobs_with_drafts_equal_logprobs_without(
    make_engine: MakeEngine, tokenize: Tokenize, answers: dict[tuple[int, ...], list[int]]
) -> None:
    prompt = tokenize(PROMPTS[0])
    params: dict[str, Any] = {"max_tokens": 30, "logprobs": 3, "repeat_penalty": 1.1}
    plain: list[TokenEvent] = []
    drafted: list[TokenEvent] = []
    make_engine().generate(request(prompt, **params), plain.append)
    engine = make_engine(speculate="on", plugins=drafting(GreedyDraftModel()))

    engine.generate(request(prompt, **params), drafted.append)

    assert engine.governor.sources[SOURCE].accepted > 0
    assert [lp for e in drafted for lp in e.logprobs] == [lp for e in plain for lp in e.logprobs]


# ------------------------------------------------------------ sampled distributions

SAMPLED: dict[str, Any] = {"max_tokens": 4, "temperature": 2.0, "top_k": 3}
RUNS = 3000


def exact_distribution(
    model: FakeBackend, prompt: Sequence[int], params: SamplingParams
) -> dict[tuple[int, ...], float]:
    """Probability of every possible output, from the fake model and the sampler's cut."""
    sampler = TokenSampler(params, eog=model.info.eog)
    outputs: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(params.max_tokens):
        longer = {}
        for output, p in outputs.items():
            row = sampler.adjust(model.logits_after([*prompt, *output]))
            probs = sampler.probabilities(row)
            for token in np.flatnonzero(probs):
                longer[(*output, int(token))] = p * float(probs[token])
        outputs = longer
    return outputs


def sample_outputs(engine: Engine, prompt: Sequence[int], drive: Drive) -> Counter[tuple[int, ...]]:
    finished: list[FinishEvent] = []

    def keep(event: Event) -> None:
        if isinstance(event, FinishEvent):
            finished.append(event)

    for seed in range(RUNS):
        engine.submit(request(prompt, seed=seed, **SAMPLED), keep)
    drive(engine)
    return Counter(result.candidates[0].tokens for result in finished)


def assert_follows(
    counts: Counter[tuple[int, ...]], expected: dict[tuple[int, ...], float]
) -> None:
    """Pearson's chi-square goodness of fit at the 0.1% level; rare outputs pooled."""
    assert set(counts) <= set(expected), "an output the model cannot produce"
    n = sum(counts.values())
    statistic, cells, pooled_observed, pooled_expected = 0.0, 0, 0, 0.0
    for output, p in expected.items():
        if n * p < 5:
            pooled_observed += counts[output]
            pooled_expected += n * p
            continue
        statistic += (counts[output] - n * p) ** 2 / (n * p)
        cells += 1
    if pooled_expected > 0:
        statistic += (pooled_observed - pooled_expected) ** 2 / pooled_expected
        cells += 1
    df = cells - 1
    # Wilson-Hilferty approximation of the chi-square quantile, z = 3.09 for p = 0.001.
    critical = df * (1 - 2 / (9 * df) + 3.09 * math.sqrt(2 / (9 * df))) ** 3
    assert statistic < critical, f"chi-square {statistic:.1f} >= {critical:.1f} (df {df})"


def test_sampled_outputs_follow_the_model_distribution_without_drafts(
    make_engine: MakeEngine, tokenize: Tokenize, drive: Drive
) -> None:
    engine = make_engine(start=False, n_seq_max=8)
    prompt = tokenize("Once upon")

    counts = sample_outputs(engine, prompt, drive)

    assert_follows(counts, exact_distribution(fake(engine), prompt, SamplingParams(**SAMPLED)))


@pytest.mark.parametrize(
    "source",
    [GreedyDraftModel, lambda: SamplingDraftModel(temperature=1.0)],
    ids=["deterministic-drafts", "sampled-drafts-with-probs"],
)
def test_speculative_sampling_keeps_the_model_distribution(
    make_engine: MakeEngine, tokenize: Tokenize, drive: Drive, source: Callable[[], object]
) -> None:
    engine = make_engine(speculate="on", plugins=drafting(source()), start=False, n_seq_max=8)
    prompt = tokenize("Once upon")

    counts = sample_outputs(engine, prompt, drive)

    source = engine.governor.sources[SOURCE]
    proposed, accepted = source.proposed, source.accepted
    assert 0 < accepted < proposed  # both acceptance and the residual draw are exercised
    assert_follows(counts, exact_distribution(fake(engine), prompt, SamplingParams(**SAMPLED)))


def test_seeded_sampling_with_drafts_repeats_exactly(
    make_engine: MakeEngine, tokenize: Tokenize
) -> None:
    prompt = tokenize("Once upon")
    params: dict[str, Any] = {"max_tokens": 40, "temperature": 1.0, "seed": 8, "ignore_eos": True}

    first = make_engine(speculate="on", plugins=drafting(GreedyDraftModel())).generate(
        request(prompt, **params)
    )
    second = make_engine(speculate="on", plugins=drafting(GreedyDraftModel())).generate(
        request(prompt, **params)
    )

    assert first.usage.draft_accepted[SOURCE] > 0
    assert first.candidates[0].tokens == second.candidates[0].tokens
