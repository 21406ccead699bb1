"""Prefix reuse on a sliding-window model (Gemma 3 270M, window 512): exact, or not attempted.

Its SWA layers keep only the last 512 positions, so a KV cut back to a shorter prefix gives
wrong logits although llama.cpp reports success. The engine may continue a slot's whole
KV but must never trim one: a prompt sharing only part of a resident KV is computed cold.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from reame_core.backend.base import Backend
from reame_core.backend.llama import LlamaBackend
from reame_core.engine.engine import Engine
from reame_core.request import FinishEvent, GenerationRequest, SamplingParams

pytestmark = pytest.mark.gemma

Forget = Callable[[Engine], None]

COLOURS = ("red", "green", "blue", "amber", "violet")


@pytest.fixture
def engine(gemma: LlamaBackend, make_engine: Callable[[Backend], Engine]) -> Engine:
    return make_engine(gemma)


@pytest.fixture(scope="module")
def inventory(gemma: LlamaBackend) -> list[int]:
    """A long base-model prompt: numbered lines past the 512-token window."""
    lines = [f"Shelf {i}: the {COLOURS[i % 5]} box holds {i * 7 % 13} stones." for i in range(90)]
    tokens = gemma.tokenize("\n".join(lines), add_special=True, parse_special=False)
    assert len(tokens) > 700
    return tokens


def words(backend: Backend, text: str) -> list[int]:
    return backend.tokenize(text, add_special=False, parse_special=False)


def greedy(engine: Engine, prompt: Sequence[int], max_tokens: int = 16) -> FinishEvent:
    finished = engine.generate(GenerationRequest(list(prompt), SamplingParams(max_tokens)))
    assert finished.error is None, finished.error
    return finished


def test_sliding_window_model_is_reported_unsafe_to_trim(gemma: LlamaBackend) -> None:
    assert gemma.info.extra["n_swa"] == 512
    assert gemma.info.prefix_trim_safe is False


def test_prompt_sharing_part_of_a_resident_kv_is_computed_cold(
    engine: Engine, gemma: LlamaBackend, inventory: list[int], forget_kv: Forget
) -> None:
    prompt_a = inventory[:700]
    prompt_b = [*inventory[:600], *words(gemma, "\nQuestion: which shelves hold red boxes?")]
    greedy(engine, prompt_a)

    warm = greedy(engine, prompt_b)
    forget_kv(engine)
    cold = greedy(engine, prompt_b)

    assert warm.usage.cached_tokens == 0
    assert warm.candidates[0].tokens == cold.candidates[0].tokens


def test_prompt_extending_a_whole_resident_prompt_continues_it_with_the_cold_tokens(
    engine: Engine, gemma: LlamaBackend, inventory: list[int], forget_kv: Forget
) -> None:
    # A length on the chunk grid: a sliding-window state is continued only from its full
    # length, and only a length on the grid is reused where reuse must be exact.
    prompt_a = inventory[:704]
    assert len(prompt_a) % gemma.info.chunk_grid == 0
    # One token generated: the slot's KV then holds exactly A's prompt, computed as chunks.
    greedy(engine, prompt_a, max_tokens=1)
    prompt_c = [*prompt_a, *words(gemma, "\nShelf 99: the")]

    warm = greedy(engine, prompt_c)
    forget_kv(engine)
    cold = greedy(engine, prompt_c)

    assert warm.usage.cached_tokens == len(prompt_a)
    assert cold.usage.cached_tokens == 0
    assert warm.candidates[0].tokens == cold.candidates[0].tokens


def test_a_whole_resident_prompt_off_the_grid_is_not_continued(
    engine: Engine, gemma: LlamaBackend, inventory: list[int]
) -> None:
    # Continuing it would compute the new tokens in chunks a cold prefill does not make.
    prompt_a = inventory[:700]
    assert len(prompt_a) % gemma.info.chunk_grid != 0
    greedy(engine, prompt_a, max_tokens=1)

    warm = greedy(engine, [*prompt_a, *words(gemma, "\nShelf 99: the")])

    assert warm.usage.cached_tokens == 0


def test_generated_tokens_of_a_sliding_window_model_are_not_reused(
    engine: Engine, gemma: LlamaBackend, inventory: list[int], forget_kv: Forget
) -> None:
    # Generated tokens' KV came from single-token decodes, which a cold prefill computes
    # otherwise, and a sliding-window state cannot be cut back to the prompt: no reuse.
    prompt_a = inventory[:700]
    output_a = greedy(engine, prompt_a).candidates[0].tokens
    prompt_c = [*prompt_a, *output_a, *words(gemma, "\nShelf 99: the")]

    warm = greedy(engine, prompt_c)
    forget_kv(engine)
    cold = greedy(engine, prompt_c)

    assert warm.usage.cached_tokens == 0
    assert warm.candidates[0].tokens == cold.candidates[0].tokens
