"""Proves each candidate's constraint sees the model's raw row: a constraint that is not
idempotent (it bans whatever token is most likely in the row it is given) must ban only
the model's favourite, for every candidate of an n > 1 request."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import SequenceView


@hookimpl
def reame_constrain_logits(seq: SequenceView, pending: Sequence[int], logits: np.ndarray) -> None:
    logits[int(np.argmax(logits))] = -np.inf
