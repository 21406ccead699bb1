"""Fixtures of Il Suggeritore's tests: engines over the fake backend with a fresh plugin."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from reame_core.backend.fake import FakeBackend
from reame_core.engine.engine import Engine
from reame_core.engine.governor import Mode
from reame_core.plugins import PluginHost
from reame_core.settings import Settings
from reame_suggeritore.plugin import Suggeritore

StartEngine = Callable[..., Engine]


@pytest.fixture
def start_engine() -> Iterator[StartEngine]:
    """An engine over a fresh `FakeBackend` with a fresh `Suggeritore` (and the built-in
    plugins), configured as a runtime would; `extra` plugins are registered by name. Stopped
    after the test."""
    engines: list[Engine] = []

    def start(
        *,
        speculate: Mode = "on",
        draft_max: int = 8,
        extra: dict[str, object] | None = None,
        started: bool = True,
        **backend_options: Any,
    ) -> Engine:
        backend = FakeBackend(**backend_options)
        host = PluginHost(discover=False)
        host.register(Suggeritore(), "suggeritore")
        for name, plugin in (extra or {}).items():
            host.register(plugin, name)
        host.hook.reame_configure(settings=Settings(), model=backend.info, hook=host.hook)
        engine = Engine(backend, host, speculate=speculate, draft_max=draft_max)
        engines.append(engine)
        return engine.start() if started else engine

    yield start
    for engine in engines:
        engine.stop()
