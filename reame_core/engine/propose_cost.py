"""What asking a draft source costs, learned from its timed propose calls.

A call's time grows with the tokens it drafts (a draft model decodes once per drafted
position) and with the tokens it must catch up on first (a draft model decodes into its own
context what the sequence committed since it last looked: the whole prompt the first time,
then whatever other sources' drafts added). `ProposeCost` counts a call's work as
``1 + drafted + catch_up_weight * caught_up`` units and keeps the median time of a unit
over the last calls; the caller gives the weight of a caught-up token (what a token of a
prompt chunk costs next to a decode step on this host). A median, because one call now and
then is slow on a shared host; a unit, so that a first call that caught up a long prompt
does not make every later call look as dear. What a call has taken lately, whatever it was
asked, is kept too (`typical`): a source whose calls cost a fixed few microseconds (prompt
lookup) is judged by that, not by a per-token model that does not fit it.

A source's first timed call warms its caches (for prompt lookup, tens of times its usual
time): it prices the source only until a second call is timed. And any call may be
preempted on a shared host, so a price from timed calls is `settled` only once
`SETTLED_CALLS` calls after the first have been timed: until then the governor asks the
source again, for one request, rather than condemn it for the life of the process. A figure
the source measured itself (`reame_draft_cost`) is settled while no call has been timed: a
draft model too dear to pay is never called to confirm it (the source is asked to measure
itself anew now and then instead, and its new figure replaces the old). `unsettle` starts
the count again (a price from long ago), keeping the last call as the price meanwhile.
"""

from __future__ import annotations

from collections import deque

from reame_core.engine.decode_cost import median

SETTLED_CALLS = 3  # timed calls that no single slow one decides
CLIPPED = 8  # a call counts in `typical` as at most this many times the calls' median


class ProposeCost:
    def __init__(self, window: int = 9) -> None:
        self._calls: deque[tuple[float, int, int]] = deque(maxlen=window)
        self._unit: tuple[float, float] | None = None  # (catch_up_weight, seconds a unit)
        self._typical: float | None = None
        self._timed = 0  # calls timed by the governor, the first (a warm-up) included
        self._warm_up: tuple[float, int, int] | None = None  # kept until a second is timed
        self._confirming = 0  # timed calls since the last (un)settling, the warm-up aside
        self._given = False  # a figure the source measured itself

    @property
    def known(self) -> bool:
        return bool(self._calls)

    @property
    def timed(self) -> bool:
        """Whether any call has been timed (not only a figure given)."""
        return self._timed > 0

    @property
    def given(self) -> bool:
        """Whether the price is a figure the source gave, no call timed."""
        return self._given and not self._timed

    @property
    def settled(self) -> bool:
        """Whether the price may condemn the source: a figure it gave, no call timed yet;
        or enough timed calls that one slow call does not decide it."""
        if not self._timed:
            return self._given
        return self._confirming >= SETTLED_CALLS

    def observe(self, seconds: float, drafted: int, caught_up: int, *, given: bool = False) -> None:
        """A call that drafted at most `drafted` tokens for a sequence and caught up on
        `caught_up` tokens in all took `seconds`; `given`: the source measured it itself."""
        call = (max(0.0, seconds), max(0, drafted), max(0, caught_up))
        self._unit = self._typical = None
        if given:
            if not self._timed:  # a figure measured anew replaces the last one
                self._calls.clear()
            self._given = True
        else:
            self._timed += 1
            if self._timed == 1:
                self._warm_up = call
            else:
                if self._warm_up is not None and self._warm_up in self._calls:
                    self._calls.remove(self._warm_up)
                self._warm_up = None
                self._confirming += 1
        self._calls.append(call)

    def unsettle(self) -> None:
        """Time the source anew: its price rests on its last call until `SETTLED_CALLS`
        more are timed."""
        if self._calls:
            last = self._calls[-1]
            self._calls.clear()
            self._calls.append(last)
        self._warm_up = None
        self._confirming = 0
        self._unit = self._typical = None

    def typical(self) -> float:
        """What a call has taken lately, whatever it was asked (0.0 before any call): what
        asking the source every step would cost. The mean of the last calls, each counted
        at most `CLIPPED` times their median: a call preempted on a shared host moves it
        little, and a source whose calls mostly stop at once and sometimes search (the
        archive's lookups, on text unlike the archive's) is priced at what its calls take
        on the whole, not at its quick ones, as a median would."""
        if not self._calls:
            return 0.0
        if self._typical is None:
            times = [seconds for seconds, _, _ in self._calls]
            most = CLIPPED * median(times)
            self._typical = sum(min(seconds, most) for seconds in times) / len(times)
        return self._typical

    def predict(self, drafted: int, caught_up: int, catch_up_weight: float) -> float:
        """Expected seconds of a call drafting `drafted` tokens after catching up on
        `caught_up` (0.0 before any call)."""
        if not self._calls:
            return 0.0
        if self._unit is None or self._unit[0] != catch_up_weight:
            per_unit = median(
                seconds / (1 + d + catch_up_weight * c) for seconds, d, c in self._calls
            )
            self._unit = (catch_up_weight, per_unit)
        return self._unit[1] * (1 + drafted + catch_up_weight * caught_up)
