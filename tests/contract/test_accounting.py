"""The accounting hooks' contract: what plugins hear of commits and verified drafts is exactly
what the request returns and counts."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from installed_plugins import InstalledPlugins

from reame_core.engine.engine import Engine
from reame_core.request import GenerationRequest, SamplingParams

MakeEngine = Callable[..., Engine]
REPETITIVE = [1, *b"one two three one two three one two three one two"]


@pytest.mark.parametrize(
    ("speculate", "n", "temperature"),
    [("off", 1, 0.0), ("on", 1, 0.0), ("on", 1, 0.8), ("off", 3, 0.8), ("on", 3, 0.8)],
    ids=["plain", "drafts", "drafts-sampled", "n3", "n3-drafts"],
)
def test_committed_tokens_are_exactly_the_returned_tokens(
    install_plugins: InstalledPlugins,
    make_engine: MakeEngine,
    speculate: str,
    n: int,
    temperature: float,
) -> None:
    engine = make_engine(
        install_plugins("committed_tokens", "oracle_drafts"), speculate=speculate, eos_every=16
    )
    params = SamplingParams(max_tokens=30, temperature=temperature, seed=11)
    request = GenerationRequest(REPETITIVE, params, n=n)

    finish = engine.generate(request)

    committed = install_plugins.module("committed_tokens").committed
    returned = {(request.request_id, r.candidate): list(r.tokens) for r in finish.candidates}
    assert committed == {key: tokens for key, tokens in returned.items() if tokens}
    if speculate == "on":
        assert finish.usage.draft_proposed, "no drafts were verified"


def test_verified_drafts_add_up_to_the_usage_counters(
    install_plugins: InstalledPlugins, make_engine: MakeEngine
) -> None:
    engine = make_engine(install_plugins("verified_drafts", "oracle_drafts"), speculate="on")
    request = GenerationRequest(REPETITIVE, SamplingParams(max_tokens=40, ignore_eos=True), n=2)

    finish = engine.generate(request)

    plugin = install_plugins.module("verified_drafts")
    assert sum(finish.usage.draft_accepted.values()) > 0
    assert plugin.proposed_tokens == finish.usage.draft_proposed
    assert plugin.accepted_tokens == finish.usage.draft_accepted
