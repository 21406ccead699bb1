"""A request body read as the strict JSON OpenAI's API takes, before any schema sees it.

Python's parser accepts what that API refuses, and what would otherwise fail later, far
from its cause, as a 500:

- ``NaN``, ``Infinity`` and numbers too large for a double (``1e999``) are not JSON numbers;
- a lone UTF-16 surrogate (``"\\ud800"``) is not text: no UTF-8 encoder can write it, so a
  tokenizer, a log line or a response would fail on it;
- a NUL character ends a string wherever text reaches C (llama.cpp, Jinja's callers, logs);
- nesting beyond what the code that walks the value recursively can take: Python's parser
  raises RecursionError past about 900 levels, and a value just under that would break
  the next recursive walk instead (the JSON encoder, a chat template).

Each is refused here with a 400 that names where it is (the field path, as pydantic's
errors are named). This module only reads: what a field may hold is `schemas.py`'s concern.
"""

from __future__ import annotations

import json
import math
from typing import Any

from reame_core.errors import RequestError

# The deepest nesting of arrays and objects a body may have: twice the 128 levels a
# function's parameters or a response schema may nest (their own limits, which name the
# field, come first), and far below Python's recursion limit (1,000 frames) for whatever
# walks the value recursively after this check: the JSON encoder writing tools into a
# prompt, a chat template, a plugin reading its extension.
MAX_DEPTH = 256

_SCALARS = (int, float, bool, type(None))


class _NonFinite:
    """Where the body held NaN, Infinity or a number no double holds (found after parsing,
    so that the error can name the field)."""

    def __init__(self, text: str) -> None:
        self.text = text


def _constant(text: str) -> _NonFinite:
    return _NonFinite(text)


def _number(text: str) -> float | _NonFinite:
    value = float(text)
    return _NonFinite(text) if math.isinf(value) else value


def read_json_body(raw: bytes) -> Any:
    """The body's JSON value, or a `RequestError` that says what is wrong and where."""
    if not raw.strip():
        raise RequestError("The request body is empty; send a JSON object.")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestError(
            f"The request body is not UTF-8 text (invalid byte at offset {error.start})."
        ) from None
    try:
        value = json.loads(text, parse_constant=_constant, parse_float=_number)
    except RecursionError:
        raise _too_deep() from None
    except json.JSONDecodeError as error:
        raise RequestError(
            f"The request body is not valid JSON: {error.msg} "
            f"(line {error.lineno}, column {error.colno})."
        ) from None
    except ValueError:  # only an integer longer than Python converts (4,300 digits)
        raise RequestError("The request body holds an integer with too many digits.") from None
    _check(value)
    return value


def _too_deep() -> RequestError:
    return RequestError(
        f"The request body nests arrays and objects deeper than {MAX_DEPTH} levels."
    )


# One entry per string or container still to look at: its value, its depth, and how to name
# it (the parent's entry and the key or index under it), so a path is only built for a fault.
_Entry = tuple[Any, int, "_Entry | None", "str | int | None"]


def _check(value: Any) -> None:
    """Refuse the first non-finite number, unencodable or NUL-holding string, or nesting
    beyond `MAX_DEPTH`. Iterative, so that the check itself never recurses."""
    stack: list[_Entry] = [(value, 0, None, None)]
    while stack:
        entry = stack.pop()
        item, depth, _parent, _key = entry
        if isinstance(item, str):
            problem = _text_problem(item)
            if problem is not None:
                path = _path(entry)
                raise RequestError(f"Invalid {_named(path)}: {problem}", param=path or None)
        elif isinstance(item, _NonFinite):
            path = _path(entry)
            raise RequestError(
                f"Invalid {_named(path)}: {item.text} is not a JSON number; the API takes "
                "finite numbers only.",
                param=path or None,
            )
        elif isinstance(item, (dict, list)):
            if depth >= MAX_DEPTH:
                raise _too_deep()
            children: list[_Entry] = []
            if isinstance(item, dict):
                for key, child in item.items():
                    problem = _text_problem(key)
                    if problem is not None:
                        path = _path(entry)
                        raise RequestError(
                            f"Invalid key in {_named(path)}: {problem}", param=path or None
                        )
                    if not isinstance(child, _SCALARS):
                        children.append((child, depth + 1, entry, key))
            else:
                for index, child in enumerate(item):
                    if not isinstance(child, _SCALARS):
                        children.append((child, depth + 1, entry, index))
            stack.extend(reversed(children))  # the first fault in the body's order


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "it holds a NUL character (\\u0000), which text sent to the model may not hold."
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:
            return (
                f"it holds a lone UTF-16 surrogate (\\u{ord(text[error.start]):04x} at "
                f"character {error.start}), which is not Unicode text."
            )
    return None


def _path(entry: _Entry) -> str:
    """A value's place in the body as a field path: messages[0].content."""
    parts: list[str] = []
    current: _Entry | None = entry
    while current is not None and current[2] is not None:
        key = current[3]
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key}")
        current = current[2]
    return "".join(reversed(parts)).lstrip(".")


def _named(path: str) -> str:
    return f"'{path}'" if path else "request body"
