"""Proves `reame_forced_end` saves the steps of an ending nothing else could replace: with
``answer`` set, the output is exactly those tokens (the constraint admits nothing else, then
only the end), and the engine commits all but the first without computing their steps."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import ModelInfo, SequenceView
from reame_core.settings import Settings

FIELD = "answer"
end_of_generation: list[int] = []


@hookimpl
def reame_configure(settings: Settings, model: ModelInfo) -> None:
    end_of_generation[:] = sorted(model.eog)


@hookimpl
def reame_request_extensions() -> Mapping[str, str]:
    return {FIELD: "token ids the answer must be, in order, and then end"}


def _remaining(seq: SequenceView, ahead: int = 0) -> list[int] | None:
    answer = seq.extensions.get(FIELD)
    return None if answer is None else list(answer)[len(seq.output_tokens) + ahead :]


@hookimpl
def reame_constrain_logits(seq: SequenceView, pending: Sequence[int], logits: np.ndarray) -> None:
    remaining = _remaining(seq, len(pending))
    if remaining is None:
        return
    allowed = remaining[:1] or end_of_generation
    values = logits[allowed]
    logits.fill(-np.inf)
    logits[allowed] = values


@hookimpl
def reame_forced_end(seq: SequenceView) -> Sequence[int] | None:
    remaining = _remaining(seq)
    return None if remaining is None else tuple(remaining)
