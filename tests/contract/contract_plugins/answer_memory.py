"""Remembers answers in a dict (`reame_remember_answer`) and returns them
(`reame_recall_answer`); counts what it was asked."""

from __future__ import annotations

from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import ModelInfo, RecalledAnswer

answers: dict[str, RecalledAnswer] = {}
asked: list[str] = []


@hookimpl
def reame_remember_answer(key: str, answer: RecalledAnswer) -> None:
    answers[key] = answer


@hookimpl
def reame_recall_answer(key: str, model: ModelInfo) -> RecalledAnswer | None:
    asked.append(key)
    return answers.get(key)
