"""An HTTP request as it crosses from the fleet's ingress to a replica, and back.

The ingress does not parse requests beyond what routing needs (`routing_text`); the
replica answers them with the same Litestar application `reame serve` runs
(`exchange`), so every route, check, error and stream of the single server holds for the
fleet as is. The reply comes back as a `ReplyStart` followed by body chunks.

`ForwardedRequest.prompt` is the text routers compare; a router that reads a request's
`prompt` attribute (Ray Serve LLM's `PrefixCacheAffinityRouter`) works on it unchanged.
Reame's own reads it with a chat's first turn aligned to its chunks (`routed_text`).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from reame_core.fleet.affinity import turn_aligned

ASGIApp = Callable[..., Coroutine[Any, Any, None]]  # (scope, receive, send)

ROUTED_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
SESSION_HEADER = "x-session-id"
REPLICA_HEADER = "x-reame-replica"


@dataclass(frozen=True)
class ForwardedRequest:
    method: str
    path: str
    query: bytes = b""
    headers: tuple[tuple[bytes, bytes], ...] = ()
    body: bytes = b""
    prompt: str = ""  # routing text: never empty, so routers may divide by its length
    session: str | None = None
    # How much of `prompt` the disk prefix cache keeps: a chat's first turn if it is a
    # system prompt (a chat opening with another role opens with its template's default
    # system turn, too short to keep), a completion's whole prompt.
    stored_chars: int = 0
    # Names the request in its replica's reports (`RoutingStats.finished`).
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # A chat's first turn in `prompt`'s characters: its system message's, 0 where the chat
    # opens with another role (see `stored_chars`); None for a completion.
    first_turn: int | None = None

    @property
    def routable(self) -> bool:
        """Whether caches matter for where it goes (a completion, not /health)."""
        return self.path in ROUTED_PATHS

    @property
    def routed_text(self) -> str:
        """`prompt` as Reame's router and replicas chain it (`affinity.turn_aligned`)."""
        return turn_aligned(self.prompt, self.first_turn)


@dataclass(frozen=True)
class ReplyStart:
    status: int
    headers: tuple[tuple[bytes, bytes], ...] = field(default_factory=tuple)


def forwarded(
    method: str,
    path: str,
    query: bytes,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
) -> ForwardedRequest:
    """The request as the ingress forwards it, with its routing text and session."""
    header = SESSION_HEADER.encode()
    session = next((v.decode("latin-1") for k, v in headers if k.lower() == header), None)
    routed = routing_text(body) if path in ROUTED_PATHS else RoutingText()
    return ForwardedRequest(
        method,
        path,
        query,
        tuple(headers),
        body,
        prompt=routed.text or path,
        session=session or routed.session,
        stored_chars=routed.stored_chars,
        first_turn=routed.first_turn,
    )


@dataclass(frozen=True)
class RoutingText:
    text: str = ""
    session: str | None = None
    stored_chars: int = 0
    first_turn: int | None = None  # as `ForwardedRequest.first_turn`


def routing_text(body: bytes) -> RoutingText:
    """The text that decides where a completion goes — the messages (role and content) or
    the prompt, in order — its `session_id`, and how much of it the disk prefix cache keeps
    and a chat's first turn (`ForwardedRequest`). A body that does not parse gives no text:
    the replica will refuse it with the API's own error."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return RoutingText()
    if not isinstance(data, dict):
        return RoutingText()
    session = data.get("session_id")
    session = session if isinstance(session, str) else None
    if isinstance(data.get("messages"), list):
        messages = [message for message in data["messages"] if isinstance(message, dict)]
        parts = [
            f"{message.get('role', '')}\n{_content_text(message.get('content'))}\n"
            for message in messages
        ]
        if not messages:  # no text: the request's path routes it
            return RoutingText(session=session)
        first = len(parts[0]) if messages[0].get("role") == "system" else 0
        return RoutingText("".join(parts), session, first, first)
    prompt = data.get("prompt")
    if isinstance(prompt, list):
        prompt = prompt[0] if prompt else ""
    text = prompt if isinstance(prompt, str) else json.dumps(prompt)
    return RoutingText(text, session, len(text))


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


async def exchange(app: ASGIApp, request: ForwardedRequest) -> AsyncIterator[ReplyStart | bytes]:
    """Run `request` through the ASGI application `app` in this process: the reply's start,
    then its body chunks as the application sends them. Closing the iterator early (the
    client went away) tells the application the client disconnected."""
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": "http",
        "path": request.path,
        "raw_path": request.path.encode(),
        "root_path": "",
        "query_string": request.query,
        "headers": list(request.headers),
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 0),
        "state": {},
    }
    messages: asyncio.Queue[MutableMapping[str, Any] | None] = asyncio.Queue()
    gone = asyncio.Event()
    body_sent = False

    async def receive() -> MutableMapping[str, Any]:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        await messages.put(message)

    task: asyncio.Task[None] = asyncio.create_task(app(scope, receive, send))
    task.add_done_callback(lambda _: messages.put_nowait(None))
    try:
        while (message := await messages.get()) is not None:
            if message["type"] == "http.response.start":
                yield ReplyStart(message["status"], tuple(message.get("headers", ())))
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    yield bytes(message["body"])
                if not message.get("more_body", False):
                    break
        # The reply is complete: from now on the client is gone, as an HTTP server says.
        gone.set()
        await task
    finally:
        gone.set()
        if not task.done():
            try:
                await asyncio.wait_for(task, timeout=5)
            except (asyncio.TimeoutError, Exception):
                task.cancel()
