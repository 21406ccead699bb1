"""What the API does with a request: prompt building, limits, submission, and the events
coming back. HTTP concerns (routes, SSE framing, auth) live in `routes.py`.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from reame_core.backend.base import Backend
from reame_core.chat import encode_chat
from reame_core.engine.engine import Ticket
from reame_core.errors import ContextOverflowError, RequestError
from reame_core.request import Event, FinishEvent, GenerationRequest, SamplingParams
from reame_core.runtime import Runtime
from reame_core.server.errors import APIError
from reame_core.server.metrics import ServerMetrics
from reame_core.server.schemas import ChatCompletionRequest, CompletionRequest
from reame_core.settings import Settings

# Fields that only a plugin can honour: a clearer message than "unknown field".
PLUGIN_FIELDS = {
    "best_of": "reame-conclave",
    "grammar": "reame-suggeritore",
    "json_schema": "reame-suggeritore",
    "regex": "reame-suggeritore",
}


@dataclass
class ServerState:
    """Everything the HTTP layer shares; `runtime` is None until the model has loaded."""

    settings: Settings
    runtime: Runtime | None = None
    load_error: str | None = None
    in_flight: int = 0
    api_keys: list[str] = field(default_factory=list)
    metrics: ServerMetrics | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def ready(self) -> Runtime:
        if self.runtime is None:
            if self.load_error:
                raise APIError(503, f"The model failed to load: {self.load_error}")
            raise APIError(503, "The model is still loading; retry shortly.", code="loading")
        return self.runtime

    def claimed_fields(self) -> dict[str, str]:
        runtime = self.ready()
        claimed: dict[str, str] = {}
        for fields in runtime.plugins.hook.reame_request_extensions():
            claimed.update(fields or {})
        return claimed

    def check_model(self, name: str | None) -> None:
        runtime = self.ready()
        if name and name != runtime.backend.info.name:
            raise APIError(
                404,
                f"The model '{name}' does not exist here; this server runs "
                f"'{runtime.backend.info.name}' (GET /v1/models).",
                param="model",
                code="model_not_found",
            )

    def admit(self, count: int) -> None:
        """Reserve room for `count` requests or refuse with 429 when the queue is full."""
        runtime = self.ready()
        limit = runtime.backend.info.n_seq_max + self.settings.max_queue
        with self._lock:
            if self.in_flight + count > limit:
                raise APIError(
                    429,
                    f"The server is busy ({self.in_flight} requests in flight, queue limit "
                    f"{self.settings.max_queue}); retry later.",
                    code="queue_full",
                )
            self.in_flight += count

    def release(self, count: int) -> None:
        with self._lock:
            self.in_flight -= count


def completion_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def reject_plugin_fields(body: dict[str, Any], claimed: dict[str, str]) -> None:
    for name, plugin in PLUGIN_FIELDS.items():
        if name in body and name not in claimed:
            raise RequestError(
                f"'{name}' needs the {plugin} plugin, which is not installed or is disabled.",
                param=name,
            )


def max_tokens_for(backend: Backend, prompt: Sequence[int], asked: int | None, field: str) -> int:
    room = backend.info.n_ctx_seq - len(prompt)
    if room < 1:
        raise ContextOverflowError(
            f"The prompt has {len(prompt)} tokens; this model's context per sequence is "
            f"{backend.info.n_ctx_seq}.",
            param=field,
        )
    return room if asked is None else asked


def chat_requests(
    runtime: Runtime, body: ChatCompletionRequest, extensions: dict[str, Any], session: str | None
) -> list[GenerationRequest]:
    if body.response_format is not None and body.response_format.type != "text":
        raise RequestError(
            f"response_format '{body.response_format.type}' needs the reame-suggeritore "
            "plugin, which is not installed or is disabled.",
            param="response_format",
        )
    messages = [message.model_dump(exclude_none=True) for message in body.messages]
    prompt = encode_chat(runtime.backend, messages)
    params = body.sampling(
        max_tokens_for(runtime.backend, prompt, body.requested_max_tokens, "messages"),
        body.logprobs_count,
    )
    return [GenerationRequest(prompt, params, body.n, extensions, session)]


def completion_prompts(backend: Backend, body: CompletionRequest) -> list[list[int]]:
    prompt = body.prompt
    if isinstance(prompt, str):
        texts: list[str] | None = [prompt]
    elif prompt and all(isinstance(p, str) for p in prompt):
        texts = [str(p) for p in prompt]
    else:
        texts = None
    if texts is None:
        if body.suffix is not None:
            raise RequestError("'suffix' needs a text prompt, not token ids.", param="suffix")
        id_lists: list[Any] = [prompt] if prompt and isinstance(prompt[0], int) else list(prompt)
        return [[int(t) for t in ids] for ids in id_lists]
    if body.suffix is not None:
        return [fill_in_the_middle(backend, text, body.suffix) for text in texts]
    return [backend.tokenize(text, add_special=True, parse_special=True) for text in texts]


def fill_in_the_middle(backend: Backend, prefix: str, suffix: str) -> list[int]:
    """<BOS?> FIM_PRE prefix FIM_SUF suffix FIM_MID: the model writes the middle."""
    info = backend.info
    if info.fim is None:
        raise RequestError(
            f"'suffix' (fill-in-the-middle) needs a model with FIM tokens; {info.name} has none.",
            param="suffix",
        )
    tokens = [info.bos] if info.add_bos and info.bos is not None else []
    tokens.append(info.fim.prefix)
    tokens += backend.tokenize(prefix, add_special=False, parse_special=False)
    tokens.append(info.fim.suffix)
    tokens += backend.tokenize(suffix, add_special=False, parse_special=False)
    tokens.append(info.fim.middle)
    return tokens


def completion_requests(
    runtime: Runtime, body: CompletionRequest, extensions: dict[str, Any], session: str | None
) -> list[GenerationRequest]:
    if body.echo:
        raise RequestError("'echo' is not supported.", param="echo")
    if not body.prompt:
        raise RequestError("The prompt is empty.", param="prompt")
    requests = []
    for prompt in completion_prompts(runtime.backend, body):
        if not prompt:
            raise RequestError("The prompt is empty.", param="prompt")
        max_tokens = max_tokens_for(runtime.backend, prompt, body.requested_max_tokens, "prompt")
        params: SamplingParams = body.sampling(max_tokens, body.logprobs)
        requests.append(GenerationRequest(prompt, params, body.n, extensions, session))
    return requests


class Submission:
    """Requests handed to the engine together (each checked by `Engine.submit`, once), and
    their events in arrival order. Submitting happens at construction, so a request the
    engine refuses raises here, before any response has started.

    Events cross from the engine thread to the event loop through a deque. Waking the loop
    costs the decoding threads CPU on a small host, so it is woken once per burst of
    events, and, for a response that is not streamed, only when a request finishes.
    `on_tokens` runs on the engine thread as each token event arrives (for latency metrics).
    """

    def __init__(
        self,
        runtime: Runtime,
        requests: Sequence[GenerationRequest],
        *,
        stream: bool = True,
        on_tokens: Callable[[], None] | None = None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._stream = stream
        self._on_tokens = on_tokens
        self._pending: deque[tuple[int, Event]] = deque()
        self._arrived = asyncio.Event()
        self._wake_scheduled = False
        self._tickets: list[Ticket] = []
        self._remaining = len(requests)
        try:
            for index, request in enumerate(requests):
                self._tickets.append(runtime.engine.submit(request, partial(self._emit, index)))
        except BaseException:
            self.cancel()
            raise

    def _emit(self, index: int, event: Event) -> None:  # engine thread
        finished = isinstance(event, FinishEvent)
        if not finished and self._on_tokens is not None:
            self._on_tokens()
        self._pending.append((index, event))
        # Append before testing the flag: if a wake is already scheduled, it has not yet
        # run, so it will find this event.
        if (finished or self._stream) and not self._wake_scheduled:
            self._wake_scheduled = True
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        self._wake_scheduled = False
        self._arrived.set()

    def cancel(self) -> None:
        """Cancel what still runs (a client that went away)."""
        if self._remaining:
            for ticket in self._tickets:
                ticket.cancel()

    async def events(self) -> AsyncIterator[tuple[int, Event]]:
        """Yield (request index, event) until every request has finished; leaving early
        cancels the rest."""
        try:
            while self._remaining:
                while not self._pending:
                    self._arrived.clear()
                    await self._arrived.wait()
                index, event = self._pending.popleft()
                if isinstance(event, FinishEvent):
                    self._remaining -= 1
                yield index, event
        finally:
            self.cancel()


def now() -> int:
    return int(time.time())
