"""Decoding on cores shared with busy neighbours, on the real SmolLM2-135M.

The engine changes llama.cpp's thread count while it runs (`CpuShare`); that must never
change a token, and a real busy process on the same cores must make it drop a thread.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from reame_core.backend.base import Backend
from reame_core.backend.llama import LlamaBackend
from reame_core.engine.cpu_share import UP_AT, neighbour_cores, read_cpu_times
from reame_core.engine.engine import Engine
from reame_core.request import GenerationRequest, SamplingParams

pytestmark = pytest.mark.model

PROMPT = "The history of the lighthouse keepers of the northern coast begins"


class Alternating:
    """Stands in for CpuShare: a new thread count at every step, 2, 1, 2, 1, ..."""

    active = True
    others = 0.0

    def __init__(self) -> None:
        self.threads = 2
        self.changes = 0

    def pause(self) -> None:
        pass

    def resume(self) -> None:
        pass

    def update(self) -> int:
        self.threads = 3 - self.threads
        self.changes += 1
        return self.threads


def greedy(engine: Engine, backend: Backend, tokens: int = 48) -> list[int]:
    prompt = backend.tokenize(PROMPT, add_special=True, parse_special=False)
    result = engine.generate(
        GenerationRequest(prompt, SamplingParams(max_tokens=tokens, ignore_eos=True))
    )
    assert result.error is None
    return result.candidates[0].tokens


def test_changing_the_thread_count_every_step_gives_the_plain_tokens(
    backend: LlamaBackend,
    make_engine: Callable[..., Engine],
    forget_kv: Callable[[Engine], None],
) -> None:
    plain = greedy(make_engine(backend, adapt_threads=False), backend)
    flipping = Alternating()
    assert greedy(make_engine(backend, cpu_share=flipping), backend) == plain
    assert flipping.changes >= 48


def test_one_thread_gives_the_two_thread_tokens(
    backend: LlamaBackend, make_engine: Callable[..., Engine]
) -> None:
    plain = greedy(make_engine(backend, adapt_threads=False), backend)
    backend.set_threads(1)
    try:
        assert greedy(make_engine(backend, adapt_threads=False), backend) == plain
    finally:
        backend.set_threads(2)


def neighbours_now(seconds: float = 1.0) -> float:
    """Cores' worth of CPU other processes take right now."""
    before = read_cpu_times()
    time.sleep(seconds)
    after = read_cpu_times()
    assert before is not None and after is not None
    return neighbour_cores(before, after)


@pytest.fixture
def busy_neighbour() -> Iterator[subprocess.Popen[bytes]]:
    """A CPU-bound process in a session of its own, as an unrelated service would be."""
    others = neighbours_now()
    if others > UP_AT:
        pytest.skip(f"the host is busy already ({others:.2f} cores taken by other processes)")
    process = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    yield process
    process.kill()
    process.wait()


def test_a_busy_neighbour_makes_the_engine_drop_a_thread_and_its_leaving_brings_it_back(
    backend: LlamaBackend,
    make_engine: Callable[..., Engine],
    busy_neighbour: subprocess.Popen[bytes],
) -> None:
    engine = make_engine(backend)
    share = engine.cpu_share
    assert share is not None and share.active
    prompt = backend.tokenize(PROMPT, add_special=True, parse_special=False)

    def generate_until(done: Callable[[], bool], seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not done() and time.monotonic() < deadline:
            engine.generate(
                GenerationRequest(prompt, SamplingParams(max_tokens=32, ignore_eos=True))
            )

    generate_until(lambda: share.threads == 1, 20)
    assert share.threads == 1, f"neighbours measured at {share.others:.2f} cores"
    busy_neighbour.kill()
    busy_neighbour.wait()
    generate_until(lambda: share.threads == 2, 20)
    assert share.threads == 2, f"neighbours measured at {share.others:.2f} cores"
