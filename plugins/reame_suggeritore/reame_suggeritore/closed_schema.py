"""Closing a JSON schema's objects to keys it does not name.

JSON Schema lets an object without ``additionalProperties`` carry any other key, and
pydantic's schemas (instructor's, the `openai` client's) leave that default. A small model
allowed extra keys invents them, key after key, until `max_tokens`; llama.cpp's server reads
such a schema as closed, and so does everyone who writes one. Structured answers and tool
arguments are therefore constrained by the closed schema; every answer to it is valid under
the schema as sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Where a schema keyword holds one schema, a list of schemas, or a map of names to schemas.
_ONE = ("items", "additionalItems", "contains", "not", "if", "then", "else", "propertyNames")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
# Keywords with which a schema says itself what other keys its objects may hold.
_OPEN = ("additionalProperties", "patternProperties", "unevaluatedProperties")


def closed(schema: Any, *, close: bool = True) -> Any:
    """`schema` with every object that names its ``properties`` closed to other keys, unless
    it says otherwise (`_OPEN`). The parts of an ``allOf`` stay open themselves (each would
    refuse the others' properties), their nested objects closed. `schema` is not changed."""
    if not isinstance(schema, Mapping):
        return schema
    result = dict(schema)
    for key in _ONE:
        if isinstance(result.get(key), Mapping):
            result[key] = closed(result[key])
    for key in _LIST:
        if isinstance(result.get(key), list):
            result[key] = [closed(item, close=key != "allOf") for item in result[key]]
    for key in _MAP:
        if isinstance(result.get(key), Mapping):
            result[key] = {name: closed(item) for name, item in result[key].items()}
    if isinstance(result.get("additionalProperties"), Mapping):
        result["additionalProperties"] = closed(result["additionalProperties"])
    names = isinstance(result.get("properties"), Mapping)  # a free-form object stays open
    if close and names and not any(key in result for key in _OPEN):
        result["additionalProperties"] = False
    return result
