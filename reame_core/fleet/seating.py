"""Requests that find every slot of the fleet taken wait in the router for one to free,
oldest first.

Sent at once, such a request would queue on one replica, on the router's guess of which
slot frees first — a guess from when the requests ahead were sent, since the length of
their answers is unknown until they end. Waiting in the router, it takes the first slot
that frees anywhere. The wait costs the replicas nothing: the router wakes its line when it
hears a request complete (`on_request_completed`) and otherwise looks again at its own
counts every `RECHECK_S` — it never asks a replica (Serve probes a replica only when its
count says it is full, and a request leaves this line only for a slot the count says is
free).

A request let through holds a seat until the router sees it routed (`routed`), so two
requests never leave for one free slot; a seat not seen routed within `SEAT_TTL_S`
(its request cancelled, or routed where the router did not hear of it) is given up.

asyncio only, no Ray: one router's event loop owns a line.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Hashable

# How often a waiting request looks at the router's counts without being woken: Serve's
# count of a replica's requests can fall without a completion the router hears of (older
# Serve releases never call `on_request_completed`).
RECHECK_S = 0.05
# A request let through is routed within milliseconds; one not seen routed for this long
# is not coming.
SEAT_TTL_S = 1.0


class SlotLine:
    """The requests waiting for a slot, in the order they came."""

    def __init__(
        self,
        recheck_s: float = RECHECK_S,
        seat_ttl_s: float = SEAT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.recheck_s = recheck_s
        self.seat_ttl_s = seat_ttl_s
        self._clock = clock
        self._waiting: deque[object] = deque()
        self._seats: dict[Hashable, float] = {}  # let through, not yet routed: since when
        self._changed = asyncio.Event()  # set, and replaced, whenever the counts change

    def __len__(self) -> int:
        return len(self._waiting)

    @property
    def seats(self) -> int:
        """Requests let through and not yet seen routed."""
        now = self._clock()
        for key in [k for k, since in self._seats.items() if now - since > self.seat_ttl_s]:
            del self._seats[key]
        return len(self._seats)

    async def seat(self, request: Hashable, free: Callable[[], int]) -> None:
        """Return when `request` may be routed: no request older than it still waits, and
        `free()` (slots free in the fleet, by the router's counts) exceeds the seats held
        by requests let through before it."""
        self._seats.pop(request, None)  # asked again: Serve retries a request turned away
        ticket = object()
        self._waiting.append(ticket)
        try:
            while True:
                changed = self._changed
                if self._waiting[0] is ticket and free() > self.seats:
                    break
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(changed.wait(), self.recheck_s)
            self._seats[request] = self._clock()
        finally:
            self._waiting.remove(ticket)
            self.changed()

    def routed(self, request: Hashable) -> None:
        """`request` went to a replica: its seat is a request in flight there now."""
        if self._seats.pop(request, None) is not None:
            self.changed()

    def changed(self) -> None:
        """The counts may have changed (a request completed, was routed, or left the
        line): waiting requests look again."""
        self._changed.set()
        self._changed = asyncio.Event()
