"""The HTTP routes: OpenAI-compatible completions and chat, models, health, metrics.

Handlers translate between HTTP and `service.py`; they never touch the engine's backend.
Streaming responses are Server-Sent Events framed exactly as OpenAI frames them.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import structlog
from litestar import Controller, Request, Response, get, post
from litestar.background_tasks import BackgroundTask
from litestar.datastructures import State
from litestar.params import JSONBody
from litestar.response import Stream

from reame_core.errors import ContextOverflowError
from reame_core.logs import prompts_allowed
from reame_core.request import FinishEvent, GenerationRequest, TokenEvent, TokenLogprob
from reame_core.runtime import Runtime
from reame_core.server import responses
from reame_core.server.errors import APIError
from reame_core.server.schemas import ChatCompletionRequest, CompletionRequest, parse_body
from reame_core.server.service import (
    ServerState,
    Submission,
    chat_requests,
    completion_id,
    completion_requests,
    now,
    reject_plugin_fields,
)

SESSION_HEADER = "x-session-id"

log = structlog.get_logger(__name__)


def _sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


class _Job:
    """One API call in flight: its engine requests and what has come back so far."""

    def __init__(
        self,
        state: ServerState,
        runtime: Runtime,
        requests: list[GenerationRequest],
        kind: str,
        stream: bool,
        prompt: Any = None,
    ) -> None:
        self.state = state
        self.runtime = runtime
        self.requests = requests
        self.kind = kind  # "chat" or "text"
        self.prompt = prompt  # as the client sent it: logged only if prompts may be
        self.id = completion_id("chatcmpl" if kind == "chat" else "cmpl")
        self.created = now()
        self.model = runtime.backend.info.name
        self.n = requests[0].n
        self.started = time.perf_counter()
        self.metrics = state.metrics
        self._last_event = 0.0
        self._released = False
        self._admitted = False
        # Submits to the engine: a request it refuses raises here.
        self.submission = Submission(
            runtime, requests, stream=stream, on_tokens=self.observe_tokens
        )

    def admit(self) -> None:
        """Take the call's places in the server's queue (429 when it is full)."""
        try:
            self.state.admit(len(self.requests))
        except APIError:
            self.submission.cancel()
            raise
        self._admitted = True

    def choice_index(self, request_index: int, candidate: int) -> int:
        return request_index * self.n + candidate

    def observe_tokens(self) -> None:  # engine thread, as each token event is emitted
        moment = time.perf_counter()
        if self.metrics is not None:
            if self._last_event == 0.0:
                self.metrics.time_to_first_token.observe(moment - self.started)
            else:
                self.metrics.inter_token_latency.observe(moment - self._last_event)
        self._last_event = moment

    async def events(self) -> AsyncIterator[tuple[int, TokenEvent | FinishEvent]]:
        outputs: dict[int, str] | None = {} if prompts_allowed() else None
        try:
            async for index, event in self.submission.events():
                if outputs is not None and isinstance(event, FinishEvent):
                    for result in event.candidates:
                        outputs[self.choice_index(index, result.candidate)] = result.text
                yield index, event
        finally:
            self.release()
            if outputs is not None:  # --log-prompts: the operator asked for the contents
                log.info(
                    "exchange",
                    id=self.id,
                    prompt=self.prompt,
                    outputs=[outputs[position] for position in sorted(outputs)],
                )

    def release(self) -> None:
        """End the call however it ends: cancel what still runs (a client that hung up
        before reading anything), give back the queue places taken at admission (once)."""
        self.submission.cancel()
        if self._admitted and not self._released:
            self._released = True
            self.state.release(len(self.requests))

    def token_bytes(self, token: int) -> bytes:
        return self.runtime.backend.token_bytes(token)

    def logprobs(self, items: Sequence[TokenLogprob], offset: int = 0) -> dict[str, Any] | None:
        if self.requests[0].params.logprobs is None:
            return None
        if self.kind == "chat":
            return responses.chat_logprobs(items, self.token_bytes)
        return responses.completion_logprobs(items, self.token_bytes, offset)

    # ------------------------------------------------------------- one shot

    async def complete(self) -> dict[str, Any]:
        finished: dict[int, FinishEvent] = {}
        logprobs: dict[tuple[int, int], list[TokenLogprob]] = {}
        async for index, event in self.events():
            if isinstance(event, FinishEvent):
                finished[index] = event
            else:
                logprobs.setdefault((index, event.candidate), []).extend(event.logprobs)
        choices = []
        for index in sorted(finished):
            event = finished[index]
            if event.error:
                raise APIError(500, f"The generation failed: {event.error}")
            for result in event.candidates:
                position = self.choice_index(index, result.candidate)
                items = logprobs.get((index, result.candidate), [])
                if self.kind == "chat":
                    choice: dict[str, Any] = {
                        "index": position,
                        "message": {"role": "assistant", "content": result.text},
                        "logprobs": self.logprobs(items),
                        "finish_reason": result.finish_reason,
                    }
                else:
                    choice = {
                        "index": position,
                        "text": result.text,
                        "logprobs": self.logprobs(items),
                        "finish_reason": result.finish_reason,
                    }
                choices.append(choice)
        usage = responses.merge_usage([finished[i].usage for i in sorted(finished)])
        return {
            "id": self.id,
            "object": "chat.completion" if self.kind == "chat" else "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.runtime.backend.info.fingerprint[:16],
            "choices": choices,
            "usage": responses.usage_body(usage),
            "timings": responses.timings_body(usage),
        }

    # ------------------------------------------------------------ streaming

    def _chunk(
        self,
        choices: list[dict[str, Any]],
        usage: dict[str, Any] | None = None,
        with_usage: bool = False,
    ) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.kind == "chat" else "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.runtime.backend.info.fingerprint[:16],
            "choices": choices,
        }
        if with_usage:
            chunk["usage"] = usage
        return chunk

    async def stream(self, include_usage: bool) -> AsyncIterator[bytes]:
        if self.kind == "chat":
            opening = [
                {
                    "index": self.choice_index(i, c),
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
                for i in range(len(self.requests))
                for c in range(self.n)
            ]
            yield _sse(self._chunk(opening, with_usage=include_usage))
        offsets: dict[int, int] = {}
        usages = []
        async for index, event in self.events():
            if isinstance(event, TokenEvent):
                if not event.text and not event.logprobs:
                    continue
                position = self.choice_index(index, event.candidate)
                if self.kind == "chat":
                    choice: dict[str, Any] = {
                        "index": position,
                        "delta": {"content": event.text},
                        "logprobs": self.logprobs(event.logprobs),
                        "finish_reason": None,
                    }
                else:
                    offset = offsets.get(position, 0)
                    choice = {
                        "index": position,
                        "text": event.text,
                        "logprobs": self.logprobs(event.logprobs, offset),
                        "finish_reason": None,
                    }
                    offsets[position] = offset + len(event.text)
                yield _sse(self._chunk([choice], with_usage=include_usage))
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
                position = self.choice_index(index, result.candidate)
                if self.kind == "chat":
                    closing.append(
                        {
                            "index": position,
                            "delta": {},
                            "logprobs": None,
                            "finish_reason": result.finish_reason,
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
            yield _sse(self._chunk(closing, with_usage=include_usage))
        if include_usage:
            usage = responses.merge_usage(usages)
            final = self._chunk([], responses.usage_body(usage), with_usage=True)
            final["timings"] = responses.timings_body(usage)
            yield _sse(final)
        yield _sse("[DONE]")


def _session(request: Request[Any, Any, Any], body_session: str | None) -> str | None:
    return request.headers.get(SESSION_HEADER) or body_session


class CompletionsController(Controller):
    path = "/v1"

    @post("/chat/completions", status_code=200)
    async def chat(self, request: Request[Any, Any, Any], data: JSONBody[Any]) -> Response[Any]:
        return await _serve(request, data, "chat")

    @post("/completions", status_code=200)
    async def completions(
        self, request: Request[Any, Any, Any], data: JSONBody[Any]
    ) -> Response[Any]:
        return await _serve(request, data, "text")

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


async def _serve(request: Request[Any, Any, Any], data: Any, kind: str) -> Response[Any]:
    server: ServerState = request.app.state.server
    runtime = server.ready()
    claimed = server.claimed_fields()
    if isinstance(data, dict):
        reject_plugin_fields(data, claimed)
    model = ChatCompletionRequest if kind == "chat" else CompletionRequest
    body, extensions = parse_body(model, data, claimed)
    server.check_model(body.model)
    session = _session(request, body.session_id)
    if kind == "chat":
        requests = chat_requests(runtime, body, extensions, session)
    else:
        requests = completion_requests(runtime, body, extensions, session)
    try:
        prompt = data.get("messages" if kind == "chat" else "prompt")
        job = _Job(server, runtime, requests, kind, body.stream, prompt)
    except ContextOverflowError as error:
        error.param = "messages" if kind == "chat" else "prompt"
        raise
    job.admit()
    if body.stream:
        # The background task runs even when the client hangs up before the first chunk.
        return Stream(
            job.stream(body.include_usage),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            background=BackgroundTask(job.release),
        )
    try:
        return Response(await job.complete())
    finally:
        job.release()


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
