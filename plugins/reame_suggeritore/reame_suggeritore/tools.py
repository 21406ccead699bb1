"""The grammar a chat's tool calls follow, in llguidance's Lark dialect (`tool_grammar`).

What the model may write is what the request's `ToolUse` allows, in the core's wire format
(`reame_core.tools`), nothing else:

- ``tool_choice: "auto"``: text that never writes the call marker, or such text and then
  calls (the text may be empty);
- ``"required"``: one or more calls, one if ``parallel_tool_calls`` is false;
- a named function: exactly one call of that function;
- ``"none"``, or no tools: no grammar.

A call names one of the functions, and its arguments follow that function's JSON schema
(`%json`), laid out as the wire format lays JSON out: ``", "`` and ``": "`` and no other
whitespace, which also leaves a small model no room to wander off into blank space. Objects
hold only the properties their schema names unless it allows others (`closed`).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from llguidance import LLMatcher, LLTokenizer

from reame_core.errors import RequestError
from reame_core.request import GenerationRequest
from reame_core.tools import (
    CALL_CLOSE,
    CALL_OPEN,
    CALL_SEPARATOR,
    ITEM_SEPARATOR,
    KEY_SEPARATOR,
    FunctionTool,
    call_head,
)
from reame_suggeritore.closed_schema import closed

TOOL_FIELDS = {
    "tools": "function calls: tool_choice honoured, arguments follow each function's schema",
}
"""The request field this module constrains (the core reads it too: see `reame_core.tools`)."""

# llguidance's JSON options for the arguments: the wire format's layout (the separators are
# regexes to llguidance; these hold no regex syntax).
_LAYOUT = {
    "whitespace_flexible": False,
    "item_separator": ITEM_SEPARATOR,
    "key_separator": KEY_SEPARATOR,
}


def tool_grammar(request: GenerationRequest, tokenizer: LLTokenizer | None = None) -> str | None:
    """The Lark grammar of what `request` lets the model write, or None when its calls are
    not constrained (no tools, or ``tool_choice: "none"``).

    Pass the matcher's `tokenizer`: where it holds a call marker as one special token
    (Qwen2.5's ``<tool_call>``), the grammar names that token, since a matcher never lets
    text spell a special token; elsewhere the markers are text. Raises `RequestError`
    naming the tool whose parameters llguidance cannot compile.
    """
    tools = request.tools
    if tools is None or not tools.calls_allowed:
        return None
    callable_ = {function.name for function in tools.callable}
    functions = [
        f"fn{index}" for index, function in enumerate(tools.functions) if function.name in callable_
    ]
    repeat = "" if tools.single else f" ({json.dumps(CALL_SEPARATOR)} call)*"
    lines = [
        f"call: {_marker(CALL_OPEN, tokenizer)} call_rest",
        f"call_rest: {json.dumps(chr(10))} ({' | '.join(functions)}) "
        f"{json.dumps(chr(10))} {_marker(CALL_CLOSE, tokenizer)}",
    ]
    if tools.choice == "auto":
        text = f"/(?s:.+)/ & ~/(?s:.*){_regex(CALL_OPEN)}(?s:.*)/"
        lines[:0] = [f"start: TEXT? | opening call_rest{repeat}", f"TEXT: {text}"]
        if _marker(CALL_OPEN, tokenizer) == CALL_OPEN:  # a special token: text cannot spell it
            lines.append(f"opening: TEXT? {CALL_OPEN}")
        else:  # lazy: the text ends at the first marker, which opens the call
            lines.append(f"opening[lazy]: /(?s:.*){_regex(CALL_OPEN)}/")
    else:
        lines.insert(0, f"start: call{repeat}")
    for index, function in enumerate(tools.functions):
        if function.name in callable_:
            schema = _arguments_schema(function, index)
            lines.append(f'fn{index}: {json.dumps(call_head(function.name))} args{index} "}}"')
            lines.append(f"args{index}: %json {schema}")
    return "\n".join(lines) + "\n"


@lru_cache(maxsize=8)
def _marker(text: str, tokenizer: LLTokenizer | None) -> str:
    """`text` in a Lark rule: the special token of `tokenizer` it names, or a literal."""
    if tokenizer is not None and not LLMatcher.validate_grammar(f"start: {text}", tokenizer):
        return text
    return json.dumps(text)


def _regex(text: str) -> str:
    """`text` matched literally inside a Lark ``/.../`` regex."""
    return re.escape(text).replace("/", "\\/")


def _arguments_schema(function: FunctionTool, index: int) -> str:
    """The function's parameters with the wire format's layout, as JSON text; refused with
    a 400 naming the tool when llguidance cannot compile them."""
    parameters: dict[str, Any] = closed(function.parameters)
    options = parameters.get("x-guidance")
    parameters["x-guidance"] = {**(options if isinstance(options, dict) else {}), **_LAYOUT}
    schema = json.dumps(parameters)
    error = _schema_error(schema)
    if error:
        param = f"tools[{index}].function.parameters"
        raise RequestError(f"'{param}' cannot constrain the arguments: {error}", param=param)
    return schema


# Keywords whose value is a schema, a list of schemas, or a map of names to schemas.
@lru_cache(maxsize=256)
def _schema_error(schema: str) -> str:
    """llguidance's complaint about a JSON schema ("" if none); clients send the same tools
    again and again, so the verdict is kept."""
    message = LLMatcher.validate_grammar(LLMatcher.grammar_from_json_schema(schema))
    return " ".join(message.split())[:400]
