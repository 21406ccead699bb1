"""The request bodies the API accepts, with OpenAI's semantics, and their translation into
engine requests.

These classes check types and the limits of fields only the API has (`max_completion_tokens`,
`top_logprobs`, a completion's `logprobs`, `session_id`). A value the engine takes as is
(temperature, top_p, n, stop, ...) is checked once, where the engine's value is built
(`reame_core.request`), and named by the same field.

Unknown fields are refused with a 400 that names them, unless an enabled plugin claims the
field through ``reame_request_extensions``: a field that would change the output is never
silently ignored. Fields that cannot change the output (``user``, ``metadata``) are accepted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reame_core.errors import RequestError
from reame_core.request import SamplingParams


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = False


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class _Generation(_Strict):
    """Fields shared by chat and text completions."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    # Extensions accepted by llama-server and vLLM.
    top_k: int = 0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    ignore_eos: bool = False
    # Reame's own: keep this conversation's KV between turns (also header X-Session-ID).
    session_id: str | None = Field(None, max_length=200)
    # Reame's own: speculative decoding for this request (default: the server's --speculate).
    speculate: Literal["auto", "on", "off"] | None = None

    def sampling(self, max_tokens: int, logprobs: int | None) -> SamplingParams:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        bias: dict[int, float] = {}
        for key, value in (self.logit_bias or {}).items():
            if not key.lstrip("-").isdigit():
                raise RequestError(
                    f"logit_bias keys are token ids written as strings, not {key!r}.",
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
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def refuse_unclaimed(self) -> None:
        """Refuse values that only a plugin could honour (none by default)."""


class ChatCompletionRequest(_Generation):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def refuse_unclaimed(self) -> None:
        # A plugin that claims `response_format` receives it as an extension instead.
        if self.response_format is not None and self.response_format.type != "text":
            raise RequestError(
                f"response_format '{self.response_format.type}' needs structured output, "
                "and no enabled plugin handles it; `reame plugins` lists them.",
                param="response_format",
            )

    @property
    def logprobs_count(self) -> int | None:
        if not self.logprobs:
            if self.top_logprobs is not None:
                raise RequestError("top_logprobs needs logprobs: true.", param="top_logprobs")
            return None
        return self.top_logprobs or 0


class CompletionRequest(_Generation):
    prompt: str | list[str] | list[int] | list[list[int]]
    suffix: str | None = None
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False
    max_tokens: int | None = 16

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
    """Validate a JSON body; fields claimed by plugins are split off as extensions."""
    if not isinstance(body, dict):
        raise RequestError("The request body must be a JSON object.")
    extensions = {key: body[key] for key in body if key in claimed}
    rest = {key: value for key, value in body.items() if key not in claimed}
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
    parsed.refuse_unclaimed()
    return parsed, extensions
