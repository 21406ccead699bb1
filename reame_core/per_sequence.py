"""State a draft source keeps for each decoding sequence, caught up with what it commits.

A draft source that reads a sequence's text (an n-gram index, a JSON reader, the prompt's
text for quoting) builds that state from the prompt once, then extends it with the output
tokens the sequence committed since the last call, and forgets it when the sequence ends:

    self._indexes = PerSequence(self._new_index)  # _new_index(seq): read seq.prompt_tokens
    ...
    index = self._indexes.of(request.seq)          # in reame_propose_drafts
    ...
    self._indexes.drop(seq)                        # in reame_generation_finished

(prompt lookup, `reame_core/builtins/prompt_lookup.py`, does exactly this.)

Only committed tokens are given: a draft being verified is not part of the output yet.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

from reame_core.hooktypes import SequenceView


class Extensible(Protocol):
    def extend(self, tokens: Sequence[int]) -> None:
        """Read the sequence's next output tokens."""


S = TypeVar("S", bound=Extensible)


class PerSequence(Generic[S]):
    """One `S` per sequence key: made by `start` from the sequence at its first call,
    extended with each output token once."""

    def __init__(self, start: Callable[[SequenceView], S]) -> None:
        self._start = start
        self._states: dict[int, tuple[S, int]] = {}  # key -> (state, output tokens read)

    def of(self, seq: SequenceView) -> S:
        """The sequence's state, having read all its output so far."""
        known = self._states.get(seq.key)
        state, read = known if known is not None else (self._start(seq), 0)
        output = seq.output_tokens
        if read < len(output):
            state.extend(output[read:])
        self._states[seq.key] = (state, len(output))
        return state

    def drop(self, seq: SequenceView) -> None:
        self._states.pop(seq.key, None)

    def clear(self) -> None:
        self._states.clear()

    def __len__(self) -> int:
        return len(self._states)
