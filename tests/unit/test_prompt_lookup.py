"""Prompt lookup, the built-in draft source that copies what followed the sequence's latest
n-gram earlier on: its index, its settings, and its drafts through the engine.

The fake model's greedy output depends on its last three tokens only, so it soon repeats
itself: prompt lookup finds the repetition and its drafts get accepted.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from reame_core.backend.fake import FakeBackend
from reame_core.builtins.prompt_lookup import NAME, NgramIndex, PromptLookup
from reame_core.engine.engine import Engine
from reame_core.hooktypes import DraftRequest
from reame_core.plugins import PluginHost
from reame_core.request import GenerationRequest, SamplingParams
from reame_core.settings import Settings

MakeEngine = Callable[..., Engine]
Reference = Callable[[FakeBackend, Sequence[int], int], list[int]]
Tokenize = Callable[[str], list[int]]

PROMPT = "The cat sat on"  # greedy: " c prljtrt c prljtrt c prljtrt..."


def index_of(tokens: Sequence[int], ngram_min: int = 2, ngram_max: int = 4) -> NgramIndex:
    index = NgramIndex(ngram_min, ngram_max)
    index.extend(tokens)
    return index


def request(prompt: Sequence[int], **params: Any) -> GenerationRequest:
    return GenerationRequest(list(prompt), SamplingParams(**params))


def fake(engine: Engine) -> FakeBackend:
    assert isinstance(engine.backend, FakeBackend)
    return engine.backend


def prompt_lookup_of(host: PluginHost) -> PromptLookup:
    plugin = host.manager.get_plugin(NAME)
    assert isinstance(plugin, PromptLookup)
    return plugin


@dataclass
class View:
    """A sequence as a draft source sees it."""

    prompt_tokens: list[int]
    output_tokens: list[int] = field(default_factory=list)
    key: int = field(default_factory=itertools.count().__next__)


# ------------------------------------------------------------------------ the index


def test_proposes_what_followed_the_latest_earlier_occurrence() -> None:
    index = index_of([1, 2, 7, 1, 2, 8, 1, 2])

    assert index.propose(2) == (8, 1)


def test_longer_ngram_match_wins_over_a_later_shorter_one() -> None:
    # (5, 1, 2) was followed by 7; the later (1, 2) by 8.
    index = index_of([5, 1, 2, 7, 9, 1, 2, 8, 5, 1, 2])

    assert index.propose(1) == (7,)


def test_no_earlier_occurrence_proposes_nothing() -> None:
    assert index_of([1, 2, 3, 4, 5]).propose(4) == ()


def test_ngram_shorter_than_ngram_min_does_not_match() -> None:
    assert index_of([1, 2, 7, 9, 2], ngram_min=2).propose(2) == ()
    assert index_of([1, 2, 7, 9, 2], ngram_min=1).propose(2) == (7, 9)


def test_repetition_running_into_the_present_continues_periodically() -> None:
    index = index_of([7, 1, 2, 3, 1, 2, 3])

    assert index.propose(8) == (1, 2, 3, 1, 2, 3, 1, 2)


def test_proposal_is_at_most_max_tokens_long() -> None:
    index = index_of([1, 2, 3, 4, 5, 6, 1, 2])

    assert index.propose(3) == (3, 4, 5)


def test_extending_token_by_token_proposes_as_building_from_scratch() -> None:
    tokens = [int(t) for t in np.random.default_rng(1).integers(0, 4, 200)]
    incremental = NgramIndex(2, 4)

    for end in range(1, len(tokens) + 1):
        incremental.extend(tokens[end - 1 : end])

        assert incremental.propose(6) == index_of(tokens[:end]).propose(6), end


def test_extending_in_chunks_proposes_as_building_from_scratch() -> None:
    tokens = [int(t) for t in np.random.default_rng(2).integers(0, 4, 200)]
    incremental = NgramIndex(2, 4)

    for start in range(0, len(tokens), 7):
        incremental.extend(tokens[start : start + 7])

        assert incremental.propose(6) == index_of(tokens[: start + 7]).propose(6), start


# ---------------------------------------------------------------------- its settings


def configure(section: dict[str, Any]) -> PromptLookup:
    plugin = PromptLookup()
    plugin.reame_configure(Settings(plugins={NAME: section}), FakeBackend().info)
    return plugin


def test_configured_ngram_range_decides_what_matches() -> None:
    view = View([1, 2, 9, 1, 2])
    any_width = configure({"match_bytes_min": 0})
    only_trigrams = configure({"ngram_min": 3, "ngram_max": 3, "match_bytes_min": 0})

    assert [p.tokens for p in any_width.reame_propose_drafts([DraftRequest(view, 2)])] == [(9, 1)]
    assert only_trigrams.reame_propose_drafts([DraftRequest(view, 2)]) == []


def test_a_match_of_the_fewest_tokens_must_span_enough_text() -> None:
    # The fake model's tokens are one byte each: a match of two spans too little text to
    # trust by default; one of three is evidence enough however short.
    default = configure({})
    pair = View([1, 2, 9, 1, 2])
    triple = View([1, 2, 3, 9, 1, 2, 3])
    wide_enough = configure({"match_bytes_min": 2})

    def drafts(plugin: PromptLookup, view: View) -> list[tuple[int, ...]]:
        return [p.tokens for p in plugin.reame_propose_drafts([DraftRequest(view, 2)])]

    assert drafts(default, pair) == []
    assert drafts(default, triple) == [(9, 1)]
    assert drafts(wide_enough, pair) == [(9, 1)]


def test_ngram_min_above_ngram_max_is_refused() -> None:
    with pytest.raises(ValidationError, match="ngram_min"):
        configure({"ngram_min": 5, "ngram_max": 3})


def test_unknown_prompt_lookup_setting_is_refused() -> None:
    with pytest.raises(ValidationError, match="ngram_mn"):
        configure({"ngram_mn": 2})


# -------------------------------------------------------------- through the engine


def test_greedy_output_with_prompt_lookup_equals_output_without(
    make_engine: MakeEngine, tokenize: Tokenize, greedy_reference: Reference
) -> None:
    engine = make_engine(speculate="on", plugins=PluginHost(discover=False))
    prompt = tokenize(PROMPT)

    result = engine.generate(request(prompt, max_tokens=60))

    assert list(result.candidates[0].tokens) == greedy_reference(fake(engine), prompt, 60)
    assert result.usage.draft_accepted[NAME] > 0


def test_index_of_a_sequence_is_dropped_when_it_ends(
    make_engine: MakeEngine, tokenize: Tokenize
) -> None:
    host = PluginHost(discover=False)
    engine = make_engine(speculate="on", plugins=host)
    lookup = prompt_lookup_of(host)
    seen: list[int] = []
    prompt = tokenize(PROMPT)

    engine.generate(request(prompt, max_tokens=30), lambda event: seen.append(len(lookup._indexes)))

    assert max(seen) == 1
    assert len(lookup._indexes) == 0


def test_index_of_a_cancelled_sequence_is_dropped(
    make_engine: MakeEngine, tokenize: Tokenize
) -> None:
    host = PluginHost(discover=False)
    engine = make_engine(speculate="on", plugins=host, start=False)
    lookup = prompt_lookup_of(host)
    ticket = engine.submit(request(tokenize(PROMPT), max_tokens=200), lambda event: None)
    for _ in range(5):
        engine.step()
    indexed = len(lookup._indexes)

    ticket.cancel()
    engine.step()

    assert indexed == 1
    assert len(lookup._indexes) == 0
    assert not engine.busy
