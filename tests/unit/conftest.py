"""Fixtures shared by the unit tests: engines over the fake backend and a reference model loop.

Nothing here needs a real model. `FakeBackend.logits_after` is the fake model itself, so a
plain argmax loop over it is the ground truth any greedy engine output must equal.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest
from litestar import Litestar
from litestar.testing import TestClient

from reame_core.backend.fake import FakeBackend
from reame_core.engine.engine import Engine
from reame_core.engine.governor import Mode
from reame_core.plugins import PluginHost
from reame_core.runtime import start_runtime
from reame_core.server.app import create_app
from reame_core.server.service import ServerState
from reame_core.settings import Settings


@pytest.fixture
def make_engine() -> Iterator[Callable[..., Engine]]:
    """Build an `Engine` over a fresh `FakeBackend`; its thread is stopped after the test.

    Keyword arguments other than `plugins`, `prefill_chunk`, `draft_max`, `speculate`,
    `sessions_first` and `start` go to `FakeBackend`. With ``start=False`` the caller drives
    the engine with `engine.step()`.
    """
    engines: list[Engine] = []

    def make(
        *,
        plugins: PluginHost | None = None,
        prefill_chunk: int = 128,
        draft_max: int = 8,
        speculate: Mode = "auto",
        sessions_first: bool = True,
        start: bool = True,
        **backend_options: Any,
    ) -> Engine:
        backend = FakeBackend(**backend_options)
        engine = Engine(
            backend,
            plugins,
            prefill_chunk=prefill_chunk,
            draft_max=draft_max,
            speculate=speculate,
            sessions_first=sessions_first,
        )
        engines.append(engine)
        return engine.start() if start else engine

    yield make
    for engine in engines:
        engine.stop()


@pytest.fixture
def tokenize() -> Callable[[str], list[int]]:
    """Text to prompt tokens (BOS first), as the fake backend tokenizes it."""
    backend = FakeBackend()

    def tokenize(text: str) -> list[int]:
        return backend.tokenize(text, add_special=True, parse_special=False)

    return tokenize


@pytest.fixture
def greedy_reference() -> Callable[[FakeBackend, Sequence[int], int], list[int]]:
    """The greedy continuation of `prompt`, computed straight from the fake model."""

    def reference(backend: FakeBackend, prompt: Sequence[int], max_tokens: int) -> list[int]:
        output: list[int] = []
        while len(output) < max_tokens:
            token = int(np.argmax(backend.logits_after([*prompt, *output])))
            if token in backend.info.eog:
                break
            output.append(token)
        return output

    return reference


@pytest.fixture
def drive() -> Callable[[Engine], None]:
    """Step an engine that was not started until every submitted request is over."""

    def drive(engine: Engine, max_steps: int = 100_000) -> None:
        for _ in range(max_steps):
            if not engine.step() and not engine.busy:
                return
        raise AssertionError(f"engine still busy after {max_steps} steps")

    return drive


@pytest.fixture
def plugins() -> PluginHost:
    """The built-in plugins only (installed ones are not discovered), fresh for each test."""
    return PluginHost(discover=False)


@pytest.fixture
def serve(plugins: PluginHost) -> Iterator[Callable[..., TestClient[Litestar]]]:
    """Start the HTTP API over a fake backend with the model loaded; closed after the test."""
    with contextlib.ExitStack() as stack:

        def start(
            settings: Settings | None = None, backend: FakeBackend | None = None
        ) -> TestClient[Litestar]:
            settings = settings or Settings()
            server = ServerState(settings, api_keys=settings.all_api_keys())
            client = stack.enter_context(TestClient(create_app(server)))
            server.runtime = start_runtime(
                settings, backend=backend or FakeBackend(), plugins=plugins
            )
            stack.callback(server.runtime.close)
            return client

        yield start


@pytest.fixture
def client(serve: Callable[..., TestClient[Litestar]]) -> TestClient[Litestar]:
    return serve()
