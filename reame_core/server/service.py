"""What the API does with a request, in the order it happens:

    prepare   read the body as strict JSON, parse it, build and tokenize the prompts, check
              every limit (off the event loop when the prompt is long enough for tokenizing
              to matter)
    admit     take places in the server's queue, or 429 (the engine has not seen it)
    submit    hand the checked requests to the engine
    events    the engine's events, in arrival order, until every request has finished

HTTP concerns (routes, response bodies, SSE framing, auth) live in `routes.py`. Nothing here
touches the engine's backend: prompts are tokenized through the model's thread-safe
vocabulary (`ModelInfo.vocab`).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import anyio.to_thread

from reame_core.chat import encode_chat
from reame_core.engine.engine import Ticket
from reame_core.errors import RequestError
from reame_core.hooktypes import CandidatePlan, ModelInfo
from reame_core.request import Event, FinishEvent, GenerationRequest, context_room
from reame_core.runtime import Runtime
from reame_core.server.errors import APIError, shown
from reame_core.server.json_body import read_json_body
from reame_core.server.metrics import ServerMetrics
from reame_core.server.schemas import (
    SESSION_ID_LIMIT,
    ChatCompletionRequest,
    CompletionRequest,
    parse_body,
)
from reame_core.settings import Settings

Kind = Literal["chat", "text"]

# Prompts longer than this (in characters) are tokenized in a worker thread. Tokenizing
# costs 0.3 ms per 1,000 characters with SmolLM2's BPE and 0.6 ms with Gemma 3's SPM on a
# 2-vCPU EPYC, a thread hand-off about 0.08 ms: below this size the hand-off is not worth it,
# above it the event loop would stall every running stream (20-50 ms for 64,000 characters).
ON_LOOP_CHARS = 1024


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

    def admit(self, call: APICall) -> None:
        """Take the call's places in the queue, or refuse with 429 when it is full."""
        limit = call.model.n_seq_max + self.settings.max_queue
        with self._lock:
            if self.in_flight + call.places > limit:
                raise APIError(
                    429,
                    f"The server is busy ({self.in_flight} requests in flight, queue limit "
                    f"{self.settings.max_queue}); retry later.",
                    code="queue_full",
                )
            self.in_flight += call.places

    def release(self, places: int) -> None:
        with self._lock:
            self.in_flight -= places


# ------------------------------------------------------------------------ prepare


async def prepare(runtime: Runtime, kind: Kind, body: bytes, session: str | None) -> APICall:
    """Read, parse and check a request body into an `APICall`, tokenizing its prompts in a
    worker thread when they are long (the vocabulary is thread-safe; ctypes releases the GIL)."""
    data = read_json_body(body)
    if prompt_chars(data) <= ON_LOOP_CHARS:
        return build_call(runtime, kind, data, session)
    return await anyio.to_thread.run_sync(build_call, runtime, kind, data, session)


def build_call(runtime: Runtime, kind: Kind, data: Any, session: str | None) -> APICall:
    """The engine requests a body asks for, each checked by the engine (`Engine.check`):
    every refusal is raised here, before the call takes a place in the queue."""
    model = runtime.backend.info
    if session is not None and len(session) > SESSION_ID_LIMIT:
        raise RequestError(
            f"The X-Session-ID header is longer than {SESSION_ID_LIMIT} characters.",
            param="X-Session-ID",
        )
    schema = ChatCompletionRequest if kind == "chat" else CompletionRequest
    body, extensions = parse_body(schema, data, runtime.request_extensions)
    # The name is only ever compared: it never reaches the model store or the file system.
    if body.model and body.model != model.name:
        raise APIError(
            404,
            f"The model {shown(body.model)} does not exist here; this server runs "
            f"'{model.name}' (GET /v1/models).",
            param="model",
            code="model_not_found",
        )
    tools = None
    if kind == "chat":
        tools = body.tool_use
        messages = [message.model_dump(exclude_none=True) for message in body.messages]
        prompts, prompt_param = [encode_chat(model, messages, tools=tools)], "messages"
        logprobs = body.logprobs_count
    else:
        most = model.n_seq_max + runtime.settings.max_queue  # what the queue could ever hold
        prompts, prompt_param = completion_prompts(model, body, most), "prompt"
        logprobs = body.logprobs
    requests, plans = [], []
    for prompt in prompts:
        asked = body.requested_max_tokens
        max_tokens = context_room(len(prompt), model) if asked is None else asked
        params = body.sampling(max_tokens, logprobs)
        request = GenerationRequest(
            prompt,
            params,
            body.n,
            extensions,
            session or body.session_id,
            tools=tools,
            unset=body.unset,
        )
        plans.append(runtime.engine.check(request, prompt_param=prompt_param))
        requests.append(request)
    sent = data.get("messages" if kind == "chat" else "prompt")
    return APICall(
        runtime,
        kind,
        requests,
        plans,
        stream=body.stream,
        include_usage=body.include_usage,
        prompt=sent,
    )


def completion_prompts(
    model: ModelInfo, body: CompletionRequest, most: int | None = None
) -> list[list[int]]:
    """A completion's prompts as tokens: text, texts, token ids or lists of token ids. More
    prompts than `most` (the places the server's queue has) are refused before any is
    tokenized: such a call could never be admitted."""
    if body.echo:
        raise RequestError("'echo' is not supported.", param="echo")
    prompt = body.prompt
    if not prompt:
        raise RequestError("The prompt is empty.", param="prompt")
    count = 1 if isinstance(prompt, str) or isinstance(prompt[0], int) else len(prompt)
    if most is not None and count > most:
        raise RequestError(
            f"The request holds {count} prompts; this server queues at most {most} at once.",
            param="prompt",
        )
    if isinstance(prompt, str):
        texts: list[str] | None = [prompt]
    elif all(isinstance(p, str) for p in prompt):
        texts = [str(p) for p in prompt]
    else:
        texts = None
    if texts is None:
        if body.suffix is not None:
            raise RequestError("'suffix' needs a text prompt, not token ids.", param="suffix")
        id_lists: list[Any] = [prompt] if isinstance(prompt[0], int) else list(prompt)
        return [[int(t) for t in ids] for ids in id_lists]
    if body.suffix is not None:
        return [fill_in_the_middle(model, text, body.suffix) for text in texts]
    return [model.vocab.tokenize(text, add_special=True, parse_special=True) for text in texts]


def fill_in_the_middle(model: ModelInfo, prefix: str, suffix: str) -> list[int]:
    """<BOS?> FIM_PRE prefix FIM_SUF suffix FIM_MID: the model writes the middle."""
    if model.fim is None:
        raise RequestError(
            f"'suffix' (fill-in-the-middle) needs a model with FIM tokens; {model.name} has none.",
            param="suffix",
        )
    vocab = model.vocab
    tokens = [model.bos] if model.add_bos and model.bos is not None else []
    tokens.append(model.fim.prefix)
    tokens += vocab.tokenize(prefix, add_special=False, parse_special=False)
    tokens.append(model.fim.suffix)
    tokens += vocab.tokenize(suffix, add_special=False, parse_special=False)
    tokens.append(model.fim.middle)
    return tokens


def prompt_chars(data: Any) -> int:
    """About how many characters of prompt a raw body holds (0 for shapes parsing refuses)."""
    if not isinstance(data, dict):
        return 0
    prompt = data.get("prompt")
    texts: list[Any] = [data.get("suffix"), *(prompt if isinstance(prompt, list) else [prompt])]
    messages = data.get("messages")
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):  # text parts
            texts += [part.get("text") for part in content if isinstance(part, dict)]
        else:
            texts.append(content)
    tools = data.get("tools")
    if isinstance(tools, list):  # the functions' schemas go into the prompt too
        texts.append(json.dumps(tools))
    return sum(len(text) for text in texts if isinstance(text, str))


# ----------------------------------------------------------------- submit, events


class APICall:
    """One API call from its checked requests to its last event: the engine requests, the
    tickets once submitted, and the events coming back in arrival order.

    Events cross from the engine thread to the event loop through a deque. Waking the loop
    costs the decoding threads CPU on a small host, so it is woken once per burst of events,
    and, for a response that is not streamed, only when a request finishes.
    """

    def __init__(
        self,
        runtime: Runtime,
        kind: Kind,
        requests: list[GenerationRequest],
        plans: list[CandidatePlan | None],
        *,
        stream: bool,
        include_usage: bool = False,
        prompt: Any = None,
    ) -> None:
        self.runtime = runtime
        self.model = runtime.backend.info
        self.kind = kind
        self.requests = requests
        self.plans = plans  # what `Engine.check` returned for each request
        self.n = requests[0].n
        self.stream = stream
        self.include_usage = include_usage
        self.prompt = prompt  # as the client sent it: logged only if prompts may be
        self.id = completion_id("chatcmpl" if kind == "chat" else "cmpl")
        self.created = int(time.time())
        self._tickets: list[Ticket] = []
        self._pending: deque[tuple[int, Event]] = deque()
        self._arrived = asyncio.Event()
        self._wake_scheduled = False
        self._remaining = len(requests)
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop that reads events
        self._on_tokens: Callable[[], None] | None = None
        self._release: Callable[[], None] | None = None

    @property
    def places(self) -> int:
        """Places the call takes in the server's queue: one per engine request."""
        return len(self.requests)

    def submit(
        self, release: Callable[[], None], on_tokens: Callable[[], None] | None = None
    ) -> None:
        """Queue every request in the engine (checked already, so nothing is refused now).
        `release` gives back the call's queue places when it ends; `on_tokens` runs on the
        engine thread as each token event arrives (latency metrics)."""
        self._release = release
        self._on_tokens = on_tokens
        self._loop = asyncio.get_running_loop()
        engine = self.runtime.engine
        for index, (request, plan) in enumerate(zip(self.requests, self.plans, strict=True)):
            emit = partial(self._emit, index)
            self._tickets.append(engine.submit(request, emit, checked=True, plan=plan))

    def _emit(self, index: int, event: Event) -> None:  # engine thread
        finished = isinstance(event, FinishEvent)
        if not finished and self._on_tokens is not None:
            self._on_tokens()
        self._pending.append((index, event))
        # Append before testing the flag: if a wake is already scheduled, it has not yet
        # run, so it will find this event.
        if (finished or self.stream) and not self._wake_scheduled:
            self._wake_scheduled = True
            assert self._loop is not None  # set before any request was submitted
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        self._wake_scheduled = False
        self._arrived.set()

    async def events(self) -> AsyncIterator[tuple[int, Event]]:
        """Yield (request index, event) until every request has finished; leaving early
        ends the call."""
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
            self.end()

    def end(self) -> None:
        """End the call however it ends: cancel what still runs (a client that went away)
        and give back its queue places, once."""
        if self._remaining:
            for ticket in self._tickets:
                ticket.cancel()
        release, self._release = self._release, None
        if release is not None:
            release()


def completion_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"
