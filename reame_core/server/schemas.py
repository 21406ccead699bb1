"""The request bodies the API accepts, with OpenAI's semantics, and their translation into
engine requests.

These classes check types and the limits of fields only the API has (`max_completion_tokens`,
`top_logprobs`, a completion's `logprobs`, `session_id`). A value the engine takes as is
(temperature, top_p, n, stop, ...) is checked once, where the engine's value is built
(`reame_core.request`), and named by the same field.

Unknown fields are refused with a 400 that names them, unless an enabled plugin claims the
field through ``reame_request_extensions``: a field that would change the output is never
silently ignored. Fields that cannot change the output (``user``, ``metadata``) are accepted.

A plugin may claim one of these OpenAI fields too, to honour what only a plugin can; without
such a plugin, values that need one are refused. A claimed ``response_format`` is the
plugin's alone. A claimed ``tools`` is read by the core too, which puts the functions in the
prompt and reads the calls back whoever constrains them: claiming it says the plugin
constrains the calls, which the core requires unless ``tool_choice`` is "none".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cached_property
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from reame_core.errors import RequestError
from reame_core.request import MAX_LOGIT_BIAS, MAX_STOP_CHARS, MAX_STOPS, SamplingParams
from reame_core.server.errors import shown
from reame_core.tools import NO_PARAMETERS, FunctionTool, ToolUse


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _described(**keywords: Any) -> dict[str, Any]:
    """JSON Schema keywords (for `json_schema_extra`) that describe a field in the published
    OpenAPI document only: the ranges the engine checks (`SamplingParams`), stated where
    the field is declared but not checked a second time here."""
    return keywords


_TOKEN_ID_VALUE = {"type": "integer", "minimum": 0}  # below the model's vocabulary size
_STOP_TEXT = {"type": "string", "minLength": 1, "maxLength": MAX_STOP_CHARS}
_TEXT_PARTS = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["type", "text"],
        "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
        "additionalProperties": False,
    },
}


def _one_shape_per_role(schema: dict[str, Any]) -> None:
    """A message's JSON Schema as `ChatMessage._fields_of_its_role` checks it: one shape per
    role, so that what the schema admits, the API takes (content parts: text only)."""
    fields = schema.pop("properties")
    schema.pop("required", None)
    schema.pop("additionalProperties", None)
    content = {"anyOf": [{"type": "string"}, _TEXT_PARTS, {"type": "null"}]}

    def shape(roles: list[str], **extra: Any) -> dict[str, Any]:
        return {
            "type": "object",
            "additionalProperties": False,
            "required": ["role", *(name for name in extra if name == "tool_call_id")],
            "properties": {"role": {"enum": roles}, "content": content, "name": fields["name"]}
            | extra,
        }

    schema["oneOf"] = [
        shape(["system", "user", "developer"]),
        shape(["assistant"], tool_calls=fields["tool_calls"]),
        shape(["tool"], tool_call_id={"type": "string"}),
    ]


class StreamOptions(_Strict):
    include_usage: bool = False


class CalledFunction(_Strict):
    name: str
    arguments: str


class ToolCall(_Strict):
    """A call in an assistant message, as the API returned it (`index` as a stream did)."""

    id: str
    type: Literal["function"] = "function"
    function: CalledFunction
    index: int | None = None


class ChatMessage(_Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_one_shape_per_role)

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _fields_of_its_role(self) -> ChatMessage:
        if self.tool_calls is not None and self.role != "assistant":
            raise PydanticCustomError("role", "only assistant messages carry tool_calls")
        if (self.tool_call_id is not None) != (self.role == "tool"):
            raise PydanticCustomError(
                "role", "a tool message, and only a tool message, carries the tool_call_id"
            )
        return self


class FunctionDefinition(_Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # accepted; every constrained call follows its schema


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: FunctionName


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


SESSION_ID_LIMIT = 200  # characters, in the body or the X-Session-ID header
_SAMPLING_FIELDS = frozenset({"temperature", "top_p", "top_k", "min_p", "seed"})
# A token id as a logit_bias key: ASCII digits only (str.isdigit takes any script's digits),
# and few enough that converting one costs nothing (the model checks the range).
_TOKEN_ID = re.compile(r"-?[0-9]{1,18}")


class _Generation(_Strict):
    """Fields shared by chat and text completions."""

    # The API's fields it reads even when a plugin claims them (see the module docstring).
    read_when_claimed: ClassVar[frozenset[str]] = frozenset()

    model: str | None = None
    max_tokens: int | None = Field(None, json_schema_extra=_described(minimum=1))
    temperature: float = Field(1.0, json_schema_extra=_described(minimum=0, maximum=2))
    top_p: float = Field(1.0, json_schema_extra=_described(exclusiveMinimum=0, maximum=1))
    n: int = Field(1, json_schema_extra=_described(minimum=1))
    stop: str | list[str] | None = Field(
        None,
        json_schema_extra=_described(
            anyOf=[
                _STOP_TEXT,
                {"type": "array", "items": _STOP_TEXT, "maxItems": MAX_STOPS},
                {"type": "null"},
            ]
        ),
    )
    seed: int | None = None
    presence_penalty: float = Field(0.0, json_schema_extra=_described(minimum=-2, maximum=2))
    frequency_penalty: float = Field(0.0, json_schema_extra=_described(minimum=-2, maximum=2))
    logit_bias: dict[str, float] | None = Field(
        None,
        json_schema_extra=_described(
            anyOf=[
                {
                    "type": "object",
                    "propertyNames": {"pattern": "^[0-9]{1,5}$"},  # token ids
                    "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
                    "maxProperties": MAX_LOGIT_BIAS,
                },
                {"type": "null"},
            ]
        ),
    )
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    # Extensions accepted by llama-server and vLLM.
    top_k: int = Field(0, json_schema_extra=_described(minimum=0))
    min_p: float = Field(0.0, json_schema_extra=_described(minimum=0, exclusiveMaximum=1))
    repeat_penalty: float = Field(1.0, json_schema_extra=_described(exclusiveMinimum=0, maximum=10))
    ignore_eos: bool = False
    # Reame's own: keep this conversation's KV between turns (also header X-Session-ID).
    session_id: str | None = Field(None, max_length=SESSION_ID_LIMIT)
    # Reame's own: speculative decoding for this request (default: the server's --speculate).
    speculate: Literal["auto", "on", "off"] | None = None

    def sampling(self, max_tokens: int, logprobs: int | None) -> SamplingParams:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        bias: dict[int, float] = {}
        for key, value in (self.logit_bias or {}).items():
            if not _TOKEN_ID.fullmatch(key):
                raise RequestError(
                    f"logit_bias keys are token ids written as strings, not {shown(key)}.",
                    param="logit_bias",
                )
            bias[int(key)] = value
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            min_p=self.min_p,
            repeat_penalty=self.repeat_penalty,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            logit_bias=bias,
            seed=self.seed,
            stop=stop,
            ignore_eos=self.ignore_eos,
            logprobs=logprobs,
            speculate=self.speculate,
        )

    @property
    def unset(self) -> frozenset[str]:
        """The sampling fields the caller did not send."""
        return frozenset(_SAMPLING_FIELDS - self.model_fields_set)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def refuse_unclaimed(self, claimed: Mapping[str, str]) -> None:
        """Refuse values that only a plugin could honour, when none claims their field
        (none by default)."""


class ChatCompletionRequest(_Generation):
    read_when_claimed = frozenset({"tools"})

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @cached_property
    def tool_use(self) -> ToolUse | None:
        """The functions offered and how they may be called (None: no tools)."""
        choice = self.tool_choice
        if not self.tools:
            if self.tools is not None:
                raise RequestError("'tools' is empty; leave it out to offer none.", param="tools")
            if choice is not None and choice not in ("none", "auto"):
                raise RequestError(
                    "'tool_choice' asks for a call but there are no 'tools'.", param="tool_choice"
                )
            return None
        functions = tuple(
            FunctionTool(
                tool.function.name,
                tool.function.description,
                dict(NO_PARAMETERS)
                if tool.function.parameters is None
                else tool.function.parameters,
            )
            for tool in self.tools
        )
        if isinstance(choice, NamedToolChoice):
            return ToolUse(functions, "required", choice.function.name, self.parallel_tool_calls)
        return ToolUse(functions, choice or "auto", None, self.parallel_tool_calls)

    def refuse_unclaimed(self, claimed: Mapping[str, str]) -> None:
        # A plugin that claims `response_format` receives it as an extension instead.
        if self.response_format is not None and self.response_format.type != "text":
            raise RequestError(
                f"response_format '{self.response_format.type}' needs structured output, "
                "and no enabled plugin handles it; `reame plugins` lists them.",
                param="response_format",
            )
        tools = self.tool_use
        if tools is not None and tools.calls_allowed and "tools" not in claimed:
            raise RequestError(
                "'tools' needs constrained decoding to call functions, and no enabled plugin "
                'handles it; `reame plugins` lists them (tool_choice "none" needs none).',
                param="tools",
            )

    @property
    def logprobs_count(self) -> int | None:
        if not self.logprobs:
            if self.top_logprobs is not None:
                raise RequestError("top_logprobs needs logprobs: true.", param="top_logprobs")
            return None
        return self.top_logprobs or 0


class CompletionRequest(_Generation):
    prompt: str | list[str] | list[int] | list[list[int]] = Field(
        json_schema_extra=_described(
            anyOf=[
                {"type": "string", "minLength": 1},
                {"type": "array", "items": {"type": "string"}, "minItems": 1},
                {"type": "array", "items": _TOKEN_ID_VALUE, "minItems": 1},
                {
                    "type": "array",
                    "items": {"type": "array", "items": _TOKEN_ID_VALUE, "minItems": 1},
                    "minItems": 1,
                },
            ]
        )
    )
    suffix: str | None = None
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = Field(
        False, json_schema_extra=_described(enum=[False])
    )  # accepted when false only
    max_tokens: int | None = Field(16, json_schema_extra=_described(minimum=1))

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


_TYPE_BRANCHES = {"str", "int", "list[str]", "list[int]", "list[list[int]]", "list[dict[str,any]]"}


def _field_path(loc: tuple[int | str, ...]) -> str:
    """pydantic's error location as a field path: messages[0].content (no type branches)."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif str(part).replace(" ", "").lower() in _TYPE_BRANCHES or "[" in str(part):
            break
        else:
            path += f".{part}" if path else str(part)
    return path


def parse_body(
    model: type[_Generation], body: Any, claimed: Mapping[str, str]
) -> tuple[Any, dict[str, Any]]:
    """Validate a JSON body; fields claimed by plugins are handed over as extensions (and
    those the API reads anyway are read here too)."""
    if not isinstance(body, dict):
        raise RequestError("The request body must be a JSON object.")
    extensions = {key: body[key] for key in body if key in claimed}
    rest = {
        key: value
        for key, value in body.items()
        if key not in claimed or key in model.read_when_claimed
    }
    try:
        parsed = model.model_validate(rest)
    except ValidationError as error:
        first = error.errors()[0]
        location = _field_path(first["loc"])
        if first["type"] == "extra_forbidden":
            message = (
                f"Unknown field '{location}': it is not an OpenAI field Reame supports, and "
                "no enabled plugin handles it; `reame plugins` lists them."
            )
        else:
            message = f"Invalid '{location}': {first['msg']}."
        raise RequestError(message, param=location) from error
    parsed.refuse_unclaimed(claimed)
    return parsed, extensions
