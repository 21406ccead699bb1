"""The verifying hooks' contract: constraints decide every token and see the model's own
row; a verifier plugin replaces the built-in one."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest
from installed_plugins import InstalledPlugins

from reame_core.backend.fake import FakeBackend
from reame_core.engine.engine import Engine
from reame_core.request import CandidateResult, GenerationRequest, SamplingParams
from reame_core.runtime import start_runtime
from reame_core.settings import Settings

MakeEngine = Callable[..., Engine]
DIGITS = list(range(ord("0"), ord("9") + 1))  # the fake model's tokens are bytes
REPETITIVE = [1, *b"one two three one two three one two three one two"]


def greedy(
    backend: FakeBackend,
    prompt: Sequence[int],
    max_tokens: int,
    constrain: Callable[[np.ndarray], None] = lambda row: None,
) -> list[int]:
    output: list[int] = []
    while len(output) < max_tokens:
        row = backend.logits_after([*prompt, *output]).copy()
        constrain(row)
        token = int(np.argmax(row))
        if token in backend.info.eog:
            break
        output.append(token)
    return output


@pytest.mark.parametrize("speculate", ["off", "on"])
def test_constraint_decides_every_token(
    install_plugins: InstalledPlugins, make_engine: MakeEngine, speculate: str
) -> None:
    engine = make_engine(install_plugins("allowed_tokens"), speculate=speculate)
    request = GenerationRequest(
        REPETITIVE,
        SamplingParams(max_tokens=24, temperature=1.0, seed=3),
        n=2,
        extensions={"allowed_tokens": DIGITS},
    )

    finish = engine.generate(request)

    for result in finish.candidates:
        assert len(result.tokens) == 24
        assert result.text.isdigit(), result.text


def test_constraint_is_asked_once_per_sampled_position(
    install_plugins: InstalledPlugins, make_engine: MakeEngine
) -> None:
    engine = make_engine(install_plugins("constraint_calls"))
    request = GenerationRequest([1, 2, 3], SamplingParams(max_tokens=7, ignore_eos=True), n=3)

    engine.generate(request)

    calls = install_plugins.module("constraint_calls").calls
    assert sorted(calls) == [(request.request_id, c) for c in range(3)]
    assert all(pending == [()] * 7 for pending in calls.values())


def test_constraint_with_drafts_is_told_the_pending_tokens_of_each_row(
    install_plugins: InstalledPlugins, make_engine: MakeEngine
) -> None:
    engine = make_engine(install_plugins("constraint_calls", "oracle_drafts"), speculate="on")
    request = GenerationRequest(REPETITIVE, SamplingParams(max_tokens=20, ignore_eos=True))

    finish = engine.generate(request)

    (pendings,) = install_plugins.module("constraint_calls").calls.values()
    output = finish.candidates[0].tokens
    # Every row is the next position after some committed output, plus pending draft tokens.
    assert max(len(p) for p in pendings) > 0, "no drafts were verified"
    for pending in pendings:
        assert len(pending) <= len(output)
    assert finish.usage.draft_proposed


def test_each_candidates_constraint_sees_the_models_raw_row(
    install_plugins: InstalledPlugins, make_engine: MakeEngine
) -> None:
    engine = make_engine(install_plugins("ban_favourite"))
    prompt = [1, *b"abc"]
    request = GenerationRequest(prompt, SamplingParams(max_tokens=6), n=3)

    finish = engine.generate(request)

    def ban_favourite(row: np.ndarray) -> None:
        row[int(np.argmax(row))] = -np.inf

    expected = greedy(FakeBackend(), prompt, 6, ban_favourite)
    assert [list(result.tokens) for result in finish.candidates] == [expected] * 3


def test_verifier_plugin_replaces_the_builtin_and_output_stays_the_plain_one(
    install_plugins: InstalledPlugins, make_engine: MakeEngine
) -> None:
    engine = make_engine(install_plugins("refusing_verifier", "oracle_drafts"), speculate="on")
    request = GenerationRequest(REPETITIVE, SamplingParams(max_tokens=20))

    finish = engine.generate(request)

    assert install_plugins.module("refusing_verifier").verified, "no draft reached it"
    assert list(finish.candidates[0].tokens) == greedy(FakeBackend(), REPETITIVE, 20)
    assert finish.usage.draft_proposed
    assert set(finish.usage.draft_accepted.values()) == {0}


ANSWER = list(b"forty-two")


def answer_forced(
    install_plugins: InstalledPlugins, params: SamplingParams
) -> tuple[CandidateResult, int]:
    """The `forced_ending` plugin's answer to one request, and the model steps it took."""
    backend = FakeBackend()
    runtime = start_runtime(Settings(), backend=backend, plugins=install_plugins("forced_ending"))
    request = GenerationRequest([1, *b"Answer."], params, extensions={"answer": ANSWER})
    finish = runtime.engine.generate(request)
    runtime.close()
    return finish.candidates[0], len(backend.batch_sizes)


@pytest.mark.parametrize("logprobs", [None, 1])
def test_a_forced_ending_is_committed_without_computing_its_steps(
    install_plugins: InstalledPlugins, logprobs: int | None
) -> None:
    result, steps = answer_forced(install_plugins, SamplingParams(max_tokens=20, logprobs=logprobs))

    assert list(result.tokens) == ANSWER
    assert result.finish_reason == "stop"
    if logprobs is None:  # the prompt's pass picks the first token; the rest are forced
        assert steps == 1
    else:  # each token's logprob needs its row: every step is computed
        assert steps == len(ANSWER) + 1


def test_a_forced_ending_stops_where_max_tokens_does(install_plugins: InstalledPlugins) -> None:
    result, _ = answer_forced(install_plugins, SamplingParams(max_tokens=4))

    assert list(result.tokens) == ANSWER[:4]
    assert result.finish_reason == "length"


def test_a_request_that_ignores_the_end_computes_its_forced_ending(
    install_plugins: InstalledPlugins,
) -> None:
    result, steps = answer_forced(install_plugins, SamplingParams(max_tokens=12, ignore_eos=True))

    assert list(result.tokens[: len(ANSWER)]) == ANSWER
    assert len(result.tokens) == 12 and result.finish_reason == "length"
    assert steps == 12
