"""Fixtures of the hook contract suite: engines and the HTTP API over the fake backend, with
plugins discovered through entry points (`install_plugins`, in tests/conftest.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import TestClient

from reame_core.backend.fake import FakeBackend
from reame_core.engine.engine import Engine
from reame_core.plugins import PluginHost
from reame_core.runtime import start_runtime
from reame_core.server.app import create_app
from reame_core.server.service import ServerState
from reame_core.settings import Settings


@pytest.fixture
def make_engine() -> Iterator[Callable[..., Engine]]:
    """An `Engine` over a fresh `FakeBackend` with the given plugins; stopped after the test.
    Keyword arguments other than `speculate` and `start` go to `FakeBackend`; with
    ``start=False`` the test drives the engine with `engine.step()`."""
    engines: list[Engine] = []

    def make(
        plugins: PluginHost, *, speculate: str = "off", start: bool = True, **backend: Any
    ) -> Engine:
        engine = Engine(FakeBackend(**backend), plugins, speculate=speculate)  # type: ignore[arg-type]
        engines.append(engine.start() if start else engine)
        return engine

    yield make
    for engine in engines:
        engine.stop()


@pytest.fixture
def serve() -> Iterator[Callable[[PluginHost], TestClient[Litestar]]]:
    """The HTTP API over a fake backend with the given plugins; closed after the test."""
    with contextlib.ExitStack() as stack:

        def start(plugins: PluginHost) -> TestClient[Litestar]:
            settings = Settings()
            server = ServerState(settings, api_keys=settings.all_api_keys())
            client = stack.enter_context(TestClient(create_app(server)))
            server.runtime = start_runtime(settings, backend=FakeBackend(), plugins=plugins)
            stack.callback(server.runtime.close)
            return client

        yield start
