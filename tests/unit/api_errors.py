"""What every refusal of the HTTP API must look like: OpenAI's error body."""

from __future__ import annotations

from typing import Any

import httpx


def openai_error(
    response: httpx.Response,
    status: int,
    *,
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    """Assert `response` is exactly OpenAI's error shape with `status`; return the error.

    `param` and `code`, when given, must match; the message must be a sentence for a human.
    """
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    assert error["param"] is None or isinstance(error["param"], str)
    assert error["code"] is None or isinstance(error["code"], str)
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    return error
