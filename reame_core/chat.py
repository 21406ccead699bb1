"""Chat messages to prompt text, with the model's own chat template.

The template comes from the GGUF metadata and is rendered with Jinja2 in a sandbox, as
Hugging Face's tokenizers do. A model without a template gets ChatML, which most small
instruct models understand.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import date
from functools import lru_cache
from typing import Any, Protocol

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from reame_core.errors import RequestError
from reame_core.hooktypes import ModelInfo

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
ROLES = ("system", "user", "assistant", "tool", "developer")


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return date.today().strftime(fmt)


@lru_cache(maxsize=8)
def _compile(source: str) -> Any:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def message_text(content: Any, index: int) -> str:
    """OpenAI content: a string, or a list of parts of which only text parts are supported."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise RequestError(
                    f"messages[{index}].content: only text parts are supported, not {kind!r}.",
                    param=f"messages[{index}].content",
                )
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    raise RequestError(
        f"messages[{index}].content must be a string or a list of text parts.",
        param=f"messages[{index}].content",
    )


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    if not messages:
        raise RequestError("'messages' must hold at least one message.", param="messages")
    normalized = []
    for index, message in enumerate(messages):
        role = message.get("role")
        if role not in ROLES:
            raise RequestError(
                f"messages[{index}].role must be one of {', '.join(ROLES)}.",
                param=f"messages[{index}].role",
            )
        role = "system" if role == "developer" else role
        normalized.append(
            {"role": str(role), "content": message_text(message.get("content"), index)}
        )
    return normalized


def render_chat(
    messages: Sequence[Mapping[str, Any]],
    template: str | None,
    *,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
) -> str:
    """The prompt text for `messages`, ending where the assistant's reply begins."""
    normalized = normalize_messages(messages)
    try:
        return str(
            _compile(template or CHATML).render(
                messages=normalized,
                add_generation_prompt=add_generation_prompt,
                bos_token=bos_token,
                eos_token=eos_token,
            )
        )
    except TemplateError as error:
        raise RequestError(
            f"The chat template refused these messages: {error}", param="messages"
        ) from error


class _Tokenizer(Protocol):
    @property
    def info(self) -> ModelInfo: ...

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]: ...

    def token_bytes(self, token: int, *, special: bool = False) -> bytes: ...


def encode_chat(
    backend: _Tokenizer,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
) -> list[int]:
    """Render `messages` with the model's template and tokenize, control tokens included.

    The template decides where BOS goes (through ``bos_token``); a model that wants BOS
    gets one prepended only if the template did not write it.
    """
    info = backend.info

    def special_text(token: int | None) -> str:
        if token is None:
            return ""
        return backend.token_bytes(token, special=True).decode("utf-8", "replace")

    text = render_chat(
        messages,
        info.chat_template,
        bos_token=special_text(info.bos),
        eos_token=special_text(info.eos),
        add_generation_prompt=add_generation_prompt,
    )
    tokens = backend.tokenize(text, add_special=False, parse_special=True)
    if info.add_bos and info.bos is not None and (not tokens or tokens[0] != info.bos):
        tokens.insert(0, info.bos)
    return tokens
