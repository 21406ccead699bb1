"""llguidance's token bitmask applied to one row of float32 logits, in place.

A mask holds one bit per token (32 tokens per int32 word, least significant bit first).
The row keeps its values where the bit is set and becomes -inf elsewhere. Most positions
of a structured answer allow a handful of tokens (punctuation, a schema's keys, an enum's
values): their bits sit in a few words, so the row is refilled around those tokens alone.
Elsewhere (inside a free string) the bits are unpacked into a boolean vector that writes
-inf through it. `benchmarks/grammar_mask_cost.py` measures both.

Where the grammar may end, llguidance sets the bit of its one EOS token; the model may end
on any of its end-of-generation tokens, so they are all let through then.
"""

from __future__ import annotations

import numpy as np

# Masks whose set bits fall in at most this many words take the sparse path.
FEW_WORDS = 16
_BITS = np.arange(32, dtype=np.int64)


def apply(logits: np.ndarray, mask: np.ndarray, eos: int, eog: np.ndarray) -> None:
    """Set `logits` to -inf outside `mask`; if `mask` allows `eos`, it allows `eog` too."""
    words = np.flatnonzero(mask)
    if len(words) <= FEW_WORDS:
        keep_only(logits, _with_eog(allowed_ids(mask, words, len(logits)), eos, eog))
        return
    allowed = np.unpackbits(mask.view(np.uint8), count=len(logits), bitorder="little")
    allowed = allowed.view(np.bool_)
    if allowed[eos]:
        allowed[eog] = True
    np.copyto(logits, -np.inf, where=~allowed)


def allowed_ids(mask: np.ndarray, words: np.ndarray, n_vocab: int) -> np.ndarray:
    """The token ids whose bits are set in `words` (indices of the mask's non-zero words)."""
    bits = np.unpackbits(mask[words].view(np.uint8), bitorder="little").reshape(len(words), 32)
    ids = (words[:, None] * 32 + _BITS)[bits.view(np.bool_)]
    return ids[ids < n_vocab]


def only(mask: np.ndarray, token: int) -> bool:
    """Whether `mask` allows `token` and nothing else."""
    word = token // 32
    return (
        0 <= word < len(mask)
        and int(mask[word].view(np.uint32)) == 1 << (token % 32)
        and np.count_nonzero(mask) == 1
    )


def _with_eog(ids: np.ndarray, eos: int, eog: np.ndarray) -> np.ndarray:
    return np.union1d(ids, eog) if eos in ids else ids


def keep_only(logits: np.ndarray, tokens: np.ndarray) -> None:
    """Set `logits` to -inf everywhere but at `tokens`."""
    values = logits[tokens]
    logits.fill(-np.inf)
    logits[tokens] = values
