"""The sequence slots of the context, and what each one's KV holds.

`KVSlots` is the only code that changes a slot's KV through the backend, so its record of
the tokens in each slot is always the truth. A slot whose sequence finished keeps its KV
("resident"): a later request sharing a prefix with it reuses those cells instead of
computing them again. Free slots are handed out least recently used first.

With `exact_reuse` (the deterministic configuration) only the part of a slot's KV that
was computed as prompt chunks is reused. llama.cpp may compute a lone token per sequence (a
decode step) along another path than a chunk, so a generated answer's KV may differ slightly
from what a cold prefill of the same text computes, and reusing it could change the next
tokens. `Slot.exact` counts the leading tokens computed as chunks. Prompt chunks start on
the model's chunk grid (`ModelInfo.chunk_grid`), and only prefixes of a length on the grid
are reused (`reusable`): a token then sits at the same place in its kernel's group of rows
in every run, which, with kernels that do not change with a chunk's length
(docs/ARCHITECTURE.md, "Exact reuse"), is what makes its KV the same. Where the server's
check found a row's logits the same whatever pass computes it, for the model on this build
and CPU (`backend.pass_check`), the engine reuses without these limits: an answer's KV is
then what a chunk would compute.

A slot can be pinned to a session (a client's conversation id): other requests copy from
it instead of taking it, and it is handed out only when no unpinned slot is free. At most
`max_sessions` slots are pinned; pinning one more unpins the least recently used. A slot
also remembers whose conversation its KV holds (`Slot.conversation`), pinned or not, until
another request takes it: what a fleet replica reports to its router (`holdings`).
When every free slot is pinned and a request takes one, the exactly reusable part of the
session's conversation is first copied out of the KV and kept in memory (at most
`spill_bytes` of such states, the oldest dropped first), and the session's next turn loads
it back instead of computing it again (`restore_spilled`): under a backlog a pinned slot is
taken moments after its turn ends, and the next turn would otherwise find nothing.

A decode step may write a throwaway row into a slot it does not decode, to join the
sequence ids around it into one pass over the weights (`gap_fillers`); the row is removed
as soon as the step has run, so the record stays the truth between steps.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from reame_core.backend.base import Backend

SPILL_BYTES = 64 << 20  # displaced sessions' KV states kept in memory, at most


@dataclass
class Slot:
    seq_id: int
    tokens: list[int] = field(default_factory=list)
    busy: bool = False
    last_used: int = 0
    session: str | None = None  # pinned to this session
    exact: int = 0
    conversation: str | None = None  # the session of the request that last ran here


@dataclass(frozen=True)
class PrefixMatch:
    slot: Slot
    length: int


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class KVRollbackError(RuntimeError):
    """The model could not drop rejected draft tokens from a sequence's KV."""


class KVSlots:
    def __init__(
        self,
        backend: Backend,
        max_sessions: int | None = None,
        *,
        exact_reuse: bool = True,
        spill_bytes: int = SPILL_BYTES,
    ) -> None:
        self._backend = backend
        self._trim_safe = backend.info.prefix_trim_safe
        self._exact_reuse = exact_reuse
        # Where reuse need not be exact, any length is reused and chunks go anywhere.
        self.grid = backend.info.chunk_grid if exact_reuse else 1
        self.slots = [Slot(seq_id) for seq_id in range(backend.info.n_seq_max)]
        for slot in self.slots:  # the backend may hold a previous owner's sequences
            backend.seq_rm(slot.seq_id, -1, -1)
        self.max_sessions = len(self.slots) // 2 if max_sessions is None else max_sessions
        self.spill_bytes = spill_bytes
        self._spilled: OrderedDict[str, tuple[list[int], bytes]] = OrderedDict()  # oldest first
        self._spilled_sessions: frozenset[str] = frozenset()  # its keys, for other threads
        self._state_bytes_per_token = 0.0  # of the last state copied out
        self._clock = itertools.count(1)

    # ---------------------------------------------------------------- queries

    def free_count(self) -> int:
        return sum(not slot.busy for slot in self.slots)

    def reusable(self, length: int) -> int:
        """The longest prefix of at most `length` tokens that may be reused (on the grid)."""
        return length - length % self.grid

    def chunk_end(self, start: int, stop: int, budget: int, most: int) -> int:
        """Where a prompt chunk from `start` (on the grid) towards `stop` ends: after about
        `budget` tokens and at most `most`, on the grid unless at `stop`, and never leaving
        a lone last token (a chunk of one is computed along the decode path)."""
        grid = self.grid
        end = min(stop, start + min(max(budget, 2), most))
        if end < stop and grid > 1:
            end = min(stop, max(end - end % grid, start + grid))
        if stop - end == 1:
            if end - grid > start + 1:
                end -= grid
            elif stop - start <= most:
                end = stop
        return end

    def longest_prefix(self, prompt: Sequence[int], limit: int) -> PrefixMatch | None:
        """The slot whose KV shares the most leading tokens with `prompt` (at most `limit`).

        On models whose state cannot be trimmed, only a slot whose whole KV is a prefix of
        the prompt qualifies: it can be continued, not cut back.
        """
        best: PrefixMatch | None = None
        for slot in self.slots:
            length = self.shared_prefix(slot, prompt, limit)
            if not self._trim_safe and length != len(slot.tokens):
                continue
            if length > 0 and (best is None or length > best.length):
                best = PrefixMatch(slot, length)
        return best

    def shared_prefix(self, slot: Slot, prompt: Sequence[int], limit: int) -> int:
        """How many leading tokens of `prompt` (at most `limit`) the slot's KV holds in a
        form that may be reused (with `exact_reuse`: computed as chunks, on the grid)."""
        length = min(common_prefix(slot.tokens, prompt), limit)
        if self._exact_reuse:
            length = self.reusable(min(length, slot.exact))
        return length

    def stale_session(self, session: str | None = None) -> Slot | None:
        """A free slot pinned to a session (to `session`, if given) whose KV is not all
        exactly reusable."""
        if not self._exact_reuse or not self._trim_safe:
            return None
        for slot in self.slots:
            if slot.busy or slot.session is None or slot.exact == len(slot.tokens):
                continue
            if session is None or slot.session == session:
                return slot
        return None

    def worth_taking(self, match: PrefixMatch, session: str | None) -> bool:
        """Whether a request sharing `match.length` tokens with a slot should take the slot
        over, cutting its KV back to them, rather than copy them into a slot of its own: where
        the slot holds its own session's conversation, or nothing reusable beyond the shared
        prefix. Otherwise the slot keeps an earlier prompt whole, for a request repeating it,
        and the least recently used free slot is given up instead."""
        slot = match.slot
        if slot.session is not None and slot.session == session:
            return True
        kept = slot.exact if self._exact_reuse else len(slot.tokens)
        return self.reusable(kept) <= match.length

    def may_take(self, slot: Slot, session: str | None) -> bool:
        """Whether a request of `session` may take `slot` over (not merely copy from it)."""
        return not slot.busy and slot.session in (None, session)

    def acquire(self, prefer: Slot | None = None, session: str | None = None) -> Slot:
        """Take a free slot: `prefer` if allowed, else an unpinned one (a pinned one,
        unpinning it, only when every free slot is pinned) that keeps the busy sequence ids
        in as few consecutive runs as possible, the least recently used among those.

        With per-sequence KV streams, llama.cpp decodes sequences together in one pass over
        the weights only while their ids run consecutively: four streams on slots 0, 2, 5, 7
        cost four passes a step, on slots 0-3 one. With regions the order costs nothing but
        a wider attention mask (the buffer up to the last busy region)."""
        if prefer is not None and self.may_take(prefer, session):
            slot = prefer
        else:
            busy = {s.seq_id for s in self.slots if s.busy}
            free = [s for s in self.slots if not s.busy]
            slot = min(
                free,
                key=lambda s: (s.session is not None, _runs(busy | {s.seq_id}), s.last_used),
            )
        if slot.session is not None and slot.session != session:
            self._spill(slot)
        slot.busy = True
        slot.session = None
        slot.conversation = session
        slot.last_used = next(self._clock)
        return slot

    def holdings(self) -> tuple[set[str], frozenset[str]]:
        """The sessions whose conversation some slot's KV holds, in a slot running its turn
        or kept since (pinned or not); and those whose conversation was copied out of the
        slot another request took (`_spill`), kept in memory. Read from any thread: a
        moment's picture (slots first: a session spilled meanwhile is in one or the other)."""
        in_slots = {s.conversation for s in list(self.slots) if s.conversation is not None}
        return in_slots, self._spilled_sessions

    def restore_spilled(
        self, slot: Slot, session: str | None, prompt: Sequence[int], limit: int
    ) -> bool:
        """Load the session's conversation, kept in memory since its slot was taken
        (`_spill`), into `slot` as far as it begins `prompt` (at most `limit` tokens, on
        the grid), if that is more than the slot holds now. The kept state is dropped
        either way: the session's turn moves its conversation on."""
        kept = self._spilled.pop(session, None) if session is not None else None
        if kept is None:
            return False
        self._spilled_sessions = frozenset(self._spilled)
        tokens, state = kept
        shared = self.reusable(min(common_prefix(tokens, prompt), limit))
        if shared <= len(slot.tokens) or (shared < len(tokens) and not self._trim_safe):
            return False
        if not self.restore(slot, state, tokens):
            return False
        self.truncate(slot, shared)
        return True

    def _spill(self, slot: Slot) -> None:
        """Keep the exactly reusable part of a pinned slot's KV, about to be taken over,
        for its session's next turn (`restore_spilled`)."""
        session = slot.session
        length = self.reusable(slot.exact) if self._exact_reuse else len(slot.tokens)
        if session is None or length < 2 or self.spill_bytes <= 0:
            return
        if length * self._state_bytes_per_token > self.spill_bytes:
            return  # too large to keep, as far as the states kept so far show
        self.truncate(slot, length)
        if len(slot.tokens) < length:  # a state that cannot be cut back: cleared
            return
        state = self._backend.get_seq_state(slot.seq_id)
        self._state_bytes_per_token = len(state) / length
        if not state or len(state) > self.spill_bytes:
            return
        self._spilled.pop(session, None)
        self._spilled[session] = (list(slot.tokens), state)
        total = sum(len(kept) for _, kept in self._spilled.values())
        while total > self.spill_bytes:
            _, (_, dropped) = self._spilled.popitem(last=False)
            total -= len(dropped)
        self._spilled_sessions = frozenset(self._spilled)

    def release(self, slot: Slot, session: str | None = None) -> None:
        """The slot's sequence is done; its KV stays resident for reuse, pinned to
        `session` if given."""
        slot.busy = False
        slot.last_used = next(self._clock)
        if session is None or self.max_sessions == 0:
            return
        for other in self.slots:
            if other.session == session:
                other.session = None
        slot.session = session
        pinned = [s for s in self.slots if s.session is not None]
        while len(pinned) > self.max_sessions:
            oldest = min(pinned, key=lambda s: s.last_used)
            oldest.session = None
            pinned.remove(oldest)

    def gap_fillers(self, layout: Sequence[tuple[int, int]]) -> dict[int, int]:
        """Throwaway rows that save passes over the weights, as {sequence id: position}.

        With per-sequence KV streams (not regions, which decode any layout in one pass:
        `Backend.passes`), llama.cpp decodes sequences in one pass only while their ids
        run consecutively: a step decoding slots 0 and 2 costs two passes, though slot 1
        only computes a prompt chunk of its own or waits. One more row, in slot 1 at the end
        of its KV, without logits and removed right after (`drop_fillers`), makes it one
        pass, for a fraction of one's cost. `layout` is (sequence id, tokens) in ascending id
        order; every gap between its ids is filled, or none where that saves no pass, where
        a slot's KV is full or where the model cannot drop a tail again."""
        if len(layout) < 2 or not self._trim_safe:
            return {}
        present = {seq_id for seq_id, _ in layout}
        gaps = [i for i in range(layout[0][0], layout[-1][0]) if i not in present]
        if not gaps:
            return {}
        filled = sorted([*layout, *((seq_id, 1) for seq_id in gaps)])
        if len(self._backend.passes(filled)) >= len(self._backend.passes(layout)):
            return {}
        positions = {seq_id: len(self.slots[seq_id].tokens) for seq_id in gaps}
        if max(positions.values()) >= self._backend.info.n_ctx_seq:
            return {}
        return positions

    def drop_fillers(self, fillers: Mapping[int, int]) -> None:
        """Remove the rows `gap_fillers` placed, once their decode ran (or failed)."""
        for seq_id, position in fillers.items():
            if not self._backend.seq_rm(seq_id, position):
                self.truncate(self.slots[seq_id], 0)  # never reuse a state holding one

    # ---------------------------------------------------------- KV operations

    def truncate(self, slot: Slot, length: int) -> None:
        """Keep only the first `length` tokens of the slot's KV, to reuse them.

        A state that cannot be trimmed (sliding window, recurrent) is cleared instead:
        llama.cpp reports success there, but the next logits would be wrong.
        """
        if length >= len(slot.tokens):
            return
        if length == 0 or not self._trim_safe or not self._backend.seq_rm(slot.seq_id, length):
            self._backend.seq_rm(slot.seq_id, -1, -1)
            length = 0
        del slot.tokens[length:]
        slot.exact = min(slot.exact, length)

    def rollback(self, slot: Slot, length: int) -> None:
        """Drop the rejected draft tokens decoded past `length` in the last step.

        A model that cannot remove a tail (a recurrent or hybrid state) refuses. Its
        sequence must not go on after tokens it did not accept, nor may a later request
        reuse them: the slot is cleared and `KVRollbackError` ends the step.
        """
        if length >= len(slot.tokens):
            return
        if not self._backend.seq_rm(slot.seq_id, length):
            self.truncate(slot, 0)
            raise KVRollbackError(
                f"the model kept rejected draft tokens in slot {slot.seq_id} (it cannot "
                "remove part of a sequence); run it with --speculate off"
            )
        del slot.tokens[length:]
        slot.exact = min(slot.exact, length)

    def copy(self, src: Slot, dst: Slot, length: int) -> None:
        """Make `dst` hold the first `length` tokens of `src`."""
        self._backend.seq_cp(src.seq_id, dst.seq_id)
        dst.tokens = list(src.tokens)
        dst.exact = src.exact
        self.truncate(dst, length)

    def restore(self, slot: Slot, state: bytes, tokens: Sequence[int]) -> bool:
        """Load a serialized state holding exactly `tokens` into the slot."""
        if not self._backend.set_seq_state(slot.seq_id, state):
            self._backend.seq_rm(slot.seq_id, -1, -1)
            slot.tokens = []
            slot.exact = 0
            return False
        slot.tokens = list(tokens)
        slot.exact = len(tokens)  # stored states are snapshots taken after prompt chunks
        return True

    def snapshot(self, slot: Slot) -> bytes:
        return self._backend.get_seq_state(slot.seq_id)

    def appended(self, slot: Slot, tokens: Sequence[int], *, chunk: bool = False) -> None:
        """Record tokens the last decode wrote into the slot. A prompt `chunk` of several
        tokens extends the exactly reusable part if it directly follows it on the grid;
        decode steps (drafts included) never do."""
        exact = slot.exact == len(slot.tokens) and len(slot.tokens) % self.grid == 0
        if chunk and len(tokens) > 1 and exact:
            slot.exact += len(tokens)
        slot.tokens.extend(tokens)


def _runs(ids: set[int]) -> int:
    """How many runs of consecutive integers `ids` fall into."""
    return sum(1 for i in ids if i - 1 not in ids)
