"""What a draft source's drafts are worth: how they fared, position by position, and how
sure that judgement is.

Acceptance is not one coin per token: a copy that is on track tends to stay on track, so
the first token of a draft fails far more often than the tenth. `Acceptance` counts, for
each draft position j, the drafts that reached it (all tokens before it right) and those
whose token j was right too. Its rates start from a prior and are pulled towards the
evidence as drafts come in; how many drafts stand behind a rate is its confidence, and
`upper_rates` says how good the source could still be given that evidence.

Evidence does not need a verification: a deterministic draft that was proposed but not
verified is scored against the tokens the sequence commits afterwards (`ShadowDraft`),
which are exactly what verification would have kept.

This module only counts and estimates; what to do with the estimates is the governor's.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

PRIOR_RATE = 0.5  # a source's chance of a right first token before any evidence
PRIOR_WEIGHT = 2.0  # in drafts: how much evidence it takes to move a rate halfway
UPPER_Z = 1.645  # one-sided 95% bound in `Acceptance.upper_rates`
# Bands of a draft's estimated first-token rate in which `Calibration` judges bets apart.
CALIBRATION_BANDS = (0.5, 0.7, 0.85, 0.95)
CALIBRATION_PRIOR = 4.0  # tokens of a band's record it takes to move its calibration halfway


@dataclass
class Acceptance:
    """Decayed counts of drafts that reached position j (`reached`) and of those whose
    token j was right (`passed`)."""

    decay: float = 1.0
    reached: list[float] = field(default_factory=list)
    passed: list[float] = field(default_factory=list)

    def begin(self) -> None:
        """A new draft is being counted: older ones weigh a little less."""
        if self.decay < 1.0:
            self.reached = [n * self.decay for n in self.reached]
            self.passed = [n * self.decay for n in self.passed]

    def reach(self, position: int, right: bool) -> None:
        """A draft reached `position` (every token before it right); its token there was
        `right` or not."""
        if len(self.reached) <= position:
            grow = position + 1 - len(self.reached)
            self.reached += [0.0] * grow
            self.passed += [0.0] * grow
        self.reached[position] += 1.0
        if right:
            self.passed[position] += 1.0

    def add(self, k: int, accepted: int) -> None:
        """A verified draft of `k` tokens, of which the first `accepted` were right."""
        self.begin()
        for j in range(min(accepted + 1, k)):
            self.reach(j, j < accepted)

    @property
    def drafts(self) -> float:
        """How many drafts (decayed) stand behind the estimate: its confidence."""
        return self.reached[0] if self.reached else 0.0

    @property
    def pooled(self) -> float:
        """One rate for every position, with a weak prior (for reports)."""
        return (sum(self.passed) + PRIOR_RATE) / (sum(self.reached) + 1.0)

    def rates(
        self, k: int, prior: Sequence[float] | None = None, weight: float = 0.0
    ) -> list[float]:
        """Chance that draft token j is right given the ones before it were, for j < k.

        With a `prior` (one rate per position), each count is pulled towards it with
        `weight` pseudo-drafts. Without one, position 0 starts from `PRIOR_RATE` and each
        later position from the estimate of the one before it: a position no draft has
        reached yet is taken to be as good as the last one some draft did reach."""
        out: list[float] = []
        previous = PRIOR_RATE
        for j in range(k):
            reached = self.reached[j] if j < len(self.reached) else 0.0
            passed = self.passed[j] if j < len(self.passed) else 0.0
            if prior is None:
                rate = (passed + PRIOR_WEIGHT * previous) / (reached + PRIOR_WEIGHT)
            else:
                rate = (passed + weight * prior[j]) / (reached + weight)
            out.append(rate)
            previous = rate
        return out

    def upper_rates(self, k: int) -> list[float]:
        """How good each position could still be, given this evidence alone: the upper end
        of a one-sided 95% Wilson interval of its rate. 1 where no draft reached a
        position, near the rate where many did: a source whose drafts would not pay even
        at these rates has shown it, not merely been unlucky in a couple of drafts."""
        z2 = UPPER_Z * UPPER_Z
        out = []
        for j in range(k):
            n = self.reached[j] if j < len(self.reached) else 0.0
            if n <= 0.0:
                out.append(1.0)
                continue
            rate = (self.passed[j] if j < len(self.passed) else 0.0) / n
            centre = rate + z2 / (2 * n)
            spread = UPPER_Z * math.sqrt(rate * (1 - rate) / n + z2 / (4 * n * n))
            out.append(min(1.0, (centre + spread) / (1 + z2 / n)))
        return out


@dataclass
class Calibration:
    """What verified drafts delivered against what their estimates promised, position by
    position, apart for each band of how sure the estimate was of the first token
    (`CALIBRATION_BANDS`).

    The governor verifies the drafts whose estimates are highest at that moment, which is
    where an estimate errs upwards most: a request whose first drafts came true by chance
    looks like one that copies, and a draft whose first tokens copy a template is taken to
    stay on track past the template, where it parts from it. For each position j it keeps
    the chance its bets were given of their first j + 1 tokens all coming true, summed, and
    how many did; `rates` scales later estimates in that band so that those chances match
    what came true (never upwards), so bets that lose on the whole stop being made, at the
    lengths where they lose. A request that does copy, estimated surer, is judged in a band
    of its own."""

    decay: float = 1.0
    promised: list[list[float]] = field(
        default_factory=lambda: [[] for _ in range(len(CALIBRATION_BANDS) + 1)]
    )
    delivered: list[list[float]] = field(
        default_factory=lambda: [[] for _ in range(len(CALIBRATION_BANDS) + 1)]
    )

    def add(self, rates: Sequence[float], accepted: int) -> None:
        """A verified draft whose tokens were estimated (uncalibrated) at `rates`, of which
        the first `accepted` were right."""
        if not rates:
            return
        band = _band(rates[0])
        promised, delivered = self.promised[band], self.delivered[band]
        if len(promised) < len(rates):
            promised += [0.0] * (len(rates) - len(promised))
            delivered += [0.0] * (len(rates) - len(delivered))
        for j in range(len(promised)):
            promised[j] *= self.decay
            delivered[j] *= self.decay
        survive = 1.0
        for j, rate in enumerate(rates):
            survive *= rate
            promised[j] += survive
            delivered[j] += 1.0 if j < accepted else 0.0

    def share(self, band: int, position: int) -> float:
        """Of the chance that bets in `band` were given of reaching past `position`, the
        share that came true (never above 1; 1 without evidence)."""
        promised, delivered = self.promised[band], self.delivered[band]
        if position >= len(promised):
            return self.share(band, len(promised) - 1) if promised else 1.0
        return _came_true_share(delivered[position], promised[position])

    def rates(self, rates: Sequence[float]) -> list[float]:
        """`rates` calibrated: the chance of the first j + 1 tokens all being right scaled
        by its position's share, as conditional rates again."""
        if not rates:
            return []
        band = _band(rates[0])
        if not self.promised[band]:
            return list(rates)
        out: list[float] = []
        survive = reached = 1.0  # uncalibrated chance of getting this far; calibrated
        for j, rate in enumerate(rates):
            survive *= rate
            target = survive * self.share(band, j)
            calibrated = min(1.0, target / reached) if reached > 0.0 else 0.0
            out.append(calibrated)
            reached *= calibrated
        return out

    def report(self) -> dict[str, float]:
        """Each band's share of its promised tokens that came true, by its lowest
        first-token rate, where bets were made."""
        edges = (0.0, *CALIBRATION_BANDS)
        return {
            f"{edge:g}": round(_came_true_share(sum(delivered), sum(promised)), 3)
            for edge, promised, delivered in zip(edges, self.promised, self.delivered, strict=True)
            if promised
        }


def _band(first_rate: float) -> int:
    """The `CALIBRATION_BANDS` band of an estimate whose first token's rate is `first_rate`."""
    return bisect.bisect_right(CALIBRATION_BANDS, first_rate)


def _came_true_share(delivered: float, promised: float) -> float:
    """What came true of what was promised, pulled towards 1 by `CALIBRATION_PRIOR`, at
    most 1."""
    return min(1.0, (delivered + CALIBRATION_PRIOR) / (promised + CALIBRATION_PRIOR))


def sequence_rates(own: Acceptance, source: Sequence[float], weight: float) -> list[float]:
    """One sequence's rates: its own counts pulled towards its source's rates with
    `weight` pseudo-drafts. Where the sequence did better than the source at a position,
    the prior of the next one is lifted by as much (a copy on track stays on track): a
    request that copies well is believed after a few drafts, even where the source's
    other requests did not copy."""
    out: list[float] = []
    lift = 0.0
    for j, general in enumerate(source):
        reached = own.reached[j] if j < len(own.reached) else 0.0
        passed = own.passed[j] if j < len(own.passed) else 0.0
        prior = min(1.0, general + lift)
        rate = (passed + weight * prior) / (reached + weight)
        out.append(rate)
        lift = max(0.0, rate - general)
    return out


def accepted_by_length(rates: Sequence[float]) -> list[float]:
    """Expected accepted tokens of a draft cut to n tokens, for n = 0 .. len(rates)."""
    expected, survive = [0.0], 1.0
    for rate in rates:
        survive *= rate
        expected.append(expected[-1] + survive)
    return expected


@dataclass
class ShadowDraft:
    """A proposal whose tokens, from `verified` on, were not verified: each is compared
    with the token the sequence commits at its place, until one differs. For a
    deterministic draft that is exactly what verification would have found, at no cost."""

    source: str
    tokens: tuple[int, ...]
    start: int  # output length of the sequence when it was proposed
    verified: int = 0  # leading tokens that verification judges (and records)
    kind: str = ""  # the proposal's `DraftProposal.kind`
    checked: int = 0
    done: bool = False

    def score(self, output: Sequence[int], record: Callable[[int, bool], None]) -> None:
        """Compare the tokens committed since the last call; `record(position, right)`
        for each unverified position reached."""
        while not self.done and self.start + self.checked < len(output):
            j = self.checked
            right = output[self.start + j] == self.tokens[j]
            if j >= self.verified:
                record(j, right)
            elif not right:  # verification rejected it there and has recorded that
                self.done = True
                return
            self.checked += 1
            self.done = not right or self.checked == len(self.tokens)
