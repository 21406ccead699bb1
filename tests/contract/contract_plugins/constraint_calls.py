"""Proves `reame_constrain_logits` is asked once per position the engine samples: it counts
its calls per candidate, with the `pending` tokens each call was given."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import SequenceView

calls: dict[tuple[str, int], list[tuple[int, ...]]] = {}


@hookimpl
def reame_constrain_logits(seq: SequenceView, pending: Sequence[int], logits: np.ndarray) -> None:
    calls.setdefault((seq.request_id, seq.candidate), []).append(tuple(pending))
