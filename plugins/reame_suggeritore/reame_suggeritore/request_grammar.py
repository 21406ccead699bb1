"""What a request asks its answer to follow, as one llguidance grammar.

The fields, as OpenAI and llama-server spell them:

- ``response_format``: ``{"type": "text"}`` (no constraint), ``{"type": "json_object"}`` (any
  JSON object, or the schema under its optional ``"schema"`` key, as llama-server and
  instructor's JSON_SCHEMA mode send it), ``{"type": "json_schema", "json_schema": {"name",
  "schema", "strict"}}``;
- ``json_schema``: a JSON schema object (llama-server's extension);
- ``grammar``: a GBNF grammar (llama-server's; Lark is accepted too);
- ``regex``: a regular expression the whole answer matches;
- ``tools`` / ``tool_choice``: the grammar `tools.tool_grammar` makes of them.

A request has at most one of them. Everything here is a pure function of the request and
runs on the submitting thread: a malformed field is a `RequestError` naming it, before the
engine sees the request. Whether llguidance can compile the grammar is `grammars`' business.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import llguidance

from reame_core.errors import RequestError
from reame_core.json_depth import exceeds_depth
from reame_core.request import GenerationRequest
from reame_suggeritore import tools
from reame_suggeritore.closed_schema import closed

# JSON as small models write it best: one space after ',' and ':', no other whitespace. A
# schema may choose otherwise with llguidance's "x-guidance" key.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# The deepest nesting of JSON objects and arrays a schema may have (a property's schema is
# two levels below its object's: there are 40 such levels here).
MAX_SCHEMA_DEPTH = 128
# The longest grammar text (a schema serialized, a GBNF grammar, a regex) a request may send.
MAX_GRAMMAR_CHARS = 100_000

FIELDS = {
    "response_format": "OpenAI's structured output: text, json_object or json_schema",
    "json_schema": "a JSON schema the output must follow",
    "grammar": "a GBNF grammar the output must follow",
    "regex": "a regular expression the output must match",
}


@dataclass(frozen=True)
class Grammar:
    """One request's constraint: llguidance's grammar `text`, and the request `field` it came
    from (errors about it name that field)."""

    field: str
    text: str


def requested_grammar(
    request: GenerationRequest, tokenizer: llguidance.LLTokenizer | None = None
) -> Grammar | None:
    """The grammar `request` asks its answer to follow, or None for free text. Tool calls
    name their markers as `tokenizer`'s special tokens where it has them."""
    asked: list[Grammar] = []
    lark = tools.tool_grammar(request, tokenizer)
    if lark is not None:
        asked.append(Grammar("tools", llguidance.LLMatcher.grammar_from_lark(lark)))
    extensions = request.extensions
    for field in FIELDS:
        grammar = _grammar_of(field, extensions.get(field))
        if grammar is not None:
            asked.append(grammar)
    if len(asked) > 1:
        names = " and ".join(f"'{grammar.field}'" for grammar in asked)
        raise RequestError(
            f"{names} each constrain the answer; a request may use only one of them.",
            param=asked[1].field,
        )
    return asked[0] if asked else None


def _grammar_of(field: str, value: Any) -> Grammar | None:
    if value is None:
        return None
    if field == "response_format":
        return _response_format(value)
    if field == "json_schema":
        return _json_schema(field, value)
    if not isinstance(value, str) or not value:
        raise RequestError(f"'{field}' must be a non-empty string.", param=field)
    _check_size(field, value)
    if field == "regex":
        return Grammar(field, llguidance.LLMatcher.grammar_from_regex(value))
    try:
        return Grammar(field, llguidance.grammar_from("gbnf", value))
    except ValueError as error:
        raise RequestError(f"'{field}' is not a valid GBNF grammar: {error}", param=field) from None


def _response_format(value: Any) -> Grammar | None:
    field = "response_format"
    if not isinstance(value, Mapping):
        raise RequestError(f"'{field}' must be an object with a 'type'.", param=field)
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = value.get("schema")
        return _json_schema(field, {"type": "object"} if schema is None else schema)
    if kind == "json_schema":
        wrapper = value.get("json_schema")
        if not isinstance(wrapper, Mapping) or not isinstance(wrapper.get("schema"), Mapping):
            raise RequestError(
                f"'{field}' of type json_schema needs 'json_schema': "
                '{"name": ..., "schema": {...}}.',
                param=field,
            )
        name = wrapper.get("name")
        if name is not None and not isinstance(name, str):
            raise RequestError(f"'{field}.json_schema.name' must be a string.", param=field)
        return _json_schema(field, wrapper["schema"])
    raise RequestError(
        f"'{field}' type must be one of text, json_object, json_schema; got {kind!r}.",
        param=field,
    )


def _json_schema(field: str, schema: Any) -> Grammar:
    if not isinstance(schema, Mapping):
        raise RequestError(f"'{field}' needs a JSON schema object.", param=field)
    if exceeds_depth(schema, MAX_SCHEMA_DEPTH):
        raise RequestError(f"'{field}' nests deeper than {MAX_SCHEMA_DEPTH} levels.", param=field)
    text = json.dumps(closed(schema))
    _check_size(field, text)
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_OPTIONS)  # type: ignore[arg-type]
    except ValueError as error:
        raise RequestError(f"'{field}': the schema is not valid: {error}", param=field) from None
    return Grammar(field, grammar)


def _check_size(field: str, text: str) -> None:
    if len(text) > MAX_GRAMMAR_CHARS:
        raise RequestError(
            f"'{field}' is {len(text):,} characters; at most {MAX_GRAMMAR_CHARS:,} are accepted.",
            param=field,
        )
