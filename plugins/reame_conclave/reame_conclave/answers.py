"""What a candidate answered: the extractors that read an answer out of its text.

Voting compares answers, not texts: two candidates that reason differently and end on
"42" agree. Each extractor takes the text and the request's argument for it and returns
the answer normalised (so equal answers compare equal) or None when the text has none.
Pure functions; other plugins add their own through ``reame_answer_extractors``.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Mapping
from typing import Any

import regex

from reame_core.hooktypes import AnswerExtractor

# A number as people write it: sign, thousands separators, decimals, a fraction.
_NUMBER = re.compile(r"(?<![\w.])[-+\u2212]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?(?![\w])")
# The words that lead an answer line, dropped before comparing ("Answer: Paris").
_LEAD = re.compile(r"^(?:(?:the\s+)?(?:final\s+)?answer\s*(?:is)?\s*[:=]?\s*|a\s*[:.]\s*)", re.I)
# "Answer: 12", "The final answer is 12.", "**Answer:** 12": the rest of that line.
_MARKED = re.compile(r"(?:final\s+)?answer\W{0,3}\s*(?:is|:|=)\W{0,3}[ \t]*([^\n]*)", re.I)
LINE_LIMIT = 120  # longer last lines are prose, not a short answer
PATTERN_LIMIT = 1000
REGEX_SECONDS = 0.05


def normalise_text(text: str) -> str:
    """Case, spacing, Unicode forms and surrounding punctuation do not make answers differ."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = re.sub(r"[*_`]", "", text)  # markdown emphasis around an answer
    text = " ".join(text.split())
    return text.strip(" .,;:!?\"'()[]")


def normalise_number(text: str) -> str | None:
    """ "1,000", "+1000" and "1000.0" are one answer; None if `text` is not a number."""
    text = text.replace("\u2212", "-").replace(",", "").lstrip("+")
    try:
        if "/" in text:
            top, bottom = text.split("/")
            if float(bottom) == 0:
                return None
            value = float(top) / float(bottom)
        else:
            value = float(text)
    except ValueError:
        return None
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(round(value, 9))


def final_number(text: str, argument: str | None = None) -> str | None:
    """The last number in the text."""
    found = _NUMBER.findall(text)
    return normalise_number(found[-1]) if found else None


def final_line(text: str, argument: str | None = None) -> str | None:
    """The last non-empty line, without a leading "Answer:", if it is short."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return None
    line = _LEAD.sub("", normalise_text(lines[-1]))
    return line if line and len(line) <= LINE_LIMIT else None


def default_answer(text: str, argument: str | None = None) -> str | None:
    """What follows the last "Answer:" (or "the answer is") when the text says it: its
    first number, else that line. Otherwise the final number when there is one
    (arithmetic, counts, amounts), else the final short line (a label, a name, yes or no)."""
    marked = _MARKED.findall(text)
    if marked:
        said = marked[-1].strip()
        number = _NUMBER.search(said)
        return normalise_number(number.group(0)) if number else final_line(said)
    return final_number(text) or final_line(text)


def through_marked_answer(text: str) -> str | None:
    """The text up to the end of the line where it last says its answer ("Answer: 12"),
    or None if it never does: what a candidate cut off by max_tokens had settled on."""
    found = list(_MARKED.finditer(text))
    return text[: found[-1].end()] if found and found[-1].group(1).strip() else None


def whole_text(text: str, argument: str | None = None) -> str | None:
    """The whole text, normalised: for answers that are the text itself (a label)."""
    return normalise_text(text) or None


def regex_match(text: str, argument: str | None) -> str | None:
    """The last match of the pattern (its first group, if it has one). A pattern that
    backtracks for longer than `REGEX_SECONDS` finds nothing rather than stall the engine."""
    if not argument:
        return None
    try:
        matches = list(regex.finditer(argument, text, timeout=REGEX_SECONDS))
    except (TimeoutError, regex.error):
        return None
    if not matches:
        return None
    last = matches[-1]
    found = last.group(1) if last.re.groups else last.group(0)
    return normalise_text(found) or None if found is not None else None  # group may not match


def check_pattern(pattern: str) -> str | None:
    """Why the pattern cannot be used, or None."""
    if len(pattern) > PATTERN_LIMIT:
        return f"is longer than {PATTERN_LIMIT} characters"
    try:
        regex.compile(pattern)
    except regex.error as error:
        return f"is not a regular expression: {error}"
    return None


def json_field(text: str, argument: str | None) -> str | None:
    """A field of the JSON object the text holds, by a dotted path ("invoice.total",
    "items.0.name"); the whole object when no path is given. Objects and lists compare by
    their canonical JSON."""
    value = _json_value(text)
    for part in (argument or "").split(".") if argument else ():
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif (
            isinstance(value, list)
            and part.lstrip("-").isdigit()
            and -len(value) <= int(part) < len(value)
        ):
            value = value[int(part)]
        else:
            return None
    if value is None:
        return None
    if isinstance(value, str):
        return normalise_text(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return normalise_number(repr(value))
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _json_value(text: str) -> Any:
    """The JSON value of the text, or of its first {...} or [...] (a model may wrap it)."""
    decoder = json.JSONDecoder()
    text = text.strip()
    for start in [0, *(i for i, char in enumerate(text) if char in "{[")]:
        try:
            return decoder.raw_decode(text, start)[0]
        except ValueError:
            continue
    return None


BUILTIN: Mapping[str, AnswerExtractor] = {
    "auto": default_answer,
    "number": final_number,
    "line": final_line,
    "text": whole_text,
    "regex": regex_match,
    "json": json_field,
}
NEEDS_ARGUMENT = frozenset({"regex"})
