"""The prefill hooks' contract: snapshots taken where a plugin asks are restored by another
engine instead of being computed, and the output does not change."""

from __future__ import annotations

from collections.abc import Callable

from installed_plugins import InstalledPlugins

from reame_core.engine.engine import Engine
from reame_core.request import GenerationRequest, SamplingParams

MakeEngine = Callable[..., Engine]
PROMPT = [1, *b"A system prompt, then a question about it?"]


def test_snapshot_stored_at_the_plugins_point_is_restored_by_another_engine(
    install_plugins: InstalledPlugins, make_engine: MakeEngine
) -> None:
    plugins = install_plugins("prefix_memory")
    params = SamplingParams(max_tokens=12)

    first = make_engine(plugins).generate(GenerationRequest(PROMPT, params))
    second = make_engine(plugins).generate(GenerationRequest(PROMPT, params))

    stored = install_plugins.module("prefix_memory").stored
    assert list(stored) == [tuple(PROMPT[: len(PROMPT) // 2])]
    assert first.usage.restored_tokens == 0
    assert second.usage.restored_tokens == len(PROMPT) // 2
    assert second.candidates[0].tokens == first.candidates[0].tokens
