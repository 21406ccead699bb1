"""`reame run`: one answer and exit, or a chat REPL that keeps the conversation.

Between REPL turns the conversation's KV stays resident in its slot, so each turn
prefills only the new message.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TextIO

from reame_core.chat import encode_chat
from reame_core.cli.main import request_extensions
from reame_core.errors import ContextOverflowError, RequestError
from reame_core.request import GenerationRequest, SamplingParams, TokenEvent, context_room
from reame_core.runtime import Runtime, start_runtime
from reame_core.settings import Settings

HELP = """Commands:
  /set temperature 0.7   /set max_tokens 200   /set seed 42   /set system You are terse.
  /clear                 forget the conversation
  /bye                   leave (also Ctrl-D)"""


@dataclass
class Conversation:
    """The chat so far, and what each of its requests asks: sampling and the request fields
    plugins' flags set (a grammar, a schema). `unset`: the sampling settings the user left
    at their defaults (a plugin may choose them: best-of-N samples at its temperature)."""

    params: SamplingParams
    system: str | None = None
    messages: list[dict[str, str]] = field(default_factory=list)
    extensions: dict[str, Any] = field(default_factory=dict)
    unset: frozenset[str] = frozenset()

    def with_system(self) -> list[dict[str, str]]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.messages


def run_command(settings: Settings, args: argparse.Namespace, prompt: str) -> int:
    piped = "" if sys.stdin.isatty() else sys.stdin.read()
    text = "\n\n".join(part for part in (piped.strip(), prompt.strip()) if part)
    temperature = 0.0 if args.temperature is None else args.temperature
    params = SamplingParams(max_tokens=args.max_tokens, temperature=temperature, seed=args.seed)
    conversation = Conversation(
        params,
        args.system,
        extensions=request_extensions(args),
        unset=frozenset({"temperature"}) if args.temperature is None else frozenset(),
    )
    runtime = start_runtime(settings)
    try:
        if text or not sys.stdin.isatty():
            if not text:
                print("reame: nothing to answer (empty prompt)", file=sys.stderr)
                return 1
            conversation.messages.append({"role": "user", "content": text})
            reply(runtime, conversation, sys.stdout)
            return 0
        # Python installs Ctrl-C's KeyboardInterrupt only where SIGINT was not ignored at
        # start, and a command a script runs in the background inherits it ignored.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        return repl(runtime, conversation, input, sys.stdout)
    finally:
        runtime.close()


def reply(runtime: Runtime, conversation: Conversation, out: TextIO) -> str:
    """Generate the assistant's turn, streaming it to `out`, and append it."""
    model = runtime.backend.info
    tokens = encode_chat(model, conversation.with_system())
    room = context_room(len(tokens), model)
    params = replace(conversation.params, max_tokens=min(conversation.params.max_tokens, room))

    def show(event: TokenEvent) -> None:
        out.write(event.text)
        out.flush()

    # The conversation is a session: its KV stays pinned, and is made exactly reusable
    # while the user types the next turn.
    request = GenerationRequest(
        tokens,
        params,
        extensions=conversation.extensions,
        session_id="reame-run",
        unset=conversation.unset,
    )
    try:
        finished = runtime.engine.generate(request, on_event=show)
    except ContextOverflowError as error:
        raise RequestError(f"{error.message} /clear to start over.") from error
    out.write("\n")
    out.flush()
    if finished.error:
        raise RequestError(finished.error)
    answer = finished.candidates[0].text
    conversation.messages.append({"role": "assistant", "content": answer})
    return answer


def repl(
    runtime: Runtime, conversation: Conversation, read: Callable[[str], str], out: TextIO
) -> int:
    out.write(f"Chatting with {runtime.backend.info.name}. /? for help, /bye to leave.\n")
    while True:
        try:
            line = read(">>> ").strip()
        except EOFError:
            out.write("\n")
            return 0
        except KeyboardInterrupt:
            out.write("\n")
            continue
        if not line:
            continue
        if line.startswith("/"):
            if command(line, conversation, out):
                return 0
            continue
        conversation.messages.append({"role": "user", "content": line})
        try:
            reply(runtime, conversation, out)
        except KeyboardInterrupt:
            conversation.messages.pop()
            out.write("\n(interrupted)\n")
        except RequestError as error:
            conversation.messages.pop()
            out.write(f"error: {error}\n")


def command(line: str, conversation: Conversation, out: TextIO) -> bool:
    """Handle a /command; True means leave."""
    name, _, rest = line[1:].partition(" ")
    if name in ("bye", "exit", "quit"):
        return True
    if name == "clear":
        conversation.messages.clear()
        out.write("Conversation cleared.\n")
    elif name == "set":
        key, _, value = rest.strip().partition(" ")
        try:
            apply_setting(conversation, key, value.strip())
            out.write(f"Set {key} = {value.strip()}\n")
        except (ValueError, RequestError) as error:
            out.write(f"error: {error}\n")
    else:
        out.write(HELP + "\n")
    return False


def apply_setting(conversation: Conversation, key: str, value: str) -> None:
    if key == "system":
        conversation.system = value or None
        return
    converters: dict[str, Callable[[str], object]] = {
        "temperature": float,
        "top_p": float,
        "top_k": int,
        "min_p": float,
        "max_tokens": int,
        "seed": int,
        "repeat_penalty": float,
    }
    if key not in converters:
        raise ValueError(f"unknown setting {key!r}; one of {', '.join(converters)}, system")
    converted: Any = converters[key](value)
    conversation.params = replace(conversation.params, **{key: converted})
    conversation.unset -= {key}
