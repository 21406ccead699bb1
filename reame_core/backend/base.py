"""The seam between the engine and a language model runtime.

`Backend` is everything the engine needs from llama.cpp and nothing more. `LlamaBackend`
implements it over llama.cpp's C API; `FakeBackend` is a deterministic toy model that lets
every layer above run in tests without a model.

Two owners, two kinds of state:
- the decoding context (decode, sequence memory, state, threads) is not thread-safe: the
  engine thread owns it, and nothing else calls those methods;
- the vocabulary (`info.vocab`, a `hooktypes.Vocabulary`) is read-only and thread-safe, as
  llama.cpp's is: whoever builds a prompt tokenizes it on its own thread (the HTTP server in
  a worker thread, the CLI in its main thread), and whoever renders output reads token bytes
  from it. ``tokenize`` and ``token_bytes`` here are shorthands for the same object.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from reame_core.hooktypes import ModelInfo


@dataclass
class Batch:
    """The tokens of one decode step, across sequences.

    Logits are returned for the entries with `want_logits` set, in batch order.
    """

    tokens: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    seq_ids: list[int] = field(default_factory=list)
    want_logits: list[bool] = field(default_factory=list)

    def add(self, token: int, position: int, seq_id: int, want_logits: bool) -> None:
        self.tokens.append(token)
        self.positions.append(position)
        self.seq_ids.append(seq_id)
        self.want_logits.append(want_logits)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def n_outputs(self) -> int:
        return sum(self.want_logits)


class DecodeError(RuntimeError):
    """The runtime could not decode a batch (e.g. no free KV cells)."""


class Backend(Protocol):
    @property
    def info(self) -> ModelInfo: ...

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """``info.vocab.tokenize`` (any thread)."""
        ...

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        """``info.vocab.token_bytes`` (any thread)."""
        ...

    def decode(self, batch: Batch) -> np.ndarray:
        """Run one step. Returns float32 logits, shape (batch.n_outputs, n_vocab).

        The array may be a view of the runtime's buffer: valid until the next decode.
        """
        ...

    def passes(self, layout: Sequence[tuple[int, int]]) -> list[int]:
        """How a batch is cut into passes over the weights (micro-batches): the token count
        of each pass, for a batch holding `layout` = (seq_id, tokens) in batch order.
        Each pass costs about a full read of the weights, so the speculation governor
        prices a plan by its passes."""
        ...

    def seq_rm(self, seq_id: int, p0: int, p1: int = -1) -> bool:
        """Forget positions [p0, p1) of a sequence (p1 < 0: to the end)."""
        ...

    def seq_cp(self, src: int, dst: int) -> None:
        """Make `dst` a full copy of `src` (trim it afterwards with `seq_rm`)."""
        ...

    def get_seq_state(self, seq_id: int) -> bytes:
        """The sequence's KV state, serialized."""
        ...

    def set_seq_state(self, seq_id: int, state: bytes) -> bool:
        """Replace the sequence's KV with a serialized state. False if refused."""
        ...

    def set_threads(self, n_threads: int) -> None:
        """Compute with `n_threads` CPU threads from the next decode on. The results do not
        depend on the count: each output is computed whole by one thread."""
        ...

    def close(self) -> None: ...


def equal_split_passes(layout: Sequence[tuple[int, int]], n_ubatch: int) -> list[int]:
    """The passes of llama.cpp's equal split (per-sequence KV): a pass takes the same number
    of tokens from each sequence of a run of ascending consecutive sequence ids."""
    return [per_seq * n_seqs for per_seq, n_seqs in equal_split(layout, n_ubatch)]


def equal_split(layout: Sequence[tuple[int, int]], n_ubatch: int) -> list[tuple[int, int]]:
    """The passes of `equal_split_passes` as (tokens per sequence, sequences)."""
    remaining = {seq_id: n for seq_id, n in layout if n > 0}
    order = [seq_id for seq_id, n in layout if n > 0]
    passes = []
    while remaining:
        chosen: list[int] = []
        for seq_id in order:
            if seq_id in remaining and (not chosen or seq_id == chosen[-1] + 1):
                chosen.append(seq_id)
        chosen = chosen[: max(1, n_ubatch)]
        per_seq = min(min(remaining[s] for s in chosen), max(1, n_ubatch // len(chosen)))
        passes.append((per_seq, len(chosen)))
        for seq_id in chosen:
            remaining[seq_id] -= per_seq
            if remaining[seq_id] == 0:
                del remaining[seq_id]
    return passes


def simple_split_passes(n_tokens: int, n_ubatch: int) -> list[int]:
    """The passes of llama.cpp's simple split (unified KV): consecutive runs of tokens."""
    full, rest = divmod(n_tokens, n_ubatch)
    return [n_ubatch] * full + ([rest] if rest else [])
