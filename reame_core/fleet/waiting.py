"""Requests waiting in the router for a slot, seated in the order they arrived.

A replica of the fleet takes no more requests than it has slots (`max_ongoing_requests`,
`QUEUE_PER_SLOT` in app.py): a request that finds every slot it may take busy waits in the
router, where Serve asks for a replica again every few hundredths of a second, and takes
the first slot that frees where it may go — instead of queueing at one replica on a guess
of which slot frees first (answers differ in length; the router cannot know which ends
first). Serve retries each waiting request on its own, so whichever asks first after a slot
frees would take it: `WaitLine` makes the oldest go first. A request is offered none of the
replicas an older request still waiting would take (a session's turn takes only its own
replica, any other request any replica).

Pure logic: the caller passes the time (`now`, seconds on any monotonic clock).
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

# A waiting request asks again at least this often (Serve's backoff, app.py's
# `MAX_BACKOFF_S`, and a probe of each full replica): one not heard from for this long was
# cancelled or routed unnoticed, and no longer holds the line.
STALE_S = 1.0


@dataclass
class Waiter:
    arrived: tuple[float, int]  # when it reached the router, then the order first seen
    takes: frozenset[str]  # the replicas it would go to
    asked: float  # when it last asked


class WaitLine:
    """Requests the router has ranked replicas for and not yet seen routed."""

    def __init__(self, stale_s: float = STALE_S) -> None:
        self.stale_s = stale_s
        self._waiters: dict[Hashable, Waiter] = {}
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._waiters)

    def turn(
        self, request: Hashable, arrived: float, ranked: Sequence[str], now: float
    ) -> list[str]:
        """`ranked` (the replicas `request` would go to, best first) less those an older
        request still waiting would take; `request` now waits for `ranked` itself."""
        for key in [k for k, w in self._waiters.items() if now - w.asked > self.stale_s]:
            del self._waiters[key]
        mine = self._waiters.get(request)
        place = mine.arrived if mine is not None else (arrived, next(self._order))
        self._waiters[request] = Waiter(place, frozenset(ranked), now)
        taken: set[str] = set()
        for waiter in self._waiters.values():
            if waiter.arrived < place:
                taken |= waiter.takes
        return [r for r in ranked if r not in taken]

    def seated(self, request: Hashable) -> None:
        """`request` went to a replica (or gave up): it no longer waits."""
        self._waiters.pop(request, None)
