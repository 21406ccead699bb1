"""The memory hooks' contract: an answer its request alone fixes is remembered once it is
complete, and the same request is then answered from memory with the same output, without
a decode; a request whose answer is not fixed is neither remembered nor looked up."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from installed_plugins import InstalledPlugins

from reame_core.backend.fake import FakeBackend
from reame_core.engine.engine import Engine
from reame_core.plugins import PluginHost
from reame_core.request import GenerationRequest, SamplingParams

MakeEngine = Callable[..., Engine]
PROMPT = [1, *b"Remember this answer"]


def decodes(engine: Engine) -> int:
    assert isinstance(engine.backend, FakeBackend)
    return len(engine.backend.batch_sizes)


def asked(**params: Any) -> GenerationRequest:
    return GenerationRequest(PROMPT, SamplingParams(**{"max_tokens": 12, **params}))


@pytest.mark.parametrize(
    "params",
    [{}, {"temperature": 0.9, "seed": 5}, {"max_tokens": 3}],
    ids=["greedy", "seeded", "length"],
)
def test_a_repeated_request_is_answered_from_memory_with_the_same_output(
    install_plugins: InstalledPlugins, make_engine: MakeEngine, params: dict[str, Any]
) -> None:
    engine = make_engine(install_plugins("answer_memory"))
    first = engine.generate(asked(**params))
    before = decodes(engine)

    streamed: list[str] = []
    again = engine.generate(asked(**params), lambda event: streamed.append(event.text))

    assert decodes(engine) == before
    assert engine.stats.recalled_requests == 1
    assert again.candidates == first.candidates
    assert "".join(streamed) == first.candidates[0].text
    assert (
        again.usage.recalled_tokens
        == again.usage.completion_tokens
        == len(first.candidates[0].tokens)
    )
    assert again.usage.cached_tokens == again.usage.prompt_tokens == len(PROMPT)


@pytest.mark.parametrize(
    ("params", "n"),
    [({"temperature": 0.9}, 1), ({}, 2), ({"logprobs": 2}, 1)],
    ids=["unseeded", "n2", "logprobs"],
)
def test_an_answer_the_request_does_not_fix_is_never_remembered_nor_asked_for(
    install_plugins: InstalledPlugins, make_engine: MakeEngine, params: dict[str, Any], n: int
) -> None:
    engine = make_engine(install_plugins("answer_memory"))
    memory = install_plugins.module("answer_memory")
    request = GenerationRequest(PROMPT, SamplingParams(max_tokens=12, **params), n=n)

    engine.generate(request)
    engine.generate(request)

    assert memory.answers == {} and memory.asked == []


def test_another_max_tokens_or_model_configuration_is_another_answer(
    install_plugins: InstalledPlugins, make_engine: MakeEngine
) -> None:
    plugins = install_plugins("answer_memory")
    memory = install_plugins.module("answer_memory")
    engine = make_engine(plugins)
    engine.generate(asked())

    longer = engine.generate(asked(max_tokens=13))
    other_model = make_engine(plugins, name="another").generate(asked())

    assert longer.usage.recalled_tokens == 0
    assert other_model.usage.recalled_tokens == 0
    assert len(memory.answers) == 3


def test_without_the_deterministic_configuration_nothing_is_remembered(
    install_plugins: InstalledPlugins,
) -> None:
    memory_plugins = install_plugins("answer_memory")
    engine = Engine(FakeBackend(), memory_plugins, exact_reuse=False).start()
    try:
        engine.generate(asked())
        again = engine.generate(asked())
    finally:
        engine.stop()

    assert again.usage.recalled_tokens == 0
    assert install_plugins.module("answer_memory").answers == {}


def test_a_cancelled_request_is_not_remembered(
    install_plugins: InstalledPlugins, make_engine: MakeEngine
) -> None:
    engine = make_engine(install_plugins("answer_memory"), start=False)
    ticket = engine.submit(asked(max_tokens=50), lambda event: None)
    engine.step()
    ticket.cancel()
    for _ in range(5):
        engine.step()

    assert install_plugins.module("answer_memory").answers == {}


def test_a_memory_that_fails_costs_the_computation_only(make_engine: MakeEngine) -> None:
    class Broken:
        from reame_core.hookspecs import hookimpl

        @hookimpl
        def reame_recall_answer(self, key: str, model: Any) -> None:
            raise OSError("disk gone")

    plugins = PluginHost(discover=False)
    plugins.register(Broken(), "broken")
    engine = make_engine(plugins)

    result = engine.generate(asked())

    assert result.error is None and result.candidates[0].tokens
