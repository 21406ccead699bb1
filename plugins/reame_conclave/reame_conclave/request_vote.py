"""A request's vote, read from its fields: how many candidates, what counts as their answer,
when the vote may stop, and how many start at once.

    "best_of": 5,
    "vote": {"answer": "auto" | "number" | "line" | "text" | "regex" | "json" | <extractor>,
             "pattern": "...",   # for "regex"
             "field": "a.b",     # for "json" (optional)
             "rule": "adaptive" | "window" | "majority" | "all",
             "confidence": 0.95, "window": 3, "wave": 3}

Anything unset comes from the server's ``[plugins.conclave]`` settings. Every problem is a
`RequestError` naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reame_conclave.answers import NEEDS_ARGUMENT, check_pattern
from reame_conclave.voting import Rule, StopRule
from reame_core.errors import RequestError
from reame_core.hooktypes import AnswerExtractor


class ConclaveSettings(BaseModel):
    """The ``[plugins.conclave]`` section: defaults for requests that do not say."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(default=0.7, ge=0.0, le=2.0)  # when the request sets none
    rule: Rule = "adaptive"
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    window: int = Field(default=3, ge=2)
    wave: int = Field(default=0, ge=0)  # candidates started at once; 0: as many as slots allow
    max_best_of: int = Field(default=16, ge=1, le=256)


class _VoteField(BaseModel):
    model_config = ConfigDict(extra="forbid")

    answer: str = "auto"
    pattern: str | None = None
    field: str | None = Field(default=None, max_length=500)
    rule: Rule | None = None
    confidence: float | None = Field(default=None, gt=0.5, lt=1.0)
    window: int | None = Field(default=None, ge=2)
    wave: int | None = Field(default=None, ge=1)


@dataclass(frozen=True)
class Vote:
    """What one request's vote does."""

    best_of: int
    answer: str
    argument: str | None
    rule: StopRule
    wave: int  # 0: as many as the server's slots


def read_vote(
    extensions: Mapping[str, Any],
    n: int,
    settings: ConclaveSettings,
    extractors: Mapping[str, AnswerExtractor],
) -> Vote | None:
    """The request's vote, or None when it asks for none (no `best_of`, or one candidate
    per choice)."""
    best_of = extensions.get("best_of")
    raw = extensions.get("vote")
    if best_of is None:
        if raw is not None:
            raise RequestError(
                "'vote' needs 'best_of': the candidates to vote among.", param="vote"
            )
        return None
    if isinstance(best_of, bool) or not isinstance(best_of, int):
        raise RequestError("'best_of' must be an integer.", param="best_of")
    if not 1 <= best_of <= settings.max_best_of:
        raise RequestError(
            f"'best_of' must be between 1 and {settings.max_best_of} on this server.",
            param="best_of",
        )
    if best_of < n:
        raise RequestError(f"'best_of' ({best_of}) must be at least 'n' ({n}).", param="best_of")
    try:
        field = _VoteField.model_validate(raw or {})
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise RequestError(
            f"Invalid 'vote{'.' + where if where else ''}': {first['msg']}.",
            param=f"vote.{where}" if where else "vote",
        ) from error
    if field.answer not in extractors:
        known = ", ".join(sorted(extractors))
        raise RequestError(
            f"'vote.answer' {field.answer!r} is not an answer extractor here ({known}).",
            param="vote.answer",
        )
    argument = field.pattern if field.answer == "regex" else field.field
    if field.answer in NEEDS_ARGUMENT and not argument:
        raise RequestError("'vote.answer' \"regex\" needs 'vote.pattern'.", param="vote.pattern")
    if field.answer == "regex" and argument is not None:
        problem = check_pattern(argument)
        if problem:
            raise RequestError(f"'vote.pattern' {problem}.", param="vote.pattern")
    if best_of == n:
        return None  # every candidate is returned: nothing to vote on
    rule = StopRule(
        field.rule or settings.rule,
        settings.confidence if field.confidence is None else field.confidence,
        field.window or settings.window,
    )
    return Vote(best_of, field.answer, argument, rule, field.wave or settings.wave)
