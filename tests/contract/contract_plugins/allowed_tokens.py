"""Proves `reame_constrain_logits` decides the output: with ``allowed_tokens`` set, every
generated token is one of them, whatever the model prefers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import SequenceView

FIELD = "allowed_tokens"


@hookimpl
def reame_request_extensions() -> Mapping[str, str]:
    return {FIELD: "token ids the output may consist of"}


@hookimpl
def reame_constrain_logits(seq: SequenceView, pending: Sequence[int], logits: np.ndarray) -> None:
    allowed = seq.extensions.get(FIELD)
    if allowed is not None:
        mask = np.full(logits.shape, -np.inf, dtype=logits.dtype)
        mask[list(allowed)] = 0.0
        logits += mask
