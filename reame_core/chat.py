"""Chat messages to prompt text, with the model's own chat template.

The template comes from the GGUF metadata and is rendered with Jinja2 in a sandbox, as
Hugging Face's tokenizers do. A model without a template gets ChatML, which most small
instruct models understand.

The API's schema has already checked the messages' shape (roles, at least one message);
what is checked here is what only rendering can tell: content parts other than text, and
messages the template itself refuses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import date
from functools import lru_cache
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from reame_core.errors import RequestError
from reame_core.hooktypes import ModelInfo

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


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


def message_text(content: str | Sequence[Any] | None, index: int) -> str:
    """OpenAI content: a string, or a list of parts of which only text parts are supported."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
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


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Roles and text as templates expect them (``developer`` is read as ``system``)."""
    normalized = []
    for index, message in enumerate(messages):
        role = str(message["role"])
        normalized.append(
            {
                "role": "system" if role == "developer" else role,
                "content": message_text(message.get("content"), index),
            }
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


def encode_chat(
    model: ModelInfo,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
) -> list[int]:
    """Render `messages` with the model's template and tokenize, control tokens included.

    The template decides where BOS goes (through ``bos_token``); a model that wants BOS
    gets one prepended only if the template did not write it. Any thread may call this:
    it only reads `model.vocab`.
    """
    vocab = model.vocab

    def special_text(token: int | None) -> str:
        if token is None:
            return ""
        return vocab.token_bytes(token, special=True).decode("utf-8", "replace")

    text = render_chat(
        messages,
        model.chat_template,
        bos_token=special_text(model.bos),
        eos_token=special_text(model.eos),
        add_generation_prompt=add_generation_prompt,
    )
    tokens = vocab.tokenize(text, add_special=False, parse_special=True)
    if model.add_bos and model.bos is not None and (not tokens or tokens[0] != model.bos):
        tokens.insert(0, model.bos)
    return tokens
