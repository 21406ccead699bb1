"""Which prefixes of a prompt are worth keeping on disk, and which hits worth reading.

Chat prompts are snapshot at the end of their first `turns` turns (the prefix through an
end-of-turn token; a system prompt is the first turn): that is what many requests share.
Where the next turn opens as a user's turn does (`opening`: the template's tokens before
the user's text, ChatML's `<|im_start|>user`), the snapshot takes them in too: every
request whose next message is the user's shares them, and a model whose state can be cut
back (`prefix_trim_safe`) still serves a prompt that goes on otherwise from it.
With `conversations`, a session's prompts (a request naming its session) also at the end of
their last turn (the conversation so far, its latest message included): the session's next
turn then restores it on any server sharing the directory, or after a restart, and computes
only the answer and the message since. A prompt without a session is not expected back.
Prompts without chat turns (completions over a long shared document header) are snapshot
at their last multiple of `block_tokens`. Prefixes shorter than `min_tokens` are not
stored: computing them costs little more than reading them back. A snapshot never covers
the prompt's last two tokens, which the engine always computes.

A stored prefix is read back only if it saves enough: reading and decompressing costs
time in proportion to the tokens read, so it must save at least 1/`RESTORE_RATIO` of them,
and at least `MIN_SAVED` tokens, beyond what the slots already hold.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

MIN_SAVED = 16
RESTORE_RATIO = 32


@dataclass(frozen=True)
class SnapshotPolicy:
    turns: int = 1
    block_tokens: int = 256
    min_tokens: int = 128
    conversations: bool = False

    def points(
        self,
        tokens: Sequence[int],
        end_of_turn: Collection[int],
        session: bool = False,
        opening: Sequence[int] = (),
    ) -> list[int]:
        """Prompt lengths to snapshot `tokens` at, ascending; `session`: the prompt is a
        turn of a session; `opening`: the tokens a user's turn opens with, taken in after
        a turn's end where they follow it."""
        last = len(tokens) - 2
        turn_ends = [i + 1 for i, token in enumerate(tokens) if token in end_of_turn]
        if turn_ends:  # a chat prompt
            points = turn_ends[: self.turns]
            if self.conversations and session and turn_ends[-1] not in points:
                points.append(turn_ends[-1])
            points = [_through(tokens, point, opening, last) for point in points]
        elif self.block_tokens:
            points = [last // self.block_tokens * self.block_tokens]
        else:
            points = []
        return [point for point in points if self.min_tokens <= point <= last]

    def worth_restoring(self, shared: int, stored: int, reused: int) -> bool:
        """Whether reading a `stored`-token entry to reuse `shared` tokens beats
        computing them, when the slots already hold `reused`."""
        saved = shared - reused
        return shared >= self.min_tokens and saved >= max(MIN_SAVED, stored // RESTORE_RATIO)


def _through(tokens: Sequence[int], point: int, opening: Sequence[int], last: int) -> int:
    """`point`, or past `opening` where the tokens there are it (and end by `last`)."""
    end = point + len(opening)
    taken = opening and end <= last and list(tokens[point:end]) == list(opening)
    return end if taken else point
