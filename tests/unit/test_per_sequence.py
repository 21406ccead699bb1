"""State kept per sequence: made once from the prompt, fed each committed token once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

from reame_core.hooktypes import SequenceView
from reame_core.per_sequence import PerSequence


@dataclass
class Seq:
    key: int
    prompt_tokens: list[int]
    output_tokens: list[int] = field(default_factory=list)

    def view(self) -> SequenceView:  # the fields PerSequence reads
        return cast(SequenceView, self)


@dataclass
class Reader:
    read: list[int]
    calls: int = 0

    def extend(self, tokens: Sequence[int]) -> None:
        self.read.extend(tokens)
        self.calls += 1


def test_state_starts_from_the_prompt_and_reads_each_output_token_once() -> None:
    states = PerSequence(lambda seq: Reader(list(seq.prompt_tokens)))
    seq = Seq(1, [1, 2, 3])

    first = states.of(seq.view())
    seq.output_tokens += [4, 5]
    again = states.of(seq.view())
    unchanged = states.of(seq.view())

    assert first is again is unchanged
    assert again.read == [1, 2, 3, 4, 5]
    assert again.calls == 1  # nothing new, no call


def test_sequences_keep_their_own_state_until_dropped() -> None:
    states = PerSequence(lambda seq: Reader(list(seq.prompt_tokens)))
    a, b = Seq(1, [1], [7]), Seq(2, [2])

    assert states.of(a.view()).read == [1, 7]
    assert states.of(b.view()).read == [2]
    states.drop(a.view())

    assert len(states) == 1
    assert states.of(a.view()).calls == 1  # made again: its prompt, then its output
    states.clear()
    assert len(states) == 0
