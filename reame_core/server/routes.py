"""The HTTP routes: OpenAI-compatible completions and chat, models, health, metrics.

A completion request goes one way (`_serve`): `service.prepare` parses, tokenizes and checks
it, the server admits it or answers 429, the engine gets it, and `_Reply` turns its events
into OpenAI's bodies. Handlers never touch the engine's backend. Streaming responses are
Server-Sent Events framed exactly as OpenAI frames them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import partial
from typing import Any, TypeVar

import structlog
from litestar import Controller, Request, Response, get, post
from litestar.background_tasks import BackgroundTask
from litestar.datastructures import State
from litestar.exceptions import InternalServerException
from litestar.response import Stream

from reame_core.logs import prompts_allowed
from reame_core.request import CandidateResult, FinishEvent, TokenEvent, TokenLogprob
from reame_core.server import responses, tool_calls
from reame_core.server.errors import APIError
from reame_core.server.metrics import ServerMetrics
from reame_core.server.openapi import ChatOperation, CompletionOperation
from reame_core.server.service import APICall, Kind, ServerState, prepare

SESSION_HEADER = "x-session-id"
_T = TypeVar("_T")

log = structlog.get_logger(__name__)


def _sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def _latency_observer(metrics: ServerMetrics | None, started: float) -> Callable[[], None]:
    """Time to first token, then the gaps between token events (runs on the engine thread)."""
    last = 0.0

    def observe() -> None:
        nonlocal last
        moment = time.perf_counter()
        if metrics is not None:
            if last == 0.0:
                metrics.time_to_first_token.observe(moment - started)
            else:
                metrics.inter_token_latency.observe(moment - last)
        last = moment

    return observe


class _Reply:
    """An `APICall`'s events as OpenAI's response bodies: one JSON body or SSE chunks.

    A chat that lets the model call functions has its text read for tool calls
    (`tool_calls.ToolCallReader`); a reply that calls one ends with finish_reason
    "tool_calls" rather than "stop".
    """

    def __init__(self, call: APICall) -> None:
        self.call = call
        self.include_usage = call.include_usage
        self.chat = call.kind == "chat"
        self.with_logprobs = call.requests[0].params.logprobs is not None
        tools = call.requests[0].tools
        self.reads_calls = tools is not None and tools.calls_allowed

    async def events(self) -> AsyncIterator[tuple[int, TokenEvent | FinishEvent]]:
        """The call's events; with --log-prompts, one `exchange` line once it has ended."""
        call = self.call
        outputs: dict[int, list[str]] | None = {} if prompts_allowed() else None
        try:
            async for index, event in call.events():
                if outputs is not None and isinstance(event, FinishEvent):
                    outputs[index] = [result.text for result in event.candidates]
                yield index, event
        finally:
            if outputs is not None:  # the operator asked for the contents
                texts = [text for index in sorted(outputs) for text in outputs[index]]
                log.info("exchange", id=call.id, prompt=call.prompt, outputs=texts)

    def logprobs(self, items: Sequence[TokenLogprob], offset: int = 0) -> dict[str, Any] | None:
        if not self.with_logprobs:
            return None
        token_bytes = self.call.model.vocab.token_bytes  # thread-safe: no engine involved
        if self.chat:
            return responses.chat_logprobs(items, token_bytes)
        return responses.completion_logprobs(items, token_bytes, offset)

    def _envelope(self, suffix: str) -> dict[str, Any]:
        call = self.call
        return {
            "id": call.id,
            "object": ("chat.completion" if self.chat else "text_completion") + suffix,
            "created": call.created,
            "model": call.model.name,
            "system_fingerprint": call.model.fingerprint[:16],
        }

    # ------------------------------------------------------------- one shot

    async def body(self) -> dict[str, Any]:
        finished: dict[int, FinishEvent] = {}
        logprobs: dict[tuple[int, int], list[TokenLogprob]] = {}
        async for index, event in self.events():
            if isinstance(event, FinishEvent):
                finished[index] = event
            else:
                logprobs.setdefault((index, event.candidate), []).extend(event.logprobs)
        choices: list[dict[str, Any]] = []
        for index in sorted(finished):
            event = finished[index]
            if event.error:
                raise APIError(500, f"The generation failed: {event.error}")
            # Numbered densely in the order returned, also when a selection plugin
            # returns only some of a request's candidates.
            for result in event.candidates:
                items = logprobs.get((index, result.candidate), [])
                choice: dict[str, Any] = {"index": len(choices)}
                finish_reason: str = result.finish_reason
                if not self.chat:
                    choice["text"] = result.text
                elif self.reads_calls:
                    choice["message"] = tool_calls.message(result.text)
                    finish_reason = _finish_reason(result, "tool_calls" in choice["message"])
                else:
                    choice["message"] = {"role": "assistant", "content": result.text}
                choice["logprobs"] = self.logprobs(items)
                choice["finish_reason"] = finish_reason
                choices.append(choice)
        usage = responses.merge_usage([finished[i].usage for i in sorted(finished)])
        return {
            **self._envelope(""),
            "choices": choices,
            "usage": responses.usage_body(usage),
            "timings": responses.timings_body(usage),
            **responses.reports([finished[i].report for i in sorted(finished)]),
        }

    # ------------------------------------------------------------ streaming

    def _chunk(
        self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        chunk = {**self._envelope(".chunk" if self.chat else ""), "choices": choices}
        if self.include_usage:
            chunk["usage"] = usage
        return chunk

    def position(self, request_index: int, candidate: int) -> int:
        """A streamed choice's index: every candidate streams before any is selected."""
        return request_index * self.call.n + candidate

    async def stream(self) -> AsyncIterator[bytes]:
        if self.chat:
            opening = [
                {
                    "index": self.position(i, c),
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
                for i in range(len(self.call.requests))
                for c in range(self.call.n)
            ]
            yield _sse(self._chunk(opening))
        offsets: dict[int, int] = {}
        deltas = _ChatDeltas(self.reads_calls)
        usages = []
        async for index, event in self.events():
            if isinstance(event, TokenEvent):
                position = self.position(index, event.candidate)
                if self.chat:
                    delta = deltas.read(position, event.text)
                    if not delta and not event.logprobs:
                        continue
                    choice: dict[str, Any] = {
                        "index": position,
                        "delta": delta or {"content": ""},
                        "logprobs": self.logprobs(event.logprobs),
                        "finish_reason": None,
                    }
                else:
                    if not event.text and not event.logprobs:
                        continue
                    offset = offsets.get(position, 0)
                    choice = {
                        "index": position,
                        "text": event.text,
                        "logprobs": self.logprobs(event.logprobs, offset),
                        "finish_reason": None,
                    }
                    offsets[position] = offset + len(event.text)
                yield _sse(self._chunk([choice]))
                continue
            if event.error:
                yield _sse(
                    {
                        "error": {
                            "message": f"The generation failed: {event.error}",
                            "type": "server_error",
                            "param": None,
                            "code": None,
                        }
                    }
                )
                return
            usages.append(event.usage)
            closing = []
            for result in event.candidates:
                position = self.position(index, result.candidate)
                if self.chat:
                    rest, finish_reason = deltas.end(position, result)
                    if rest:  # what the choice held back
                        held = {"index": position, "delta": rest, "logprobs": None}
                        yield _sse(self._chunk([{**held, "finish_reason": None}]))
                    closing.append(
                        {
                            "index": position,
                            "delta": {},
                            "logprobs": None,
                            "finish_reason": finish_reason,
                        }
                    )
                else:
                    closing.append(
                        {
                            "index": position,
                            "text": "",
                            "logprobs": None,
                            "finish_reason": result.finish_reason,
                        }
                    )
            yield _sse({**self._chunk(closing), **event.report})
        if self.include_usage:
            usage = responses.merge_usage(usages)
            final = self._chunk([], responses.usage_body(usage))
            final["timings"] = responses.timings_body(usage)
            yield _sse(final)
        yield _sse("[DONE]")


class _ChatDeltas:
    """A streamed chat's deltas, choice by choice: the text as it comes or, when the model
    may call functions, what a `ToolCallReader` makes of it."""

    def __init__(self, reads_calls: bool) -> None:
        self._readers: dict[int, tool_calls.ToolCallReader] | None = {} if reads_calls else None

    def read(self, position: int, text: str) -> dict[str, Any]:
        if self._readers is None:
            return {"content": text} if text else {}
        reader = self._readers.setdefault(position, tool_calls.ToolCallReader())
        return tool_calls.delta(reader.feed(text))

    def end(self, position: int, result: CandidateResult) -> tuple[dict[str, Any], str]:
        """What the choice still held back, and its finish_reason."""
        if self._readers is None:
            return {}, result.finish_reason
        reader = self._readers.pop(position, tool_calls.ToolCallReader())
        return tool_calls.delta(reader.close()), _finish_reason(result, reader.called)


def _finish_reason(result: CandidateResult, called: bool) -> str:
    """OpenAI's "tool_calls" for a complete reply that calls functions."""
    return "tool_calls" if called and result.finish_reason == "stop" else result.finish_reason


class CompletionsController(Controller):
    path = "/v1"

    @post("/chat/completions", status_code=200, operation_class=ChatOperation)
    async def chat(self, request: Request[Any, Any, Any]) -> Response[Any]:
        return await _serve(request, "chat")

    @post("/completions", status_code=200, operation_class=CompletionOperation)
    async def completions(self, request: Request[Any, Any, Any]) -> Response[Any]:
        return await _serve(request, "text")

    @get("/models")
    async def models(self, state: State) -> dict[str, Any]:
        server: ServerState = state.server
        runtime = server.ready()
        info = runtime.backend.info
        return {
            "object": "list",
            "data": [
                {
                    "id": info.name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "reame",
                    "meta": {
                        "n_ctx_per_slot": info.n_ctx_seq,
                        "slots": info.n_seq_max,
                        "architecture": info.architecture,
                        "fim": info.fim is not None,
                    },
                }
            ],
        }


async def _serve(request: Request[Any, Any, Any], kind: Kind) -> Response[Any]:
    """The request's one path: prepare (read, parse, tokenize, check) -> admit -> submit ->
    reply. The body is read as bytes (413 past the size limit, as it streams in) and parsed
    by `prepare`, strictly, rather than by the framework."""
    started = time.perf_counter()
    server: ServerState = request.app.state.server
    body = await _read_body(request)
    runtime = server.ready()
    call = await prepare(runtime, kind, body, request.headers.get(SESSION_HEADER))
    server.admit(call)  # 429 here: the engine has not seen the call
    call.submit(partial(server.release, call.places), _latency_observer(server.metrics, started))
    reply = _Reply(call)
    if call.stream:
        # The background task runs even when the client hangs up before the first chunk.
        return Stream(
            reply.stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            background=BackgroundTask(call.end),
        )
    try:
        return Response(await _unless_hung_up(request, reply.body()))
    finally:
        call.end()


# What nginx logs for a client that closed the connection before the answer: it is never
# sent, but the metrics count it.
CLIENT_CLOSED = 499


def _client_closed() -> APIError:
    return APIError(CLIENT_CLOSED, "The client closed the connection.")


async def _read_body(request: Request[Any, Any, Any]) -> bytes:
    """The request's body, or a 499 when the client hangs up before sending all of it
    (Litestar raises a 500 for that: an error nobody receives, and not the server's)."""
    try:
        return await request.body()
    except InternalServerException:  # the one thing `body()` raises it for: a disconnect
        raise _client_closed() from None


async def _unless_hung_up(request: Request[Any, Any, Any], body: Awaitable[_T]) -> _T:
    """`body`, unless the client hangs up first: then its generation is cancelled (and its
    slot freed) at once rather than run to the end for nobody, as a stream's would be."""
    work = asyncio.ensure_future(body)
    hang_up = asyncio.ensure_future(_hung_up(request))
    try:
        await asyncio.wait((work, hang_up), return_when=asyncio.FIRST_COMPLETED)
        if not work.done() and hang_up.exception() is not None:
            await asyncio.wait((work,))  # no telling whether the client left: answer it
    finally:
        hang_up.cancel()
        if not work.done():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work  # its `finally`s run now: the call's requests are cancelled
    if work.cancelled():
        raise _client_closed()
    return work.result()


async def _hung_up(request: Request[Any, Any, Any]) -> None:
    """Returns once the client has closed the connection (its body is read already, so
    the next ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


@get("/health")
async def health(state: State) -> Response[dict[str, Any]]:
    server: ServerState = state.server
    if server.runtime is None:
        status = "error" if server.load_error else "loading"
        return Response({"status": status, "error": server.load_error}, status_code=503)
    info = server.runtime.backend.info
    return Response({"status": "ok", "model": info.name, "slots": info.n_seq_max})


@get("/speculation")
async def speculation(state: State) -> dict[str, Any]:
    """The speculation governor's view, per draft source (what `reame speculation` shows)."""
    server: ServerState = state.server
    return server.ready().engine.governor.report()


@get("/metrics", media_type="text/plain; version=0.0.4")
async def metrics(state: State) -> bytes:
    server: ServerState = state.server
    assert server.metrics is not None
    return server.metrics.render()
