"""The app over a fake backend, served by real uvicorn on a loopback port: for tests that
need what only an HTTP server does (framing, timeouts, many connections at once)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from reame_core.backend.fake import FakeBackend
from reame_core.plugins import PluginHost
from reame_core.runtime import start_runtime
from reame_core.server.app import create_app
from reame_core.server.service import ServerState
from reame_core.settings import Settings


@contextmanager
def serve_on_loopback(
    settings: Settings | None = None,
    *,
    backend: FakeBackend | None = None,
    plugins: PluginHost | None = None,
) -> Iterator[tuple[str, ServerState]]:
    """Yield the server's URL and state; uvicorn stops at the end, and its shutdown closes
    the runtime."""
    settings = settings or Settings()
    state = ServerState(settings, api_keys=settings.all_api_keys())
    app = create_app(state)
    state.runtime = start_runtime(
        settings,
        backend=backend or FakeBackend(),
        plugins=plugins or PluginHost(discover=False),
    )
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, access_log=False)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", state
    finally:
        server.should_exit = True
        thread.join(timeout=30)
