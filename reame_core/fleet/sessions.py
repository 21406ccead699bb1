"""Where each conversation (`X-Session-ID`) of the fleet lives, and which ones a replica
keeps pinned, as the router sees them.

The engine pins the slot of a session's finished turn to that session, so that its next
turn finds the conversation's KV (engine/slots.py): at most half the replica's slots, the
most recent sessions; a request that finds no free unpinned slot takes a pinned one
instead, the engine first copying the conversation out, in memory, for the session's next
turn there (a replica that `spills`, as Reame's engine does; otherwise the conversation
must be computed again). A 2-slot replica so keeps one conversation. The router mirrors
this to price it: a new session sent where all the pins are taken costs the oldest
pinned conversation its recompute (its turn, once done, unpins it, and an unpinned slot is
taken without a copy), and so, on a replica that does not spill, does a request that would
take an idle live session's slot. A replica's reports name the conversations its engine
has set aside, so the router's picture follows a slot taken where it did not expect it.

A session is live while a turn of it is in flight, or while it is likely to come back:
judged by its own rhythm once it has one (the longest wait between one of its turns ending
and its next one, `RETURN_FACTOR` times over, at least `RETURN_FLOOR`), and by
`SESSION_TTL` until then. Taking the pin of a conversation that has ended costs nothing: a
pipeline that sends three turns back to back and moves on stops protecting its slot
seconds later, not minutes. It still goes back to its pinned slot if it returns later, as
long as nothing took it.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

# Seconds after its last turn ended that a session with no rhythm yet counts as coming back.
SESSION_TTL = 120.0
# A session that has waited between turns counts as coming back for this many times its
# longest wait, at least RETURN_FLOOR seconds (and at most SESSION_TTL).
RETURN_FACTOR = 4.0
RETURN_FLOOR = 5.0


def pinnable(slots: int) -> int:
    """How many sessions a replica of `slots` slots keeps pinned (the engine's default)."""
    return slots // 2


class PackedChain(Sequence[bytes]):
    """A prompt's chunk hashes, all of one width, in one bytes object. A session keeps its
    conversation's chain as long as it lives; as a list of small bytes objects, 100,000
    sessions' chains were most of a large fleet's router state."""

    __slots__ = ("_data", "_width")

    def __init__(self, chain: Sequence[bytes]) -> None:
        self._width = len(chain[0]) if chain else 0
        self._data = b"".join(chain)
        if len(self._data) != self._width * len(chain):
            raise ValueError("chunk hashes of different widths")

    def __len__(self) -> int:
        return len(self._data) // self._width if self._width else 0

    @overload
    def __getitem__(self, i: int) -> bytes: ...
    @overload
    def __getitem__(self, i: slice) -> list[bytes]: ...
    def __getitem__(self, i: int | slice) -> bytes | list[bytes]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError("chain index out of range")
        start = (i % n) * self._width
        return self._data[start : start + self._width]

    def __iter__(self) -> Iterator[bytes]:
        data, width = self._data, self._width
        return iter([data[start : start + width] for start in range(0, len(data), width or 1)])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PackedChain):
            return self._data == other._data and self._width == other._width
        return isinstance(other, Sequence) and list(self) == list(other)

    def __hash__(self) -> int:
        return hash(self._data)

    def __repr__(self) -> str:
        return f"PackedChain({list(self)!r})"


@dataclass(slots=True)
class SessionPlace:
    """Where a session lives: its replica, its last turn's prompt, when that turn was
    sent, its turns still in flight, whether its conversation is believed still there
    (`kept`: no request has since taken its slot, or the engine kept it in memory when one
    did: `set_aside`, its slot no longer pinned), when its last turn ended (None while none
    has), and the longest it has waited between a turn ending and its next (`longest_wait`,
    None before its second turn)."""

    replica: str
    chain: PackedChain
    last_turn: float
    turns_in_flight: int = 0
    kept: bool = True
    set_aside: bool = False
    ended: float | None = None
    longest_wait: float | None = None
    served_here: int = 0  # turns completed on `replica` since the session came there


class SessionBook:
    """Every live session's place, at most `capacity` (least recently seen forgotten
    first), with each replica's sessions in the order of their last turn."""

    def __init__(self, capacity: int = 100_000, ttl: float = SESSION_TTL) -> None:
        self.capacity = capacity
        self.ttl = ttl
        self.places: OrderedDict[str, SessionPlace] = OrderedDict()
        self._on: dict[str, OrderedDict[str, None]] = {}  # replica -> its sessions

    def __contains__(self, session: object) -> bool:
        return session in self.places

    def __len__(self) -> int:
        return len(self.places)

    def get(self, session: str | None) -> SessionPlace | None:
        return self.places.get(session) if session is not None else None

    def turn(self, session: str, replica: str, chain: Sequence[bytes], now: float) -> None:
        """A turn of `session` was sent to `replica`: the session lives there from now on,
        its conversation in the slot that turn takes."""
        chain = PackedChain(chain)
        place = self.places.get(session)
        if place is not None and place.replica != replica:
            self._on[place.replica].pop(session, None)
            place = None
        if place is None:
            place = self.places[session] = SessionPlace(replica, chain, now)
        elif place.turns_in_flight == 0 and place.ended is not None:
            waited = now - place.ended
            place.longest_wait = max(waited, place.longest_wait or 0.0)
        place.chain, place.last_turn, place.kept, place.set_aside = chain, now, True, False
        place.turns_in_flight += 1
        self.places.move_to_end(session)
        mine = self._on.setdefault(replica, OrderedDict())
        mine[session] = None
        mine.move_to_end(session)
        while len(self.places) > self.capacity:
            oldest, gone = self.places.popitem(last=False)
            self._on[gone.replica].pop(oldest, None)

    def turn_over(self, session: str | None, now: float) -> None:
        """A turn of `session` completed at `now`."""
        place = self.get(session)
        if place is not None and place.turns_in_flight > 0:
            place.turns_in_flight -= 1
            place.served_here += 1
            if place.turns_in_flight == 0:
                place.ended = now

    def pinned(self, replica: str, slots: int) -> list[tuple[str, SessionPlace]]:
        """The sessions whose slots `replica` keeps pinned, most recent first: of its
        sessions as many as it pins, the most recent, those still kept there in a slot
        (the engine unpins a session for a newer one, or as it hands its slot to another
        request; a session unpinned for a newer one is not pinned again when that one's
        slot goes)."""
        recent = itertools.islice(reversed(self._on.get(replica, {})), pinnable(slots))
        places = ((session, self.places[session]) for session in recent)
        return [(s, place) for s, place in places if place.kept and not place.set_aside]

    def live(self, place: SessionPlace, now: float) -> bool:
        """Whether the session is still likely to come back: a turn in flight, or its last
        one ended within the wait it allows itself (see the module docstring)."""
        if place.turns_in_flight > 0:
            return True
        idle = now - (place.ended if place.ended is not None else place.last_turn)
        if place.longest_wait is None:
            return idle <= self.ttl
        return idle <= min(self.ttl, max(RETURN_FLOOR, RETURN_FACTOR * place.longest_wait))

    def forget_replica(self, replica: str) -> None:
        """A replica left: its sessions find a new home on their next turn."""
        for session in self._on.pop(replica, {}):
            del self.places[session]
