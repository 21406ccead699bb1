"""llguidance's token bitmask applied to one row of float32 logits, in place.

A mask holds one bit per token (32 tokens per int32 word, least significant bit first).
The row keeps its values where the bit is set and becomes -inf elsewhere. Unpacking the
bits into a boolean vector and writing -inf through it costs tens of microseconds on a
150k vocabulary (`benchmarks/grammar_mask_cost.py`); where a grammar allows only a few
tokens (inside JSON punctuation, a schema's keys), keeping those few values and refilling
the row is cheaper still.
"""

from __future__ import annotations

import numpy as np

# Below this many allowed tokens, the row is refilled around them rather than masked.
FEW = 64


def allowed_tokens(bitmask: np.ndarray, n_vocab: int) -> np.ndarray:
    """The mask as a boolean vector over the vocabulary."""
    bits = np.unpackbits(bitmask.view(np.uint8), count=n_vocab, bitorder="little")
    return bits.view(np.bool_)


def apply(logits: np.ndarray, allowed: np.ndarray) -> None:
    """Set `logits` to -inf wherever `allowed` (a boolean vector as long) is False."""
    kept = np.flatnonzero(allowed) if np.count_nonzero(allowed) <= FEW else None
    if kept is None:
        np.copyto(logits, -np.inf, where=~allowed)
        return
    values = logits[kept]
    logits.fill(-np.inf)
    logits[kept] = values


def keep_only(logits: np.ndarray, tokens: np.ndarray) -> None:
    """Set `logits` to -inf everywhere but at `tokens`."""
    values = logits[tokens]
    logits.fill(-np.inf)
    logits[tokens] = values
