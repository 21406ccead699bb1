"""The prompt work ahead of a new request on one replica, as the router estimates it.

A new request's first token waits for the prompt work still to do of the requests sent
there before it, hit or cold. (The engine computes the shortest remaining prompt first; the
router counts the whole backlog all the same: pricing that order was measured worse, see
docs/BENCHMARKS.md. A replica with every slot taken is ranked after one with a slot free,
in `FleetAffinity.rank`.) The router knows each request's work when it sends it (the chunks
it must compute there, `Work`) and when it completes; in between it assumes the replica
works through them in order at its measured rate: the chunks it completed per second while
it had work, learned from the completions it saw. So a cold prefill about to end no longer
counts as a whole one, and a slow replica's backlog drains slowly. Until a first completion
the rate is unknown and nothing drains: the backlog is then all the work in flight.

Pure logic: the caller passes the time (`now`, seconds on any monotonic clock).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

# Weight of the past in the measured rate, per completion: the last ten or so count.
RATE_MEMORY = 0.8


@dataclass
class Work:
    """A request in flight on a replica: its prompt, the chunks it had to compute there,
    its session if it is a turn of one, and when it was sent."""

    chain: list[bytes]
    chunks: float
    session: str | None = None
    sent: float = 0.0


class Backlog:
    """The requests a router sent one replica and has not seen complete, oldest first,
    with how much of their work the replica has likely done."""

    def __init__(self, tracked: int = 256) -> None:
        self.tracked = tracked  # completions may go missing: remember at most this many
        self.in_flight: OrderedDict[Hashable, Work] = OrderedDict()
        self._done = 0.0  # chunks of the work in flight computed, as of `_tick`
        self._tick: float | None = None
        self._busy = 0.0  # seconds with work in flight since the last completion
        self._work_seen = 0.0  # decayed sums of completed chunks and busy seconds
        self._busy_seen = 0.0

    def __len__(self) -> int:
        return len(self.in_flight)

    @property
    def total(self) -> float:
        return sum(work.chunks for work in self.in_flight.values())

    @property
    def rate(self) -> float | None:
        """Chunks computed per second while the replica had work, or None before any
        completion was timed."""
        return self._work_seen / self._busy_seen if self._busy_seen > 0 else None

    def remaining(self, now: float) -> float:
        """Chunks of the work in flight still to compute at `now`."""
        total = self.total
        return max(0.0, total - self._progress(now, total))

    def add(self, key: Hashable, work: Work, now: float) -> list[Work]:
        """A request sent: its work joins the queue. Returns the works forgotten to make
        room (their completions went missing)."""
        self._advance(now)
        self.in_flight[key] = work
        dropped = []
        while len(self.in_flight) > self.tracked:
            dropped.append(self.drop_oldest())
        return dropped

    def complete(self, key: Hashable, now: float) -> Work | None:
        """A request completed: its work leaves the queue, and its time teaches the rate."""
        self._advance(now)
        work = self.in_flight.pop(key, None)
        if work is None:
            return None
        self._work_seen = self._work_seen * RATE_MEMORY + work.chunks
        self._busy_seen = self._busy_seen * RATE_MEMORY + self._busy
        self._busy = 0.0
        self._done = max(0.0, self._done - work.chunks)
        return work

    def drop_oldest(self) -> Work:
        """The oldest request finished unnoticed (no time to learn from)."""
        _, work = self.in_flight.popitem(last=False)
        self._done = max(0.0, self._done - work.chunks)
        return work

    def _progress(self, now: float, total: float) -> float:
        if self._tick is None or not self.in_flight:
            return self._done
        rate = self.rate or 0.0
        return min(total, self._done + rate * max(0.0, now - self._tick))

    def _advance(self, now: float) -> None:
        if self._tick is not None and self.in_flight:
            self._done = self._progress(now, self.total)
            self._busy += max(0.0, now - self._tick)
        self._tick = now
