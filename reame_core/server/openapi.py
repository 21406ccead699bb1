"""The OpenAPI description of the completion routes: the bodies they take and the errors
they answer with, written from the same pydantic classes that check them (`schemas.py`).

The handlers read their bodies as bytes and parse them strictly themselves (`json_body.py`),
so Litestar sees no typed body and would describe none: clients, documentation and a fuzzer
reading /schema/openapi.json would learn nothing of what a request may hold. Each completion
route names an `Operation` class from here instead. This module only describes; what is
accepted is decided by `schemas.py` and the engine's checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from litestar.openapi.spec import OpenAPIMediaType, OpenAPIResponse, Operation, RequestBody
from litestar.openapi.spec.schema import Schema
from pydantic import BaseModel

from reame_core.server.errors import error_body
from reame_core.server.schemas import ChatCompletionRequest, CompletionRequest

# The refusals every completion route may answer with, each in OpenAI's error shape.
_REFUSALS = {
    400: "The body is not a request the API takes; the message names the field.",
    401: "Missing or invalid API key.",
    404: "The model named is not the one this server runs.",
    413: "The body is larger than the server takes.",
    429: "The server's queue is full; retry later.",
    503: "The model is still loading, or failed to load.",
}


@dataclass
class _WrittenSchema(Schema):
    """A JSON Schema already written (by pydantic), served exactly as written."""

    document: dict[str, Any] = field(default_factory=dict)

    def to_schema(self) -> dict[str, Any]:
        return self.document


def inline_definitions(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with each `$ref` to its own `$defs` replaced by the definition, so that it
    stands alone wherever it is placed in the OpenAPI document (the request classes nest
    no class within itself, so this ends)."""
    definitions = schema.get("$defs", {})

    def resolve(value: Any) -> Any:
        if isinstance(value, dict):
            reference = value.get("$ref")
            if isinstance(reference, str) and reference.startswith("#/$defs/"):
                rest = {key: item for key, item in value.items() if key != "$ref"}
                return {**resolve(definitions[reference.removeprefix("#/$defs/")]), **rest}
            return {key: resolve(item) for key, item in value.items() if key != "$defs"}
        if isinstance(value, list):
            return [resolve(item) for item in value]
        return value

    resolved: dict[str, Any] = resolve(schema)
    return resolved


def _error_schema() -> dict[str, Any]:
    example = error_body(400, "Invalid 'temperature': ...", "temperature", None)
    nullable_text = {"type": ["string", "null"]}
    return {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "param", "code"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": nullable_text,
                    "code": nullable_text,
                },
            }
        },
        "examples": [example],
    }


def _operation_for(model: type[BaseModel]) -> type[Operation]:
    """An `Operation` whose request body is `model`'s JSON Schema, and which lists the
    refusals besides whatever Litestar found (the 200)."""
    body = inline_definitions(model.model_json_schema())
    refusal = OpenAPIMediaType(schema=_WrittenSchema(document=_error_schema()))

    @dataclass
    class BodyOperation(Operation):
        def __post_init__(self) -> None:
            self.request_body = RequestBody(
                required=True,
                content={
                    "application/json": OpenAPIMediaType(schema=_WrittenSchema(document=body))
                },
            )
            responses = dict(self.responses or {})
            for status, description in _REFUSALS.items():
                responses[str(status)] = OpenAPIResponse(
                    description=description, content={"application/json": refusal}
                )
            self.responses = responses

    BodyOperation.__name__ = BodyOperation.__qualname__ = f"{model.__name__}Operation"
    return BodyOperation


ChatOperation = _operation_for(ChatCompletionRequest)
CompletionOperation = _operation_for(CompletionRequest)
