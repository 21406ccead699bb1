"""Chat messages to prompt text, with the model's own chat template.

The template comes from the GGUF metadata and is rendered with Jinja2 in a sandbox, as
Hugging Face's tokenizers do. A model without a template gets ChatML, which most small
instruct models understand.

The API's schema has already checked the messages' shape (roles, at least one message);
what is checked here is what only rendering can tell: content parts other than text, and
messages the template itself refuses.

Tools reach the prompt as Hugging Face passes them: a template that renders tools (Qwen2.5's
does) gets the functions as ``tools`` and the conversation's calls and results as messages.
For any other template the functions and the call format are written into the system
message (`tools.instructions`), earlier calls into the assistant's text in the wire format,
and results into a user message, each within ``<tool_response>`` tags.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import date
from functools import lru_cache
from typing import Any

from jinja2 import TemplateError, meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from reame_core.engine.slots import common_prefix
from reame_core.errors import RequestError
from reame_core.hooktypes import ModelInfo
from reame_core.tools import FunctionTool, ToolUse, call_text, instructions, response_text

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return date.today().strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """Hugging Face's `tojson`: keys in their order, no HTML escaping. Templates write tool
    signatures and arguments with it, and the model was trained on what this writes."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.filters["tojson"] = _tojson
    return env


@lru_cache(maxsize=8)
def _compile(source: str) -> Any:
    return _environment().from_string(source)


@lru_cache(maxsize=8)
def _renders_tools(source: str) -> bool:
    """Whether a template reads the ``tools`` variable (and so renders calls itself)."""
    return "tools" in meta.find_undeclared_variables(_environment().parse(source))


def message_text(content: str | Sequence[Any] | None, index: int) -> str:
    """OpenAI content: a string, or a list of parts of which only text parts are supported."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    param = f"messages[{index}].content"
    texts = []
    for part in content:
        if not isinstance(part, Mapping) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            raise RequestError(
                f"'{param}' holds a part of type {kind!r}; this server takes text only "
                "(parts of type 'text').",
                param=param,
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise RequestError(f"A text part of '{param}' needs a string 'text'.", param=param)
        texts.append(text)
    return "".join(texts)


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Roles and text as templates expect them (``developer`` is read as ``system``); an
    assistant's calls with decoded arguments, and a tool result with the function's name."""
    normalized: list[dict[str, Any]] = []
    called: dict[str, str] = {}  # tool_call_id -> function name
    for index, message in enumerate(messages):
        role = str(message["role"])
        entry: dict[str, Any] = {
            "role": "system" if role == "developer" else role,
            "content": message_text(message.get("content"), index),
        }
        if message.get("tool_calls"):
            entry["tool_calls"] = [_call(call, called) for call in message["tool_calls"]]
        if role == "tool":
            call_id = str(message.get("tool_call_id", ""))
            entry["tool_call_id"] = call_id
            entry["name"] = message.get("name") or called.get(call_id, "")
        normalized.append(entry)
    return normalized


def _call(call: Mapping[str, Any], called: dict[str, str]) -> dict[str, Any]:
    """An assistant's call as templates read it: arguments decoded from OpenAI's JSON string
    (kept as the string when it is not JSON)."""
    function = call["function"]
    called[str(call.get("id", ""))] = function["name"]
    try:
        arguments = json.loads(function["arguments"])
    except (TypeError, ValueError):
        arguments = function["arguments"]
    return {
        "id": call.get("id", ""),
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
    }


def _written_in_text(
    messages: list[dict[str, Any]], functions: Sequence[FunctionTool]
) -> list[dict[str, Any]]:
    """`messages` for a template that knows nothing of tools: the functions and the call
    format in the system message, calls in the assistant's text, results as user text."""
    written: list[dict[str, Any]] = []
    after_result = False
    for message in messages:
        if message["role"] == "tool":
            response = response_text(message["content"])
            if after_result:  # consecutive results share one user message
                written[-1]["content"] += "\n" + response
            else:
                written.append({"role": "user", "content": response})
            after_result = True
            continue
        after_result = False
        calls = [
            call_text(call["function"]["name"], call["function"]["arguments"])
            for call in message.get("tool_calls", ())
        ]
        text = "\n".join(part for part in (message["content"], *calls) if part)
        written.append({"role": message["role"], "content": text})
    if functions:
        block = instructions(functions)
        if written and written[0]["role"] == "system":
            written[0]["content"] = f"{written[0]['content']}\n\n{block}"
        else:
            written.insert(0, {"role": "system", "content": block})
    return written


def render_chat(
    messages: Sequence[Mapping[str, Any]],
    template: str | None,
    *,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    functions: Sequence[FunctionTool] = (),
) -> str:
    """The prompt text for `messages`, ending where the assistant's reply begins; the
    model is offered `functions` to call."""
    source = template or CHATML
    normalized = normalize_messages(messages)
    variables: dict[str, Any] = {}
    if _renders_tools(source):
        if functions:
            variables["tools"] = [function.definition() for function in functions]
    else:
        normalized = _written_in_text(normalized, functions)
    try:
        return str(
            _compile(source).render(
                messages=normalized,
                add_generation_prompt=add_generation_prompt,
                bos_token=bos_token,
                eos_token=eos_token,
                **variables,
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
    tools: ToolUse | None = None,
) -> list[int]:
    """Render `messages` with the model's template and tokenize, control tokens included.
    The functions of `tools` are in the prompt unless calls are off (``tool_choice``
    "none").

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
        functions=tools.functions if tools is not None and tools.calls_allowed else (),
    )
    tokens = vocab.tokenize(text, add_special=False, parse_special=True)
    if model.add_bos and model.bos is not None and (not tokens or tokens[0] != model.bos):
        tokens.insert(0, model.bos)
    return tokens


def user_turn_opening(model: ModelInfo) -> tuple[int, ...]:
    """The tokens that open a user's turn after an earlier turn's end-of-turn token, before
    its text: the same whatever the text says (ChatML's newline, `<|im_start|>user` and
    newline). Empty where the template writes no turn before the user's (a system message
    folded into the first user turn) or no such constant opening."""
    first, second = (
        encode_chat(
            model,
            [{"role": "system", "content": "S"}, {"role": "user", "content": text}],
            add_generation_prompt=False,
        )
        for text in ("Alpha", "Omega")
    )
    shared = common_prefix(first, second)
    turn_end = next((i + 1 for i in range(shared) if first[i] in model.eog), None)
    return () if turn_end is None else tuple(first[turn_end:shared])
