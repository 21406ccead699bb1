"""Where two paths may part ways: only where the plain path was nearly undecided.

On builds and configurations that do not guarantee bit-exact logits along another path
(see ../shared DESIGN "Determinism"), outputs must be equal up to their first divergence,
and there the plain path's two best tokens must be close: a near-tie.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from reame_core.backend.base import Backend, Batch

NEAR_TIE = 1.0  # top-2 logit gap below which the plain path was nearly undecided


def top_two_gap(backend: Backend, tokens: Sequence[int]) -> float:
    """How far apart the two best next tokens are after `tokens`, on the plain path:
    one sequence alone in an empty KV. EOG tokens are masked, as `ignore_eos` does."""
    for seq_id in range(backend.info.n_seq_max):
        backend.seq_rm(seq_id, -1, -1)
    n_batch = backend.info.n_batch
    for start in range(0, len(tokens), n_batch):
        batch = Batch()
        for position in range(start, min(start + n_batch, len(tokens))):
            batch.add(tokens[position], position, 0, position == len(tokens) - 1)
        logits = backend.decode(batch)
    row = np.array(logits[0], dtype=np.float64, copy=True)
    row[list(backend.info.eog)] = -np.inf
    second, best = np.sort(row)[-2:]
    backend.seq_rm(0, -1, -1)
    return float(best - second)
