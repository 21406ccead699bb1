"""Function tools a chat request offers the model, and the text the model calls them in.

A request's tools become a `ToolUse`: the functions, which the model may or must call
(`choice`, `only`), and whether it may call several at once. Every limit on them is checked
here, when the value is built, as `SamplingParams` checks its own.

The wire format is the one Qwen2.5 and Hermes models are trained on, one block per call,
blocks separated by a newline::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

The arguments are a JSON object laid out as Python's `json.dumps` writes it (``", "`` and
``": "``, no other whitespace). The prompt shows the model this format (`call_text`,
`instructions`), a grammar plugin constrains the output to it, and the API reads the calls
back from the text (`server/tool_calls.py`): the three agree because they share this module.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from reame_core.errors import RequestError
from reame_core.json_depth import exceeds_depth

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
CALL_SEPARATOR = "\n"
ITEM_SEPARATOR = ", "
KEY_SEPARATOR = ": "

ToolChoice = Literal["auto", "required", "none"]

NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}
"""The arguments of a function that takes none: OpenAI's reading of absent parameters."""

# OpenAI's rule for function names; it also keeps them plain inside the wire format.
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# The deepest nesting of objects and arrays a function's parameters may have: far beyond any
# real schema, and far from Python's recursion limit for whoever walks them.
MAX_PARAMETERS_DEPTH = 128


@dataclass(frozen=True)
class FunctionTool:
    """One function the model may call; `parameters` is the JSON schema of its arguments,
    an object schema (OpenAI's "no parameters" is an object with no properties). OpenAI's
    `strict` has no counterpart: a constraining plugin holds every call to its schema."""

    name: str
    description: str | None = None
    parameters: Mapping[str, Any] = field(default_factory=lambda: dict(NO_PARAMETERS))

    def definition(self) -> dict[str, Any]:
        """The function as OpenAI (and chat templates) write it."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = dict(self.parameters)
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolUse:
    """The functions a chat request offers, and how the model may use them.

    `choice` "auto" lets the model answer in text or call functions, "required" makes it call
    at least one, "none" forbids calls (the functions stay out of the prompt). `only` names
    the one function a request forces (OpenAI's named ``tool_choice``): exactly one call of
    it. Without `parallel`, a reply holds at most one call.
    """

    functions: tuple[FunctionTool, ...]
    choice: ToolChoice = "auto"
    only: str | None = None
    parallel: bool = True

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for index, function in enumerate(self.functions):
            param = f"tools[{index}].function"
            if not _NAME.fullmatch(function.name):
                raise RequestError(
                    f"'{param}.name' must be 1-64 letters, digits, underscores or dashes, "
                    f"not {function.name!r}.",
                    param=f"{param}.name",
                )
            if function.name in seen:
                raise RequestError(
                    f"Two tools are named {function.name!r}; function names must be unique.",
                    param=f"{param}.name",
                )
            seen.add(function.name)
            if exceeds_depth(function.parameters, MAX_PARAMETERS_DEPTH):
                raise RequestError(
                    f"'{param}.parameters' nests deeper than {MAX_PARAMETERS_DEPTH} levels.",
                    param=f"{param}.parameters",
                )
            kind = function.parameters.get("type", "object")
            if kind != "object":
                raise RequestError(
                    f"'{param}.parameters' must describe a JSON object (the arguments), "
                    f"not type {kind!r}.",
                    param=f"{param}.parameters",
                )
        if self.only is not None:
            if self.choice != "required":
                raise ValueError("a named tool choice is a required call")
            if self.only not in seen:
                raise RequestError(
                    f"'tool_choice' names the function {self.only!r}, which is not among the "
                    f"tools: {', '.join(sorted(seen)) or 'none'}.",
                    param="tool_choice",
                )

    @property
    def calls_allowed(self) -> bool:
        return self.choice != "none"

    @property
    def callable(self) -> tuple[FunctionTool, ...]:
        """The functions a call may name."""
        if self.only is None:
            return self.functions
        return tuple(function for function in self.functions if function.name == self.only)

    @property
    def single(self) -> bool:
        """At most one call per reply."""
        return self.only is not None or not self.parallel


def call_text(name: str, arguments: Any) -> str:
    """One call in the wire format; `arguments` is the decoded JSON value."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"


def call_head(name: str) -> str:
    """What a call's JSON body holds before its arguments."""
    return f'{{"name": {json.dumps(name)}, "arguments": '


def response_text(content: str) -> str:
    """A call's result, as the model reads it in a user message."""
    return f"<tool_response>\n{content}\n</tool_response>"


def instructions(functions: Sequence[FunctionTool]) -> str:
    """A system-prompt block that shows the functions and the wire format, for chat
    templates that do not render tools themselves."""
    signatures = "\n".join(
        json.dumps(function.definition(), ensure_ascii=False) for function in functions
    )
    return (
        "# Tools\n\n"
        "You can call functions to answer the user. Their signatures, one per line, are "
        "within <tools></tools> tags:\n"
        f"<tools>\n{signatures}\n</tools>\n\n"
        "To call a function, write a JSON object with its name and arguments within "
        f"{CALL_OPEN}{CALL_CLOSE} tags, one block per call:\n"
        f'{CALL_OPEN}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n'
        f"{CALL_CLOSE}\n\n"
        "The results come back within <tool_response></tool_response> tags."
    )
