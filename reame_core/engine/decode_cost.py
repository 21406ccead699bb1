"""What a decode costs on this host, learned from the decodes the engine runs.

A decode is one or more passes over the weights (see `Backend.passes`); a pass of n tokens
takes f(n) seconds. `DecodeCost` keeps the median of the last few timings of f at each pass
size it has seen (single-pass decodes only: their time is one f(n)); a median, because on a
shared host one decode now and then takes several times its usual time, and one such outlier
must not switch speculation off. It interpolates between the sizes,
so the speculation governor can price "verify k drafts" against "decode one token"
before trying it. Decode steps teach it small n, prompt chunks large n.

A size timed fewer than `SETTLED_TIMINGS` times has no median to speak of: its price is at
most what its measured neighbours say (the line between them; the next larger size's time
below them), and at most the time of the next larger size that is settled (a pass of fewer
tokens takes no longer). Otherwise the first verification of a draft of some length,
preempted, would price that length out, and with it every length interpolated from it:
nothing would verify drafts of those lengths again to correct it. If the size is that dear,
two more timings settle it.

A size not timed while `STALE_AFTER` timings of other sizes were taken (found within
`STALE_CHECK` more) is forgotten: its median stays, as its one timing, so it is unsettled
again. Where its price looked dear, nothing would time it again: the first few passes of a
size in a process are often its slowest, and a busy neighbour may have gone since. Priced
by its neighbours once more, forgotten neighbours passed over (sizes left dear together
must not keep each other dear), it is tried where that price pays, and two timings settle it
at what it costs now (a size that dear costs two passes at a wrong price every
`STALE_AFTER` timings). The largest measured size, with nothing above it, keeps its median
as its price, as does a forgotten size whose larger neighbours are all forgotten up to it.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable

SETTLED_TIMINGS = 3  # timings of a size whose median no single slow one decides
STALE_AFTER = 1024  # timings of other sizes after which a size's own are forgotten
STALE_CHECK = 128  # timings between looks for stale sizes


class DecodeCost:
    def __init__(self, window: int = 7) -> None:
        self.window = window
        self._sizes: list[int] = []  # sorted pass sizes with a measurement
        self._recent: dict[int, deque[float]] = {}
        self._median: dict[int, float] = {}  # of `_recent`, per size
        self._seconds: dict[int, float] = {}  # the price: the median, or less (unsettled)
        self._timings = 0  # single-pass decodes timed
        self._timed_at: dict[int, int] = {}  # per size, `_timings` at its last timing
        self._forgotten: set[int] = set()  # sizes forgotten and not timed since

    def observe(self, passes: list[int], seconds: float) -> None:
        """A decode made of `passes` took `seconds`."""
        if len(passes) != 1 or passes[0] <= 0 or seconds <= 0:
            return
        size = _bucket(passes[0])
        recent = self._recent.get(size)
        known = recent is not None
        if recent is None:
            recent = self._recent[size] = deque(maxlen=self.window)
        recent.append(seconds)
        self._median[size] = median(recent)
        self._timings += 1
        self._timed_at[size] = self._timings
        self._forgotten.discard(size)
        if not known:  # listed last: a reader on another thread (/metrics) finds its price
            self._seconds[size] = self._median[size]
            bisect.insort(self._sizes, size)
        # An unsettled size's price depends on its neighbours' medians (past forgotten ones)
        # and the next larger settled size's: the unsettled sizes next to this one may
        # change with it.
        sizes = self._sizes
        i = bisect.bisect_left(sizes, size)
        first = last = i
        while first > 0 and not self._settled(sizes[first - 1]):
            first -= 1
        while last + 1 < len(sizes) and not self._settled(sizes[last + 1]):
            last += 1
        for j in range(first, last + 1):
            self._seconds[sizes[j]] = self._price(j)
        if self._timings % STALE_CHECK == 0:
            self._forget_stale()

    def _forget_stale(self) -> None:
        """Forget every size not timed while `STALE_AFTER` timings of others were taken:
        its median stays as its one timing, so two new ones decide its median, and lines
        pass over it until then (see the module docstring)."""
        forgot = False
        for size in self._sizes:
            stale = self._timings - self._timed_at[size] >= STALE_AFTER
            if stale and size not in self._forgotten:
                recent = self._recent[size]
                recent.clear()
                recent.append(self._median[size])
                self._forgotten.add(size)
                forgot = True
        if forgot:  # every price may follow: settled sizes bound the unsettled ones
            for j, size in enumerate(self._sizes):
                self._seconds[size] = self._price(j)

    def _settled(self, size: int) -> bool:
        return len(self._recent[size]) >= SETTLED_TIMINGS

    def _price(self, i: int) -> float:
        """The price of the `i`th measured size: its median, capped while it is unsettled
        by the line between its neighbours' medians (below them, the next larger size's),
        forgotten sizes passed over, and by the next larger settled size's (see the module
        docstring)."""
        sizes, medians = self._sizes, self._median
        size = sizes[i]
        own = medians[size]
        if self._settled(size) or i + 1 == len(sizes):
            return own  # settled, or the largest: nothing above to bound it
        hi = self._neighbour(i, 1)
        if i == 0:
            cap = medians[hi]
        else:
            lo = self._neighbour(i, -1)
            cap = medians[lo] + (medians[hi] - medians[lo]) * (size - lo) / (hi - lo)
        settled_above = next((m for m in sizes[i + 1 :] if self._settled(m)), None)
        if settled_above is not None:
            cap = min(cap, medians[settled_above])
        return min(own, cap)

    def _neighbour(self, i: int, way: int) -> int:
        """The nearest size beside the `i`th, `way` up (1) or down (-1), that is not
        forgotten; the next one where all on that side are (there is one)."""
        sizes = self._sizes
        j = i + way
        while 0 <= j < len(sizes) and sizes[j] in self._forgotten:
            j += way
        return sizes[j] if 0 <= j < len(sizes) else sizes[i + way]

    def covers(self, n: int) -> bool:
        """Whether a pass of `n` tokens is priced from measurements of that size or smaller
        (below the smallest measured size the estimate is only an upper bound)."""
        return bool(self._sizes) and self._sizes[0] <= _bucket(max(1, n))

    def pass_seconds(self, n: int) -> float:
        """Estimated time of one pass of `n` tokens (0.0 before any measurement)."""
        sizes = self._sizes
        if not sizes:
            return 0.0
        n = max(1, n)
        i = bisect.bisect_left(sizes, n)
        if i < len(sizes) and sizes[i] == n:
            return self._seconds[n]
        if i == 0:  # below the smallest measurement: an upper bound (see `covers`)
            return self._seconds[sizes[0]]
        if i == len(sizes):
            if len(sizes) == 1:  # one point only: assume time grows with tokens
                return self._seconds[sizes[0]] * n / sizes[0]
            lo, hi = sizes[-2], sizes[-1]
        else:
            lo, hi = sizes[i - 1], sizes[i]
        t_lo, t_hi = self._seconds[lo], self._seconds[hi]
        slope = max(0.0, (t_hi - t_lo) / (hi - lo))
        return t_lo + slope * (n - lo)

    def seconds(self, passes: Iterable[int]) -> float:
        """Estimated time of a decode made of `passes`."""
        return sum(self.pass_seconds(n) for n in passes)

    def pass_seconds_at_most(self, n: int) -> float:
        """What a pass of `n` tokens may take at most, as far as the measurements show: the
        price of the smallest measured size of at least `n` tokens (a pass of more tokens
        does not take less time), extrapolated above the largest. Between measured sizes
        the interpolation of `pass_seconds` may be far below the time: a host's cost per
        token falls as passes grow (one pass of 17 tokens took 1.5x the interpolation
        between 1 and 28 tokens on a 2-core EPYC)."""
        sizes = self._sizes
        i = bisect.bisect_left(sizes, max(1, n))
        if i < len(sizes):
            return self._seconds[sizes[i]]
        return self.pass_seconds(n)

    def prompt_share(self) -> float:
        """What one token of the largest measured pass costs next to a one-token decode:
        about the prompt rate's share of the decode rate (1.0 until both are measured)."""
        sizes = self._sizes
        if len(sizes) < 2 or sizes[0] != 1 or sizes[-1] < 8:
            return 1.0
        largest = sizes[-1]
        return min(1.0, self._seconds[largest] / largest / self._seconds[1])

    def curve(self) -> dict[int, float]:
        """Measured pass sizes and the median of their recent timings (for reports; a size
        with fewer than `SETTLED_TIMINGS` timings in its window, a forgotten size's kept
        median counting as one, may be priced lower)."""
        return {size: self._median[size] for size in self._sizes}


def median(values: Iterable[float]) -> float:
    """The median of a few values, cheaply: it runs every decode step."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def _bucket(n: int) -> int:
    """Exact sizes up to 32 (where drafts live), then coarser steps: few buckets to fill."""
    if n <= 32:
        return n
    step = 1 << (n.bit_length() - 3)
    return n - n % step
