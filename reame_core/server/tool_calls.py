"""Tool calls read back from a reply's text, as OpenAI returns them: whole, or streamed.

The model writes calls in the wire format of `reame_core.tools`. A `ToolCallReader` reads one
choice's text as it arrives and splits it into content and calls: text that may open a call
is held back; a call goes out as soon as its function's name is complete (its id, type and
name), then its arguments in fragments as the model writes them. A whole reply is the same
reading done at once (`message`), so a streamed reply and a whole one always agree.

A block whose JSON names no function with arguments stays content, as written. When
max_tokens cuts a call off, the call keeps the arguments written so far (the finish_reason
says "length"), and a call cut off before its name stays content.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from reame_core.tools import CALL_CLOSE, CALL_OPEN


@dataclass(frozen=True)
class CallStart:
    """A call begins: the first fragment of call `index` (its arguments follow)."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ArgumentsPart:
    """More of call `index`'s arguments, as JSON text."""

    index: int
    text: str


Piece = str | CallStart | ArgumentsPart
"""What a reader makes of text: content (a str) or a part of a call."""

# The head of a call's JSON body, up to the first character of its arguments. The wire
# format writes it one way; other spacing is read too, since a model may write a call
# unconstrained.
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]*)"\s*,\s*"arguments"\s*:\s*(?=\S)')


class _ValueEnd:
    """Finds where one JSON value ends in text that arrives piece by piece."""

    def __init__(self) -> None:
        self.done = False
        self._started = False
        self._scalar = False  # a number, true, false or null: ends before a delimiter
        self._depth = 0
        self._in_string = False
        self._escaped = False

    def feed(self, text: str) -> int:
        """How many characters of `text` belong to the value; `done` once it is complete."""
        for i, char in enumerate(text):
            if not self._started:
                self._started = True
                self._depth = 1 if char in "{[" else 0
                self._in_string = char == '"'
                self._scalar = char not in '{["'
            elif self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._in_string = False
                    if self._depth == 0:
                        self.done = True
                        return i + 1
            elif self._scalar:
                if char in ",}] \t\r\n":
                    self.done = True
                    return i
            elif char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            elif char in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self.done = True
                    return i + 1
        return len(text)


class ToolCallReader:
    """One choice's text, as it arrives, split into content and tool calls."""

    def __init__(self) -> None:
        self._state: Literal["text", "head", "arguments", "tail"] = "text"
        self._held = ""  # text read but not yet given out
        self._calls = 0
        self._value = _ValueEnd()

    @property
    def called(self) -> bool:
        """Whether the text holds at least one call."""
        return self._calls > 0

    def feed(self, text: str) -> list[Piece]:
        """Read more of the reply; returns what can be given out now."""
        self._held += text
        pieces: list[Piece] = []
        while self._step(pieces):
            pass
        return pieces

    def close(self) -> list[Piece]:
        """The reply ended: give out what was held back."""
        held, self._held = self._held, ""
        if self._state == "head":  # cut off before the function's name
            return [CALL_OPEN + held]
        if self._state == "text" and held and (not self.called or held.strip()):
            return [held]
        return []

    def _step(self, pieces: list[Piece]) -> bool:
        """Read as far as the held text allows in the current state; True to go on."""
        held = self._held
        if self._state == "text":
            start = held.find(CALL_OPEN)
            if start < 0:
                keep = len(held) - len(_tail_to_hold(held))
                if keep:
                    pieces.append(held[:keep])
                    self._held = held[keep:]
                return False
            if held[:start].strip():
                pieces.append(held[:start].rstrip())
            self._held = held[start + len(CALL_OPEN) :]
            self._state = "head"
            return True
        if self._state == "head":
            head = _HEAD.match(held)
            if head is not None:
                pieces.append(CallStart(self._calls, _call_id(), head[1]))
                self._held = held[head.end() :]
                self._state, self._value = "arguments", _ValueEnd()
                return True
            end = held.find(CALL_CLOSE)
            if end < 0:
                return False
            pieces.extend(self._whole_call(held[:end]))
            self._held = held[end + len(CALL_CLOSE) :]
            self._state = "text"
            return True
        if self._state == "arguments":
            used = self._value.feed(held)
            if used:
                pieces.append(ArgumentsPart(self._calls, held[:used]))
            self._held = held[used:]
            if not self._value.done:
                return False
            self._calls += 1
            self._state = "tail"
            return True
        end = held.find(CALL_CLOSE)  # the tail: the body's closing brace, then the marker
        if end < 0:
            return False
        self._held = held[end + len(CALL_CLOSE) :]
        self._state = "text"
        return True

    def _whole_call(self, body: str) -> list[Piece]:
        """A call block written in another layout, read once it is complete."""
        try:
            call = json.loads(body)
        except ValueError:
            call = None
        if (
            not isinstance(call, dict)
            or not isinstance(call.get("name"), str)
            or "arguments" not in call
        ):
            return [CALL_OPEN + body + CALL_CLOSE]
        arguments = call["arguments"]
        text = arguments if isinstance(arguments, str) else json.dumps(arguments)
        index, self._calls = self._calls, self._calls + 1
        return [CallStart(index, _call_id(), call["name"]), ArgumentsPart(index, text)]


def _tail_to_hold(text: str) -> str:
    """The end of `text` that may still become part of a call: the start of the marker,
    and the whitespace before it (dropped if a call follows)."""
    for size in range(min(len(CALL_OPEN) - 1, len(text)), 0, -1):
        if text.endswith(CALL_OPEN[:size]):
            rest = text[:-size]
            return text[len(rest.rstrip()) :]
    return text[len(text.rstrip()) :]


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def delta(pieces: Sequence[Piece]) -> dict[str, Any]:
    """A chunk's delta for `pieces`: their content, and their calls' fragments, one entry per
    call (OpenAI's streaming shape: id, type and name only in a call's first fragment)."""
    content = "".join(piece for piece in pieces if isinstance(piece, str))
    calls: list[dict[str, Any]] = []
    for piece in pieces:
        if isinstance(piece, CallStart):
            calls.append(
                {
                    "index": piece.index,
                    "id": piece.id,
                    "type": "function",
                    "function": {"name": piece.name, "arguments": ""},
                }
            )
        elif isinstance(piece, ArgumentsPart):
            if calls and calls[-1]["index"] == piece.index:
                calls[-1]["function"]["arguments"] += piece.text
            else:
                calls.append({"index": piece.index, "function": {"arguments": piece.text}})
    body: dict[str, Any] = {}
    if content:
        body["content"] = content
    if calls:
        body["tool_calls"] = calls
    return body


def message(text: str) -> dict[str, Any]:
    """A whole reply's message: content, and tool calls if the text holds any (content is
    then null unless the model also wrote text)."""
    reader = ToolCallReader()
    whole = delta([*reader.feed(text), *reader.close()])
    calls = whole.get("tool_calls")
    if not calls:
        return {"role": "assistant", "content": whole.get("content", "")}
    return {
        "role": "assistant",
        "content": whole.get("content"),
        "tool_calls": [
            {"id": call["id"], "type": "function", "function": call["function"]} for call in calls
        ],
    }
