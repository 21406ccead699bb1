"""`reame serve`: the Litestar application and its startup.

This first cut serves liveness/readiness, the model list and non-streaming chat
completions; the full OpenAI-compatible surface is built on the same pieces.
"""

from __future__ import annotations

import time
from typing import Any

import uvicorn
from litestar import Litestar, Request, Response, get, post
from litestar.datastructures import State
from litestar.exceptions import HTTPException
from litestar.status_codes import HTTP_400_BAD_REQUEST, HTTP_500_INTERNAL_SERVER_ERROR

from reame_core.chat import encode_chat
from reame_core.errors import RequestError
from reame_core.request import FinishEvent, GenerationRequest, SamplingParams
from reame_core.runtime import Runtime, start_runtime
from reame_core.settings import Settings


def error_body(
    message: str, kind: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def request_error_handler(_: Request[Any, Any, Any], error: RequestError) -> Response[Any]:
    body = error_body(error.message, "invalid_request_error", error.param, error.code)
    return Response(body, status_code=HTTP_400_BAD_REQUEST)


def http_error_handler(_: Request[Any, Any, Any], error: HTTPException) -> Response[Any]:
    kind = "invalid_request_error" if error.status_code < 500 else "server_error"
    return Response(error_body(str(error.detail), kind), status_code=error.status_code)


def internal_error_handler(_: Request[Any, Any, Any], error: Exception) -> Response[Any]:
    body = error_body("The server failed to handle this request.", "server_error")
    return Response(body, status_code=HTTP_500_INTERNAL_SERVER_ERROR)


@get("/health")
async def health(state: State) -> dict[str, str]:
    return {"status": "ok", "model": state.runtime.backend.info.name}


@get("/v1/models")
async def models(state: State) -> dict[str, Any]:
    info = state.runtime.backend.info
    return {
        "object": "list",
        "data": [{"id": info.name, "object": "model", "created": 0, "owned_by": "reame"}],
    }


@post("/v1/chat/completions")
async def chat_completions(state: State, data: dict[str, Any]) -> dict[str, Any]:
    runtime: Runtime = state.runtime
    messages = data.get("messages")
    if not isinstance(messages, list):
        raise RequestError("'messages' must be a list of messages.", param="messages")
    tokens = encode_chat(runtime.backend, messages)
    room = runtime.backend.info.n_ctx_seq - len(tokens)
    max_tokens = data.get("max_completion_tokens") or data.get("max_tokens") or room
    stop = data.get("stop") or ()
    params = SamplingParams(
        max_tokens=int(max_tokens),
        temperature=float(data.get("temperature", 1.0)),
        top_p=float(data.get("top_p", 1.0)),
        seed=data.get("seed"),
        stop=(stop,) if isinstance(stop, str) else tuple(stop),
    )
    finished: FinishEvent | None = None
    async for event in runtime.engine.stream(GenerationRequest(tokens, params)):
        if isinstance(event, FinishEvent):
            finished = event
    if finished is None or finished.error:
        raise HTTPException(status_code=500, detail="The generation failed.")
    usage = finished.usage
    return {
        "id": f"chatcmpl-{id(finished):x}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": runtime.backend.info.name,
        "choices": [
            {
                "index": c.candidate,
                "message": {"role": "assistant", "content": c.text},
                "finish_reason": c.finish_reason,
            }
            for c in finished.candidates
        ],
        "usage": {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        },
    }


def create_app(runtime: Runtime) -> Litestar:
    return Litestar(
        route_handlers=[health, models, chat_completions],
        state=State({"runtime": runtime}),
        exception_handlers={
            RequestError: request_error_handler,
            HTTPException: http_error_handler,
            Exception: internal_error_handler,
        },
        on_shutdown=[runtime.close],
    )


def serve(settings: Settings) -> int:
    runtime = start_runtime(settings)
    uvicorn.run(create_app(runtime), host=settings.host, port=settings.port, log_config=None)
    return 0
