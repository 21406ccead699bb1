"""The HTTP API while requests are in flight: clients that hang up, a full queue, and
requests that must never wedge the engine.

Litestar's test client reads a stream only once it has ended and never hangs up, so these
tests call the ASGI application directly, as a server would, on a slow fake backend.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from litestar import Litestar

from reame_core.backend.fake import FakeBackend
from reame_core.plugins import PluginHost
from reame_core.runtime import Runtime, start_runtime
from reame_core.server.app import create_app
from reame_core.server.service import ServerState
from reame_core.settings import Settings

CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"
# Long enough to take seconds on the slow backend unless it is cancelled.
ENDLESS = {
    "messages": [{"role": "user", "content": "Tell me about the sea."}],
    "max_tokens": 500,
    "ignore_eos": True,
    "stream": True,
}
SHORT = {"prompt": "Once upon a time", "max_tokens": 3, "temperature": 0}


@pytest.fixture
def serve(plugins: PluginHost) -> Iterator[Callable[..., tuple[Litestar, ServerState]]]:
    """Build the app over a loaded fake backend; its runtime is closed after the test."""
    runtimes: list[Runtime] = []

    def start(settings: Settings, backend: FakeBackend) -> tuple[Litestar, ServerState]:
        server = ServerState(settings, api_keys=settings.all_api_keys())
        app = create_app(server)
        server.runtime = start_runtime(settings, backend=backend, plugins=plugins)
        runtimes.append(server.runtime)
        return app, server

    yield start
    for runtime in runtimes:
        runtime.close()


@pytest.fixture
def one_slot(serve: Callable[..., tuple[Litestar, ServerState]]) -> tuple[Litestar, ServerState]:
    """One sequence slot, no queue, 20 ms a decode step: a second request is refused."""
    return serve(Settings(max_queue=0), FakeBackend(n_seq_max=1, step_cost_s=0.02))


@dataclass
class Exchange:
    """One HTTP exchange as the server saw it."""

    status: int = 0
    chunks: list[bytes] = field(default_factory=list)
    hang_up: asyncio.Event = field(default_factory=asyncio.Event)

    def json(self) -> Any:
        return json.loads(b"".join(self.chunks))


async def post(
    app: Litestar,
    path: str,
    body: dict[str, Any],
    *,
    hang_up_after: int | None = None,
    exchange: Exchange | None = None,
) -> Exchange:
    """POST `body` at the ASGI level. The client hangs up once it has read `hang_up_after`
    body chunks (0: before any), or when `exchange.hang_up` is set."""
    exchange = exchange or Exchange()
    raw = json.dumps(body).encode()
    if hang_up_after == 0:
        exchange.hang_up.set()
    request_sent = False

    async def receive() -> dict[str, Any]:
        nonlocal request_sent
        if not request_sent:
            request_sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await exchange.hang_up.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            exchange.status = message["status"]
        elif message["type"] == "http.response.body":
            if message.get("body"):
                exchange.chunks.append(message["body"])
            ended = not message.get("more_body", False)
            if ended or (hang_up_after is not None and len(exchange.chunks) >= hang_up_after):
                exchange.hang_up.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(raw)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
    await app(scope, receive, send)
    return exchange


def run(coroutine: Coroutine[Any, Any, Exchange], timeout: float = 5.0) -> Exchange:
    return asyncio.run(asyncio.wait_for(coroutine, timeout))


def settles(server: ServerState, within: float = 2.0) -> bool:
    """Whether the engine goes idle and every admitted request is released in time."""
    assert server.runtime is not None
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not server.runtime.engine.busy and server.in_flight == 0:
            return True
        time.sleep(0.01)
    return False


def test_client_hanging_up_mid_stream_cancels_its_generation(
    one_slot: tuple[Litestar, ServerState],
) -> None:
    app, server = one_slot
    assert server.runtime is not None
    started = time.monotonic()
    exchange = run(post(app, CHAT, ENDLESS, hang_up_after=3))
    assert exchange.status == 200
    assert settles(server)
    assert time.monotonic() - started < 3.0
    assert server.runtime.engine.stats.generated_tokens < 100
    assert run(post(app, TEXT, SHORT)).status == 200


def test_client_hanging_up_before_the_first_chunk_frees_its_place(
    one_slot: tuple[Litestar, ServerState],
) -> None:
    app, server = one_slot
    run(post(app, CHAT, ENDLESS, hang_up_after=0))
    assert settles(server)
    follow_up = run(post(app, TEXT, SHORT))
    assert follow_up.status == 200, follow_up.json()


def test_request_beyond_the_queue_is_429_queue_full(
    one_slot: tuple[Litestar, ServerState],
) -> None:
    app, server = one_slot

    async def scenario() -> tuple[Exchange, Exchange]:
        first = Exchange()
        streaming = asyncio.create_task(post(app, CHAT, ENDLESS, exchange=first))
        while not first.chunks:  # the stream is under way: the only slot is taken
            await asyncio.sleep(0.01)
        second = await post(app, TEXT, SHORT)
        first.hang_up.set()
        await streaming
        return first, second

    first, second = asyncio.run(asyncio.wait_for(scenario(), 5.0))
    assert first.status == 200
    assert second.status == 429
    assert server.runtime is not None
    assert server.runtime.engine.stats.requests_submitted == 1  # it never saw the second
    assert second.json() == {
        "error": {
            "message": second.json()["error"]["message"],
            "type": "rate_limit_error",
            "param": None,
            "code": "queue_full",
        }
    }
    assert settles(server)


def test_negative_seed_never_wedges_the_server(
    serve: Callable[..., tuple[Litestar, ServerState]],
) -> None:
    # llama.cpp clients send seed -1 for "random"; it may be honoured or refused, not hang.
    app, _ = serve(Settings(), FakeBackend(n_seq_max=1))
    answer = run(post(app, TEXT, {**SHORT, "seed": -1, "temperature": 1}), timeout=2.0)
    assert answer.status in (200, 400)
    if answer.status == 400:
        assert answer.json()["error"]["param"] == "seed"
    assert run(post(app, TEXT, SHORT), timeout=2.0).status == 200
