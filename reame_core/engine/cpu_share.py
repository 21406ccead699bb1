"""How many threads decoding should use right now, on cores shared with other processes.

llama.cpp's threads meet at a barrier after every operation, hundreds of times per token. On
a host where another process runs on one of the cores, the thread that reaches a barrier first
spins while its partner waits for a turn on the busy core, and a token takes up to a hundred
times longer (measured on 2 cores, docs/BENCHMARKS.md: 110 tok/s quiet; beside one busy
neighbour 0.8 tok/s with two threads, 80 tok/s with one). A thread count that fits the cores
the neighbours leave free never waits for a descheduled partner.

`CpuShare` watches how much CPU the rest of the host takes from this process's cores (other
processes, and the hypervisor's steal time) and says how many threads to use: the configured
count on a quiet host, fewer while neighbours are busy, back up once they are gone. It only
measures and decides; the engine applies its answer between steps.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# A neighbour taking more than this share of one core makes one thread fewer the faster
# choice (measured on 2 cores: a neighbour busy 25% of the time still leaves two threads
# ahead, one busy 50% of the time does not).
DOWN_AT = 0.4
# Hysteresis: threads come back only once the neighbours take clearly less than that.
UP_AT = 0.25
INTERVAL = 0.5  # seconds between measurements
QUIET_WINDOWS = 2  # measurements in a row below UP_AT before a thread is added back


@dataclass(frozen=True)
class CpuTimes:
    """Cumulative seconds at one instant: `busy` is CPU time spent on this process's cores by
    everyone (steal included), `own` this process's share of it."""

    wall: float
    busy: float
    own: float


def read_cpu_times(stat: Path = Path("/proc/stat")) -> CpuTimes | None:
    """The host's busy time on the cores this process may run on, from /proc/stat (Linux);
    None where there is no such file."""
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return None
    cpus = os.sched_getaffinity(0)
    hz = os.sysconf("SC_CLK_TCK")
    busy = 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        # user nice system idle iowait irq softirq steal [guest guest_nice]: guest time is
        # already counted in user and nice.
        fields = [int(value) for value in rest.split()[:8]]
        busy += sum(fields) - fields[3] - fields[4]
    return CpuTimes(wall=time.monotonic(), busy=busy / hz, own=time.process_time())


def neighbour_cores(before: CpuTimes, after: CpuTimes) -> float:
    """Cores' worth of CPU that others (processes, steal) took from this process's cores
    between two readings."""
    return _others(_since(before, after))


def _since(before: CpuTimes, after: CpuTimes) -> CpuTimes:
    return CpuTimes(after.wall - before.wall, after.busy - before.busy, after.own - before.own)


def _plus(a: CpuTimes, b: CpuTimes) -> CpuTimes:
    return CpuTimes(a.wall + b.wall, a.busy + b.busy, a.own + b.own)


def _others(span: CpuTimes) -> float:
    return max(0.0, span.busy - span.own) / span.wall if span.wall > 0 else 0.0


_NOTHING = CpuTimes(0.0, 0.0, 0.0)


class CpuShare:
    """The thread count that fits the cores neighbours leave free, with hysteresis.

    Only the time the engine works is measured: a neighbour busy while the engine idles
    (a client post-processing each answer, another server taking its turn) takes no core
    from decoding. Stretches of work separated by idle moments add up to one measurement, so
    a stream of requests each shorter than an interval is measured all the same."""

    def __init__(
        self,
        max_threads: int,
        n_cpus: int,
        read: Callable[[], CpuTimes | None] = read_cpu_times,
        interval: float = INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_threads = max_threads
        self.n_cpus = n_cpus
        self.threads = max_threads
        self.others = 0.0  # cores' worth of CPU the neighbours took in the last interval
        self.changes = 0
        self._read = read
        self._clock = clock
        self._interval = interval
        self._quiet = 0
        # Where the current stretch of work began (None while idle), and the work measured
        # in earlier stretches since the last decision.
        self._start = read() if max_threads > 1 else None
        self._active = self._start is not None
        self._banked = _NOTHING

    @property
    def active(self) -> bool:
        return self._active

    def update(self) -> int | None:
        """Measure if an interval of work has passed; the new thread count if it changed,
        else None. Called after every step: it looks at the clock first."""
        start = self._start
        if start is None or self._clock() - start.wall + self._banked.wall < self._interval:
            return None
        now = self._read()
        if now is None:
            return None
        span = _plus(self._banked, _since(start, now))
        self._start, self._banked = now, _NOTHING
        self.others = _others(span)
        wanted = self._wanted()
        if wanted == self.threads:
            return None
        self.threads = wanted
        self.changes += 1
        return wanted

    def pause(self) -> None:
        """The engine ran out of work: keep what this stretch measured, and measure nothing
        until it works again."""
        if self._start is not None and (now := self._read()) is not None:
            self._banked = _plus(self._banked, _since(self._start, now))
            self._start = None

    def resume(self) -> None:
        """The engine has work again: a new stretch of measured time begins."""
        if self._active and self._start is None:
            self._start = self._read()

    def _wanted(self) -> int:
        down = self._fit(DOWN_AT)
        if down < self.threads:
            self._quiet = 0
            return down
        up = self._fit(UP_AT)
        if up > self.threads:
            self._quiet += 1
            if self._quiet >= QUIET_WINDOWS:
                self._quiet = 0
                return self.threads + 1  # one at a time: each step up is measured again
            return self.threads
        self._quiet = 0
        return self.threads

    def _fit(self, tolerance: float) -> int:
        """Threads that fit the free cores when a neighbour may take `tolerance` of one."""
        free = math.floor(self.n_cpus - self.others + tolerance)
        return max(1, min(self.max_threads, free))
