"""The drafting hooks' contract: a third-party source's drafts are verified in the engine's
steps, and the output is the one plain decoding gives; a source that gives its cost before
its first call is priced with it."""

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


def test_a_source_that_says_its_calls_cost_more_than_drafts_save_is_never_asked(
    install_plugins: InstalledPlugins, make_engine: MakeEngine
) -> None:
    def calls(seconds: float) -> int:
        plugins = install_plugins("priced_drafts")
        source = install_plugins.module("priced_drafts")
        source.SECONDS = seconds  # read when the engine starts
        engine = make_engine(plugins, speculate="auto")  # the governor decides
        engine.generate(GenerationRequest([1, *b"Once upon"], SamplingParams(max_tokens=40)))
        return int(source.calls)

    assert calls(60.0) == 0  # a minute a call: not even once to look
    assert calls(0.0) > 0  # free: asked every step
