"""Every error the API returns, in OpenAI's shape: {"error": {message, type, param, code}}.

Handlers raise `APIError` (or the core's `RequestError`, a 400); this module maps those and
Litestar's own exceptions onto one body shape. No traceback ever reaches a client.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import structlog
from litestar import Request, Response
from litestar.exceptions import (
    HTTPException,
    NotAuthorizedException,
    ValidationException,
)
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR

from reame_core.errors import RequestError

log = structlog.get_logger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "server_error",
}


class APIError(Exception):
    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


def shown(value: str, limit: int = 100) -> str:
    """A client's string quoted in an error message, cut short when it is long."""
    return repr(value if len(value) <= limit else value[:limit] + "...")


def error_body(status: int, message: str, param: str | None, code: str | None) -> dict[str, Any]:
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _respond(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> Response[Any]:
    return Response(error_body(status, message, param, code), status_code=status)


def api_error_handler(_: Request[Any, Any, Any], error: APIError) -> Response[Any]:
    return _respond(error.status, error.message, error.param, error.code)


def request_error_handler(_: Request[Any, Any, Any], error: RequestError) -> Response[Any]:
    return _respond(400, error.message, error.param, error.code)


def http_error_handler(_: Request[Any, Any, Any], error: HTTPException) -> Response[Any]:
    status = error.status_code
    if isinstance(error, NotAuthorizedException):
        return _respond(
            401, "Missing or invalid API key (Authorization: Bearer ...).", None, "invalid_api_key"
        )
    if isinstance(error, ValidationException):
        return _respond(400, f"Invalid request: {error.detail}", None, None)
    if status == 413:
        return _respond(413, "The request body is too large.", None, "request_too_large")
    if status == 404:
        return _respond(404, f"Unknown route: {error.detail}", None, "not_found")
    return _respond(status, str(error.detail), None, None)


def internal_error_handler(request: Request[Any, Any, Any], error: Exception) -> Response[Any]:
    log.error("request failed", path=request.url.path, error=f"{type(error).__name__}: {error}")
    return _respond(HTTP_500_INTERNAL_SERVER_ERROR, "The server failed to handle this request.")


EXCEPTION_HANDLERS: MutableMapping[int | type[Exception], Any] = {
    APIError: api_error_handler,
    RequestError: request_error_handler,
    HTTPException: http_error_handler,
    Exception: internal_error_handler,
}
