"""The disk prefix cache on a sliding-window model (Gemma 3 270M, window 512): a stored
prefix is restored only when the prompt continues all of it, and then gives the cold
tokens; a prompt sharing only part of a stored prefix is computed cold, never trimmed."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from reame_core.backend.llama import LlamaBackend
from reame_core.engine.engine import Engine
from reame_core.plugins import PluginHost
from reame_core.request import FinishEvent, GenerationRequest, SamplingParams
from reame_core.settings import Settings
from reame_diskkv.plugin import DiskPrefixCache

pytestmark = pytest.mark.gemma

COLOURS = ("red", "green", "blue", "amber", "violet")
BLOCK = 256


@pytest.fixture(scope="module")
def inventory(gemma: LlamaBackend) -> list[int]:
    """A long base-model prompt: numbered lines well past the 512-token window."""
    lines = [f"Shelf {i}: the {COLOURS[i % 5]} box holds {i * 7 % 13} stones." for i in range(90)]
    tokens = gemma.tokenize("\n".join(lines), add_special=True, parse_special=False)
    assert len(tokens) > 900
    return tokens


@contextmanager
def cached_engine(backend: LlamaBackend, cache_dir: Path) -> Iterator[Engine]:
    """An engine with empty slots and a fresh diskkv plugin on `cache_dir`: a restarted
    server. Snapshots go at the last 256-token boundary of a prompt."""
    for seq_id in range(backend.info.n_seq_max):
        backend.seq_rm(seq_id, -1, -1)
    cache = DiskPrefixCache()
    host = PluginHost(discover=False)
    host.register(cache, "diskkv")
    section = {"dir": str(cache_dir), "block_tokens": BLOCK}
    host.hook.reame_configure(
        settings=Settings(plugins={"diskkv": section}), model=backend.info, hook=host.hook
    )
    engine = Engine(backend, host, speculate="off").start()  # bit-exact paths only
    try:
        yield engine
    finally:
        engine.stop()  # writes the queued snapshots


def greedy(engine: Engine, prompt: Sequence[int]) -> FinishEvent:
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    finished = engine.generate(GenerationRequest(list(prompt), params))
    assert finished.error is None, finished.error
    return finished


def test_stored_prefix_continued_whole_gives_the_cold_tokens(
    gemma: LlamaBackend, inventory: list[int], tmp_path: Path
) -> None:
    with cached_engine(gemma, tmp_path) as engine:
        greedy(engine, inventory[:800])  # stores its first 768 tokens
    prompt = inventory[:900]
    with cached_engine(gemma, tmp_path / "cold") as engine:
        cold = greedy(engine, prompt)

    with cached_engine(gemma, tmp_path) as engine:
        warm = greedy(engine, prompt)

    assert warm.usage.restored_tokens == 768
    assert warm.candidates[0].tokens == cold.candidates[0].tokens


def test_prompt_sharing_part_of_a_stored_prefix_is_computed_cold(
    gemma: LlamaBackend, inventory: list[int], tmp_path: Path
) -> None:
    with cached_engine(gemma, tmp_path) as engine:
        greedy(engine, inventory[:800])  # stores its first 768 tokens
    question = gemma.tokenize(
        "\nWhich shelves hold red boxes?", add_special=False, parse_special=False
    )
    prompt = [*inventory[:700], *question]
    with cached_engine(gemma, tmp_path / "cold") as engine:
        cold = greedy(engine, prompt)

    with cached_engine(gemma, tmp_path) as engine:
        warm = greedy(engine, prompt)

    assert warm.usage.cached_tokens == 0
    assert warm.candidates[0].tokens == cold.candidates[0].tokens
