"""The prefill hooks' contract: snapshots taken where a plugin asks are restored by another
engine instead of being computed, and the output does not change; an engine behind a
prefix another is computing and has promised waits for it rather than computing it too."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from installed_plugins import InstalledPlugins

from reame_core.backend.fake import FakeBackend
from reame_core.engine.engine import Engine
from reame_core.plugins import PluginHost
from reame_core.request import Event, FinishEvent, GenerationRequest, SamplingParams

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


# ----------------------------------------------------------------- promises

LONG_PROMPT = [1, *b"A long system prompt that two engines are given at once, then a question?"]
PARAMS = SamplingParams(max_tokens=6)


class Stepped:
    """Engines driven step by step by the test, sharing one plugin host as processes share
    a store; prompt chunks of 8 tokens, so a prompt takes several steps and a promise is
    seen live."""

    def __init__(self, plugins: PluginHost) -> None:
        self.plugins = plugins
        self.engines: list[Engine] = []

    def engine(self) -> Engine:
        engine = Engine(FakeBackend(), self.plugins, prefill_chunk=8, speculate="off")
        self.engines.append(engine)
        return engine

    def until_finished(self, *heard: list[Event]) -> list[FinishEvent]:
        """Step every engine until each list has heard its request finish."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            finished = [next((e for e in h if isinstance(e, FinishEvent)), None) for h in heard]
            if all(finished):
                return finished  # type: ignore[return-value]
            for engine in self.engines:
                engine.step()
        raise AssertionError("the requests did not finish")


@pytest.fixture
def stepped(install_plugins: InstalledPlugins) -> Iterator[Stepped]:
    engines = Stepped(install_plugins("prefix_promises"))
    yield engines
    for engine in engines.engines:
        engine.stop()


def test_an_engine_waits_for_the_prefix_another_promised_and_restores_it(
    stepped: Stepped, install_plugins: InstalledPlugins
) -> None:
    store = install_plugins.module("prefix_promises")
    first, second = stepped.engine(), stepped.engine()
    point = len(LONG_PROMPT) // 2
    heard: list[Event] = []
    waited: list[Event] = []

    first.submit(GenerationRequest(LONG_PROMPT, PARAMS), heard.append)
    first.step()  # the first chunk: the prefix is promised, not stored yet
    assert store.promised == {tuple(LONG_PROMPT[:point])}
    second.submit(GenerationRequest(LONG_PROMPT, PARAMS), waited.append)
    for _ in range(3):
        second.step()
    assert second.stats.prefill_tokens == 0  # it waits
    alone, restored = stepped.until_finished(heard, waited)

    assert restored.usage.restored_tokens == point
    assert second.stats.prefill_tokens == len(LONG_PROMPT) - point
    stats = second.stats
    assert stats.prefill_tokens + stats.reused_tokens + stats.restored_tokens == len(LONG_PROMPT)
    assert second.stats.prefix_waits == 1
    assert restored.candidates[0].tokens == alone.candidates[0].tokens
    assert store.promised == set()
    assert store.computing[0] == (point,)


def test_a_withdrawn_promise_ends_the_wait_and_the_prefix_is_computed(
    stepped: Stepped, install_plugins: InstalledPlugins
) -> None:
    store = install_plugins.module("prefix_promises")
    first, second = stepped.engine(), stepped.engine()
    waited: list[Event] = []

    ticket = first.submit(GenerationRequest(LONG_PROMPT, PARAMS), lambda event: None)
    first.step()
    second.submit(GenerationRequest(LONG_PROMPT, PARAMS), waited.append)
    second.step()
    ticket.cancel()  # the first ends before it stores: it withdraws its promise
    first.step()
    assert store.computing[-1] == ()  # withdrawn
    (alone,) = stepped.until_finished(waited)
    # It computed as soon as the promise was withdrawn, not at the end of its patience.
    assert second.stats.prefix_wait_seconds < 1.0  # its patience: MAX_PREFIX_WAIT_S

    assert alone.usage.restored_tokens == 0
    assert second.stats.prefill_tokens == len(LONG_PROMPT)
    assert alone.candidates[0].tokens
    assert store.stored == {}


def measured(engine: Engine) -> float:
    """The engine's seconds per prompt token, once it has computed `PROMPT` (its first)."""
    heard: list[Event] = []
    engine.submit(GenerationRequest(PROMPT, SamplingParams(max_tokens=2)), heard.append)
    while not any(isinstance(event, FinishEvent) for event in heard):
        engine.step()
    return engine.stats.prefill_seconds / engine.stats.prefill_tokens


def test_a_promise_never_kept_is_waited_for_about_as_long_as_computing_would_take(
    install_plugins: InstalledPlugins,
) -> None:
    plugins = install_plugins("prefix_promises")
    store = install_plugins.module("prefix_promises")
    engine = Engine(FakeBackend(token_cost_s=0.002), plugins, prefill_chunk=8, speculate="off")
    per_token = measured(engine)
    store.promised.add(tuple(LONG_PROMPT[:30]))  # promised by a process that never stores it
    heard: list[Event] = []
    computed = engine.stats.prefill_tokens

    engine.submit(GenerationRequest(LONG_PROMPT, SamplingParams(max_tokens=4)), heard.append)
    engine.step()
    assert engine.stats.prefill_tokens == computed
    while not any(isinstance(event, FinishEvent) for event in heard):
        engine.step()
    engine.stop()

    # The engine waits for the promised tokens beyond those its slot held (the beginning
    # the two prompts share) as long as they take at the rate it has measured.
    (alone,) = [event for event in heard if isinstance(event, FinishEvent)]
    held = alone.usage.cached_tokens
    assert 0.9 <= engine.stats.prefix_wait_seconds / ((30 - held) * per_token) < 3
    assert engine.stats.prefill_tokens == computed + len(LONG_PROMPT) - held


def test_before_its_first_prompt_an_engine_waits_as_long_as_the_promise_stands(
    stepped: Stepped, install_plugins: InstalledPlugins
) -> None:
    """It knows no rate of its own yet: a rate assumed was wrong tenfold between hosts."""
    store = install_plugins.module("prefix_promises")
    store.promised.add(tuple(LONG_PROMPT[:30]))  # another process computes it, slowly
    engine = stepped.engine()
    heard: list[Event] = []

    engine.submit(GenerationRequest(LONG_PROMPT, SamplingParams(max_tokens=4)), heard.append)
    waited_from = time.perf_counter()
    while time.perf_counter() - waited_from < 0.5:
        engine.step()
        time.sleep(0.01)
    assert engine.stats.prefill_tokens == 0  # still waiting
    store.promised.clear()  # the other process stored nothing after all
    (alone,) = stepped.until_finished(heard)

    # Longer than the 30 tokens would take even at a few hundred tokens a second.
    assert engine.stats.prefix_wait_seconds >= 0.5
    assert alone.usage.restored_tokens == 0
    assert engine.stats.prefill_tokens == len(LONG_PROMPT)


def test_a_running_engine_waits_for_a_promise_without_spinning(
    install_plugins: InstalledPlugins,
) -> None:
    plugins = install_plugins("prefix_promises")
    store = install_plugins.module("prefix_promises")
    engine = Engine(FakeBackend(token_cost_s=0.005), plugins, speculate="off")
    per_token = measured(engine)
    store.promised.add(tuple(LONG_PROMPT[:60]))  # never kept: a wait of about 0.3 s
    engine.start()
    try:
        cpu, wall = time.process_time(), time.perf_counter()
        finished = engine.generate(GenerationRequest(LONG_PROMPT, SamplingParams(max_tokens=4)))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        engine.stop()

    assert engine.stats.prefix_waits == 1 and finished.candidates[0].tokens
    assert wall >= 60 * per_token * 0.9
    assert cpu < wall / 3  # it looked again now and then, it did not spin
