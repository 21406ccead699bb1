"""The drafting hook's contract: a third-party source's drafts are verified in the engine's
steps, and the output is the one plain decoding gives."""

from __future__ import annotations

from collections.abc import Callable

from installed_plugins import InstalledPlugins

from reame_core.engine.engine import Engine
from reame_core.plugins import PluginHost
from reame_core.request import GenerationRequest, SamplingParams

MakeEngine = Callable[..., Engine]


def test_third_party_drafts_are_verified_and_the_right_ones_committed(
    install_plugins: InstalledPlugins, make_engine: MakeEngine
) -> None:
    def request() -> GenerationRequest:
        return GenerationRequest([1, *b"Once upon"], SamplingParams(max_tokens=40))

    plain_engine = make_engine(PluginHost(disabled=["prompt_lookup"], discover=False))
    plain = plain_engine.generate(request())
    engine = make_engine(install_plugins("oracle_drafts"), speculate="on")

    drafted = engine.generate(request())

    assert drafted.candidates[0].tokens == plain.candidates[0].tokens
    accepted = drafted.usage.draft_accepted["oracle_drafts"]
    assert 0 < accepted < drafted.usage.draft_proposed["oracle_drafts"]
    assert engine.stats.decode_steps < plain_engine.stats.decode_steps
