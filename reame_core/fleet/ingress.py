"""The fleet's front door: Ray Serve's HTTP proxy hands it every request; it forwards each,
whole, to a replica chosen by the deployment's request router, and streams the reply back.

It holds no model and parses nothing but the routing text (`forwarding.forwarded`). A
replica that dies before answering costs its request a 503; one that dies mid-reply cuts
that reply (an SSE stream ends with an error event). No other request is touched, and the
router stops choosing the dead replica as soon as Serve reports it gone.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, cast

import structlog
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from reame_core.fleet.forwarding import ReplyStart, forwarded

log = structlog.get_logger(__name__)


class FleetIngress:
    def __init__(self, replicas: DeploymentHandle[Any]) -> None:
        self.replicas = replicas

    async def __call__(self, request: Request) -> Response:
        body = await request.body()
        forward = forwarded(
            request.method,
            request.url.path,
            request.url.query.encode(),
            list(request.headers.raw),
            body,
        )
        reply = cast(
            "DeploymentResponseGenerator[Any]", self.replicas.options(stream=True).remote(forward)
        )
        try:
            start = await reply.__anext__()
        except Exception as error:  # the replica died, or none could be reached
            log.warning("replica failed before answering", path=forward.path, error=str(error))
            return _replica_failed()
        if not isinstance(start, ReplyStart):
            return _replica_failed()
        streamed = any(
            k.lower() == b"content-type" and v.startswith(b"text/event-stream")
            for k, v in start.headers
        )
        response = StreamingResponse(_body(reply, streamed), status_code=start.status)
        response.raw_headers = list(start.headers)
        return response


async def _body(reply: DeploymentResponseGenerator[Any], streamed: bool) -> AsyncIterator[bytes]:
    try:
        async for chunk in reply:
            yield chunk
    except Exception as error:
        log.warning("replica failed mid-reply", error=str(error))
        if streamed:
            yield b"data: " + json.dumps(_error_body()).encode() + b"\n\n"


def _error_body() -> dict[str, Any]:
    return {
        "error": {
            "message": "The replica serving this request failed; retry it.",
            "type": "server_error",
            "param": None,
            "code": "replica_failed",
        }
    }


def _replica_failed() -> Response:
    return JSONResponse(_error_body(), status_code=503)
