"""Fixtures of the Conclave's tests: engines and the HTTP API over the fake backend, each
with a fresh plugin instance and a `Witness`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conclave_testing import Voting, Witness
from litestar import Litestar
from litestar.testing import TestClient

from reame_conclave.plugin import Conclave
from reame_core.backend.fake import FakeBackend
from reame_core.engine.engine import Engine
from reame_core.plugins import PluginHost
from reame_core.runtime import start_runtime
from reame_core.server.app import create_app
from reame_core.server.service import ServerState
from reame_core.settings import Settings


@pytest.fixture
def voting() -> Iterator[Callable[..., Voting]]:
    """An engine over a `FakeBackend` (keyword arguments) with a fresh Conclave, configured
    with `section`, and a `Witness`; stopped after the test."""
    engines: list[Engine] = []

    def make(section: dict[str, Any] | None = None, **backend: Any) -> Voting:
        fake = FakeBackend(**backend)
        conclave, witness = Conclave(), Witness()
        host = PluginHost(discover=False)
        host.register(conclave, "conclave")
        host.register(witness, "witness")
        settings = Settings(plugins={"conclave": section or {}})
        host.hook.reame_configure(settings=settings, model=fake.info, hook=host.hook)
        engine = Engine(fake, host, speculate="off").start()
        engines.append(engine)
        return Voting(engine, conclave, witness, fake)

    yield make
    for engine in engines:
        engine.stop()


@pytest.fixture
def serve() -> Iterator[Callable[[], TestClient[Litestar]]]:
    """The HTTP API over a fake backend with the Conclave and a Witness."""
    with contextlib.ExitStack() as stack:

        def start() -> TestClient[Litestar]:
            host = PluginHost(discover=False)
            host.register(Conclave(), "conclave")
            host.register(Witness(), "witness")
            settings = Settings()
            server = ServerState(settings)
            client = stack.enter_context(TestClient(create_app(server)))
            server.runtime = start_runtime(settings, backend=FakeBackend(), plugins=host)
            stack.callback(server.runtime.close)
            return client

        yield start
