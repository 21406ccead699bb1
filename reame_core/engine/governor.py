"""The speculation governor: which draft sources are asked each step, for which sequences
and how many tokens, and which of their drafts are verified, so that speculation pays on
this host or costs (almost) nothing.

It learns online what it needs:
  - the target's cost of a decode by its passes over the weights (`DecodeCost`), so
    "verify k drafts" is priced against "decode one token" for the batch at hand;
  - each source's cost of proposing (`ProposeCost`): drafting, and catching up on what the
    sequence committed since the source last looked; from its timed calls, and before the
    first from the figure the source measured itself, if it gives one (`reame_draft_cost`);
  - each source's acceptance by draft position, over all requests and per request
    (`Acceptance`), from verified drafts and from drafts it scored without verifying them
    (`ShadowDraft`: a declined draft is checked against the tokens committed after it);
    and apart for each kind of draft a source tells apart (`DraftProposal.kind`), pulled
    towards the source's own while a kind's evidence is thin;
  - how much of what it expected the drafts it chose to verify delivered
    (`Calibration`), position by position: it picks the drafts whose estimates are
    highest, which is where estimates err upwards, so a source's estimates are scaled
    down by the shortfall of the bets it made at estimates like them.

Each step, sources are asked cheapest first. One whose call costs next to nothing (at most
`PROBE_BUDGET` of a step) is asked for every sequence. A dearer one is asked for a sequence
when the tokens its draft is expected to yield per second, its propose and catch-up time
included, beat both plain decoding and what the sources asked before it already offer;
otherwise only when a probe is due. Probes are paid from a budget (`PROBE_BUDGET` of the
decode time); a new request gets its own, they come again as soon as the budget allows
while the request's evidence is thin, and later and later once it shows the source does
not pay there. No probe of a source whose call costs more than a plain step goes where it
could not pay even if every draft of it came true, its catch-up on what it has not read
yet spread over the rest of the request: a draft model too slow next to verification on
this host is never asked, and never made to read a prompt to show it (a source that did
not give its cost is called to learn it; one priced out by the figure it gave is asked for
a new figure every `RETIME_AFTER` steps, `reprice_due`: a busy neighbour at start must not
keep it out for good); a cheaper source is looked at anyway, as
looking is how its evidence comes. One slow call must not condemn a source on a shared
host: until its price from timed calls is settled (`ProposeCost.settled`: its first call
is a warm-up, then three more) it is asked again each step for the one request it has least
to catch up on, if that is a few tokens, whatever its price and the budget; a price from
calls more than `RETIME_AFTER` steps ago is settled anew the same way (its first call then
reading one request, whatever it has to catch up on). Then, of the drafts in hand, the
governor verifies the plan with the most expected tokens per second; the drafts it does not
verify are scored in shadow.

Modes: ``off`` never drafts; ``on`` verifies every proposal at full length (to measure
what speculation costs); ``auto`` is the governor. A request may choose its own mode.
The governor decides; the engine calls the sources and verifies.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from reame_core.engine.acceptance import (
    Acceptance,
    Calibration,
    ShadowDraft,
    accepted_by_length,
    sequence_rates,
)
from reame_core.engine.decode_cost import DecodeCost
from reame_core.engine.propose_cost import ProposeCost
from reame_core.engine.sequence import Candidate as EngineSequence
from reame_core.hooktypes import DraftCost, DraftProposal, DraftRequest

Mode = Literal["auto", "on", "off"]
Price = Literal["cheap", "middling", "dear"]
MODES: tuple[Mode, ...] = ("auto", "on", "off")

# Draft lengths the planner tries; longer drafts only pay at high acceptance.
K_LADDER = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
DECAY = 0.98  # per draft: a source's acceptance follows its recent drafts
SEQ_DECAY = 0.95  # per draft: a request's own acceptance follows its recent text
SEQ_PRIOR = 2.0  # weight, in drafts, of the source's acceptance in a request's estimate
KIND_PRIOR = 4.0  # weight, in drafts, of the source's acceptance in one kind's estimate
PROBE_BUDGET = 0.01  # probes (and asking a source every step) may cost this share of decoding
PROBE_TOKENS = 4  # tokens asked of a probe
PROBE_EVERY = 8  # steps before a request probes a source shown not to pay (doubling)
PROBE_MAX = 4096
RETIME_AFTER = 4096  # steps without a call after which a price is measured anew
CONFIRM_BEHIND = 16  # most tokens a call made only to time a source may catch up on
SHADOWS_MAX = 32  # shadow drafts pending per request
IDLE_CALLS = 64  # a cheap source that offered a request nothing this many calls running
# is asked for it only every IDLE_CALLS steps (the draft model hook with no draft model)


@dataclass
class SourceState:
    """One draft source as the governor sees it, over all requests."""

    name: str
    proposed: int = 0
    accepted: int = 0
    drafts: int = 0  # verified drafts
    shadowed: int = 0  # drafts scored without verifying them
    acceptance: Acceptance = field(default_factory=lambda: Acceptance(DECAY))
    kinds: dict[str, Acceptance] = field(default_factory=dict)  # by `DraftProposal.kind`
    cost: ProposeCost = field(default_factory=ProposeCost)
    calls: int = 0
    propose_seconds: float = 0.0  # all its propose calls
    probes: int = 0  # calls made only to learn, not because they were expected to pay
    probe_seconds: float = 0.0
    credit: float = 0.0  # seconds it may still spend probing (< 0: repaid by decoding)
    called_at: int = 0  # step of its last call
    given_at: int = 0  # step it last gave its cost (`reame_draft_cost`), or was asked to
    k: int = 0  # length of its last verified draft
    # What its drafts chosen on their merit delivered against their estimates.
    calibration: Calibration = field(default_factory=lambda: Calibration(DECAY))
    gain: float | None = None  # as of the last report
    enabled: bool = True  # its drafts pay over all requests (or nothing is known yet)
    # new, drafting, watched (asked every step), probed, timing (its price being confirmed),
    # too dear, failed
    state: str = "new"
    reason: str = "no drafts yet"

    @property
    def alpha(self) -> float:
        """Per-token acceptance over all positions (for reports)."""
        return self.acceptance.pooled

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0


@dataclass
class _Own:
    """One source as one request sees it."""

    acceptance: Acceptance = field(default_factory=lambda: Acceptance(SEQ_DECAY))
    kinds: dict[str, Acceptance] = field(default_factory=dict)  # by `DraftProposal.kind`
    seen: int = 0  # tokens of the sequence (prompt + output) the source was last shown
    proposal: tuple[int, ...] = ()  # what it proposed then
    probe_at: int = 0  # step from which it may be probed for this request
    backoff: int = 0  # steps between probes; 0 while the evidence is thin
    idle: int = 0  # calls in a row that offered this request nothing


@dataclass
class _Request:
    """What the governor keeps about one decoding sequence."""

    sources: dict[str, _Own] = field(default_factory=dict)
    shadows: list[ShadowDraft] = field(default_factory=list)


@dataclass(frozen=True)
class _Offer:
    proposal: DraftProposal
    expected: list[float]  # expected accepted tokens by draft length (`accepted_by_length`)
    k: int  # the length at which verifying it alone would bring the most this step
    gain: float  # and that speed-up


@dataclass
class _Call:
    """A propose call being made: what it must catch up on, and whether it is a probe."""

    caught_up: dict[int, int]
    probe: bool


class Governor:
    def __init__(
        self,
        sources: Iterable[str],
        passes: Callable[[Sequence[tuple[int, int]]], list[int]],
        *,
        mode: Mode = "auto",
        draft_max: int = 32,
        threads: int = 1,
    ) -> None:
        self.mode = mode
        self.draft_max = draft_max
        self.cost = DecodeCost()
        self._costs = {threads: self.cost}  # one curve per thread count (`threads_changed`)
        self.sources = {name: SourceState(name) for name in sources}
        self._split = passes
        self._split_cache: dict[tuple[tuple[int, int], ...], list[int]] = {}
        self._seqs: dict[int, _Request] = {}
        self._step = 0
        self._decoding = 1  # sequences decoding at the last planned step
        self._base: float | None = None  # seconds of this step without drafts
        self._with_draft: dict[int, float] = {}  # seconds of this step, one sequence drafting k
        # This step's rates by request, source and kind: as estimated, and calibrated.
        self._rates_now: dict[tuple[int, str, str], tuple[list[float], list[float]]] = {}
        self._calls: dict[str, _Call] = {}
        self._by_key: dict[int, EngineSequence] = {}  # this step's decoding sequences
        self._order: tuple[int, list[str]] = (0, list(self.sources))  # (step, cheapest first)
        self._retired: set[str] = set()  # sources that failed: never asked again
        # This step's drafts chosen on their merit: source, and their tokens' rates as
        # estimated before calibration.
        self._bets: dict[int, tuple[str, list[float]]] = {}

    # ------------------------------------------------------------- asking

    def mode_of(self, seq: EngineSequence) -> Mode:
        return seq.params.speculate or self.mode

    def requests(
        self, decoding: Sequence[EngineSequence], n_ctx_seq: int, room: int
    ) -> list[DraftRequest]:
        """The sequences that may draft this step, each with the most tokens it may take
        (keeping the step within `room` batch tokens). Scores the shadow drafts against
        what the sequences committed since the last step."""
        self._step += 1
        self._decoding = max(1, len(decoding))
        self._with_draft = {}
        self._rates_now = {}
        self._calls = {}
        self._by_key = {seq.key: seq for seq in decoding}
        for seq in decoding:
            self._score_shadows(seq)
        if not decoding or self.draft_max <= 0 or not self.sources:
            return []
        per_sequence = min(self.draft_max, room // len(decoding) - 1)
        requests = []
        for seq in decoding:
            if self.mode_of(seq) == "off":
                continue
            context_left = n_ctx_seq - seq.n_kv - 2
            output_left = seq.params.max_tokens - len(seq.output) - 1
            limit = min(per_sequence, context_left, output_left)
            if limit > 0:
                requests.append(DraftRequest(seq, limit))
        if requests:  # the plain step's price, for this step's asking and choosing only
            plain = self._passes([(i, 1) for i in range(self._decoding)])
            covered = all(self.cost.covers(n) for n in plain)
            self._base = self.cost.seconds(plain) if covered else None
        return requests

    def ordered(self) -> list[str]:
        """Source names, cheapest to ask first (sorted anew every 16 steps): a dear source
        is asked only where the cheaper ones offer less than it would bring."""
        since, order = self._order
        if self._step - since >= 16:
            order = sorted(self.sources, key=lambda name: self.sources[name].cost.typical())
            self._order = (self._step, order)
        return [name for name in order if name not in self._retired] if self._retired else order

    def retire(self, source: str, reason: str) -> None:
        """`source` failed (its hook raised): it is never asked again, and reports say why.
        Drafts only ever save time, so requests go on without its drafts."""
        state = self.sources[source]
        state.enabled, state.state, state.reason = False, "failed", reason
        self._retired.add(source)
        self._calls.pop(source, None)

    def ask(
        self, source: str, requests: Sequence[DraftRequest], offered: Sequence[DraftProposal]
    ) -> list[DraftRequest]:
        """What to ask `source` this step. All of `requests` if asking costs next to
        nothing (its drafts are then verified where they pay and scored in shadow where
        they do not). Otherwise the sequences (and draft lengths; all it can draft, for a
        source cheaper than a step whose drafts have kinds) for which its draft is expected
        to pay, its propose time included, better than the `offered` proposals of the
        sources asked before it; and those for which a probe is due."""
        state = self.sources[source]
        base = self._base
        price = self._price(state, base)
        stale = self._stale(state)
        if price in ("middling", "dear") and stale:
            state.cost.unsettle()
        priced = price is not None
        if price == "cheap":
            awake = self._step % IDLE_CALLS == 0
            watched = [
                request
                for request in requests
                if awake or self._own(self._by_key[request.seq.key], source).idle < IDLE_CALLS
            ]
            if watched:
                self._calls[source] = _Call({}, probe=False)
            return watched
        weight = self.cost.prompt_share()
        # A call dearer than a plain step (a draft model) is not made where it cannot pay;
        # a cheaper one costs little to look at, and looking is how its evidence comes.
        dear = price == "dear"
        seqs = [self._by_key[request.seq.key] for request in requests]
        behind = {seq.key: self._behind(seq, self._own(seq, source)) for seq in seqs}
        rivals = self._rival_gains(offered) if base is not None else {}
        # A source timed too few times to condemn it (`ProposeCost.settled`) is asked again
        # at once, for the request it has least to catch up on, whatever the budget and its
        # price say.
        confirm = None
        if state.cost.known and not state.cost.settled and seqs:
            nearest = min(seqs, key=lambda seq: behind[seq.key])
            # Not a prompt read to time it, but once each re-timing (it has read nothing)
            if behind[nearest.key] <= CONFIRM_BEHIND or stale:
                confirm = nearest.key
        asked: list[DraftRequest] = []
        merit = False
        for request, seq in zip(requests, seqs, strict=True):
            limit, own = request.max_tokens, self._own(seq, source)
            if self.mode_of(seq) == "on":
                asked.append(request)
                merit = True
                continue

            def propose(k: int, behind: int = behind[seq.key]) -> float:
                return state.cost.predict(k, behind, weight)

            if priced:
                rates = self._rates(seq, state, own, limit)
                k, gain = self._best(accepted_by_length(rates), limit, propose)
                if k > 0 and gain > max(1.0, rivals.get(seq.key, 1.0)):
                    own.backoff = 0
                    # A source cheaper than a step whose drafts have kinds drafts all it
                    # can: a draft's kind may price it longer than the source's record
                    # does (`choose` cuts it).
                    asked.append(DraftRequest(seq, limit if state.kinds and not dear else k))
                    merit = True
                    continue
            confirming = seq.key == confirm
            if not confirming and (state.credit < 0.0 or self._step < own.probe_at):
                continue
            if (
                dear
                and not confirming
                and not self._may_pay(seq, state, limit, behind[seq.key], weight)
            ):
                own.probe_at = self._step + PROBE_EVERY  # costs change: looked at again then
                continue
            # A probe, paid from the budget. Not where the cheaper sources' drafts would do
            # better than this one could even if all its drafts came true. While this
            # request's own evidence leaves room for the source to pay, probe again as
            # soon as the budget allows; once it shows the source cannot, wait, longer
            # each time.
            upper = accepted_by_length(own.acceptance.upper_rates(limit))
            best_case = self._best(upper, limit, propose if priced else None)[1]
            if base is not None and best_case <= rivals.get(seq.key, 0.0):
                continue
            if priced and best_case < 1.0:
                own.backoff = min(2 * own.backoff, PROBE_MAX) if own.backoff else PROBE_EVERY
            else:
                own.backoff = 0
            own.probe_at = self._step + max(1, own.backoff)
            asked.append(DraftRequest(seq, min(PROBE_TOKENS, limit)))
        if asked:
            caught_up = {request.seq.key: behind[request.seq.key] for request in asked}
            self._calls[source] = _Call(caught_up, probe=not merit)
        return asked

    def proposed(
        self,
        source: str,
        seconds: float,
        asked: Sequence[DraftRequest],
        proposals: Sequence[DraftProposal],
    ) -> None:
        """`source` was asked `asked` and answered `proposals` in `seconds`."""
        state = self.sources.get(source)
        if state is None:
            return
        call = self._calls.pop(source, _Call({}, probe=False))
        state.calls += 1
        state.called_at = self._step
        state.propose_seconds += seconds
        if call.probe:
            state.probes += 1
            state.probe_seconds += seconds
            state.credit -= seconds
        drafted = max((len(p.tokens) for p in proposals), default=0)
        state.cost.observe(seconds, drafted, sum(call.caught_up.values()))
        by_seq = {p.seq.key: p.tokens for p in proposals}
        for request in asked:
            seq = self._by_key[request.seq.key]
            own = self._own(seq, source)
            tokens = by_seq.get(seq.key, ())
            own.idle = 0 if tokens else own.idle + 1
            if call.caught_up:  # a dear source: what it has read decides what it costs
                own.seen = _length(seq)
                own.proposal = tokens

    # ----------------------------------------------------------- planning

    def choose(
        self,
        decoding: Sequence[EngineSequence],
        requests: Sequence[DraftRequest],
        proposals: Iterable[DraftProposal],
    ) -> dict[int, DraftProposal]:
        """The drafts to verify this step, keyed by sequence key, each cut to its chosen
        length. What is not verified is scored in shadow."""
        limits = {r.seq.key: r.max_tokens for r in requests}
        by_key = {seq.key: seq for seq in decoding}
        forced: dict[int, DraftProposal] = {}
        offers: dict[int, _Offer] = {}
        candidates: list[DraftProposal] = []
        for proposal in proposals:
            key = proposal.seq.key
            seq = by_key.get(key)
            limit = limits.get(key, 0)
            if seq is None or not proposal.tokens or limit <= 0:
                continue
            proposal = _cut(proposal, limit)
            state = self.sources.get(proposal.source)
            if state is not None:
                candidates.append(proposal)
            if proposal.certain or self.mode_of(seq) == "on" or state is None:
                # Certain tokens cost no verification: always taken, before any guess.
                best = forced.get(key)
                if best is None or (proposal.certain, len(proposal.tokens)) > (
                    best.certain,
                    len(best.tokens),
                ):
                    forced[key] = proposal
            elif self._base is not None:
                own = self._own(seq, state.name)
                rates = self._rates(seq, state, own, len(proposal.tokens), proposal.kind)
                expected = accepted_by_length(rates)
                k, gain = self._best(expected, len(expected) - 1)
                if key not in offers or gain > offers[key].gain:
                    offers[key] = _Offer(proposal, expected, k, gain)
        plan = forced
        if len(decoding) == 1 and offers and not forced:  # its best length is the plan
            offer = next(iter(offers.values()))
            if offer.gain > 1.0:
                plan = {offer.proposal.seq.key: _cut(offer.proposal, offer.k)}
        elif offers:
            plan = self._plan(sorted(decoding, key=_seq_id), forced, offers)
        self._place_bets(plan, forced, offers)
        for proposal in candidates:
            chosen = plan.get(proposal.seq.key)
            verified = len(chosen.tokens) if chosen and chosen.source == proposal.source else 0
            if verified < len(proposal.tokens):
                self._shadow(proposal, verified)
        return plan

    def _place_bets(
        self,
        plan: Mapping[int, DraftProposal],
        forced: Mapping[int, DraftProposal],
        offers: Mapping[int, _Offer],
    ) -> None:
        """Remember what each draft chosen on its merit was estimated at, before
        calibration, for `record` to compare with what it yields."""
        self._bets = {}
        for key, draft in plan.items():
            rates = self._rates_now.get((key, draft.source, draft.kind))
            if key in forced or key not in offers or rates is None:
                continue
            raw, _ = rates
            self._bets[key] = (draft.source, raw[: len(draft.tokens)])

    def _plan(
        self,
        ordered: Sequence[EngineSequence],
        forced: dict[int, DraftProposal],
        offers: dict[int, _Offer],
    ) -> dict[int, DraftProposal]:
        """Try drafts of k tokens for the m most promising sequences, for every k on the
        ladder and every m (one drafting sequence may cost a pass of its own where all of
        them drafting together would share one); keep the best."""
        order = sorted(offers, key=lambda key: -offers[key].expected[-1])
        longest = max(len(offer.proposal.tokens) for offer in offers.values())
        best_plan = forced
        best_rate = self._rate(ordered, forced, offers)
        for k in K_LADDER:
            if k > longest:
                break
            plan = dict(forced)
            for key in order:
                if key in plan:
                    continue
                plan[key] = _cut(offers[key].proposal, k)
                rate = self._rate(ordered, plan, offers)
                if rate > best_rate:
                    best_plan, best_rate = dict(plan), rate
        return best_plan

    def _rate(
        self,
        ordered: Sequence[EngineSequence],
        plan: dict[int, DraftProposal],
        offers: dict[int, _Offer],
    ) -> float:
        """Expected tokens per second of a step that verifies `plan` (`ordered`: the
        decoding sequences in batch order)."""
        tokens = float(len(ordered))
        layout = []
        for seq in ordered:
            draft = plan.get(seq.key)
            n = len(draft.tokens) if draft else 0
            layout.append((seq.seq_id, 1 + n))
            offer = offers.get(seq.key)
            if draft is not None and draft.certain:
                tokens += n
            elif draft is not None and offer is not None:  # other forced drafts: misses
                tokens += offer.expected[n]
        seconds = self.cost.seconds(self._passes(layout))
        return tokens / seconds if seconds > 0 else 0.0

    def _best(
        self,
        expected: Sequence[float],
        limit: int,
        propose: Callable[[int], float] | None = None,
        verify: Callable[[int], float] | None = None,
    ) -> tuple[int, float]:
        """The draft length (on the ladder, or `limit` itself) with the best speed-up for
        one sequence of this step, and that speed-up: expected tokens per second, `propose`
        seconds included, over the plain step's. The step verifying k drafts takes
        `verify(k)` seconds (by default the cost curve's estimate). (0, 0.0) when nothing
        can be priced."""
        base = self._base
        limit = min(limit, len(expected) - 1)
        if base is None or base <= 0 or limit <= 0:
            return 0, 0.0
        verify = verify or self._drafting_seconds
        n = self._decoding
        if (n + expected[limit]) / verify(1) * base / n <= 1.0:
            return 0, 0.0  # even all its tokens at the price of one would not pay
        best_k, best = 0, 0.0
        for k in (*(k for k in K_LADDER if k < limit), limit):
            seconds = verify(k) + (propose(k) if propose else 0.0)
            gain = (n + expected[k]) / seconds * base / n
            if gain > best:
                best_k, best = k, gain
        return best_k, best

    def _may_pay(
        self, seq: EngineSequence, state: SourceState, limit: int, behind: int, weight: float
    ) -> bool:
        """Whether the source's drafts could pay for `seq` at all: if every one of them came
        true for the rest of the request, its reading of what it has not seen yet included,
        spread over the tokens the request may still generate. Where they could not, a probe
        would buy nothing but that reading."""
        left = max(1, seq.params.max_tokens - len(seq.output))
        cost = state.cost
        reading = max(0.0, cost.predict(0, behind, weight) - cost.predict(0, 1, weight))

        def propose(k: int) -> float:  # each step it reads the token committed after its draft
            return cost.predict(k, 1, weight) + reading * (1 + k) / left

        def verify(k: int) -> float:  # priced at most: a probe here is never a bargain
            return self._step_seconds(1, k, at_most=True)

        every_one_true = [float(j) for j in range(limit + 1)]
        return self._best(every_one_true, limit, propose, verify)[1] > 1.0

    def _stale(self, state: SourceState) -> bool:
        """Whether the source's price, from calls timed long ago, should be measured anew:
        what kept it from being asked (a busy neighbour, say) may be gone. Not a figure the
        source gave that no call has tested (a draft model too dear to pay is never made to
        read a prompt)."""
        return state.cost.timed and self._step - state.called_at > RETIME_AFTER

    def _drafting_seconds(self, k: int) -> float:
        """Predicted time of this step with one sequence verifying `k` drafts."""
        seconds = self._with_draft.get(k)
        if seconds is None:
            seconds = self._step_seconds(1, k)
            self._with_draft[k] = seconds
        return seconds

    def _rival_gains(self, offered: Sequence[DraftProposal]) -> dict[int, float]:
        """Per sequence, the best speed-up one of the `offered` drafts would bring (their
        propose time is spent already)."""
        gains: dict[int, float] = {}
        if self._base is None:
            return gains
        for proposal in offered:
            state = self.sources.get(proposal.source)
            seq = self._by_key.get(proposal.seq.key)
            if state is None or seq is None or not proposal.tokens:
                continue
            own = self._own(seq, state.name)
            rates = self._rates(seq, state, own, len(proposal.tokens), proposal.kind)
            _, gain = self._best(accepted_by_length(rates), len(proposal.tokens))
            key = proposal.seq.key
            gains[key] = max(gain, gains.get(key, 0.0))
        return gains

    def _rates(
        self, seq: EngineSequence, state: SourceState, own: _Own, k: int, kind: str = ""
    ) -> list[float]:
        """This request's acceptance by position for the source's drafts of `kind`, for
        drafts of up to `k` tokens: its own record, pulled towards the source's (computed
        once a step). For a kind, both records are the kind's, each pulled towards the
        source's."""
        key = (seq.key, state.name, kind)
        known = self._rates_now.get(key)
        if known is None or len(known[1]) < k:
            n = max(k, self.draft_max)
            general = state.acceptance.rates(n)
            mine = own.acceptance
            if kind:
                counts = state.kinds.get(kind)
                if counts is not None and counts.reached:
                    general = counts.rates(n, general, KIND_PRIOR)
                own_kind = own.kinds.get(kind)
                mine = own_kind if own_kind is not None else Acceptance()
            raw = general
            if mine.reached:
                raw = sequence_rates(mine, general, SEQ_PRIOR)
            known = self._rates_now[key] = (raw, state.calibration.rates(raw))
        return known[1][:k]

    def _passes(self, layout: Sequence[tuple[int, int]]) -> list[int]:
        """The backend's passes for `layout` (a pure function of it, so remembered)."""
        key = tuple(layout)
        passes = self._split_cache.get(key)
        if passes is None:
            if len(self._split_cache) >= 4096:
                self._split_cache.clear()
            passes = self._split_cache[key] = self._split(layout)
        return passes

    # ---------------------------------------------------------- learning

    def learn_costs(self, costs: Mapping[str, DraftCost]) -> None:
        """What sources measured their calls to cost themselves (`reame_draft_cost`, before
        the first step and when `reprice_due`): each is priced with it until its own timed
        calls take over, a figure given anew replacing the last."""
        for name, cost in costs.items():
            if name in self.sources:
                state = self.sources[name]
                state.cost.observe(cost.seconds, cost.drafted, cost.caught_up, given=True)
                state.given_at = self._step

    def reprice_due(self) -> list[str]:
        """Sources to ask for their cost anew (`reame_draft_cost`), counted as asked from
        now: each priced only by a figure it gave more than `RETIME_AFTER` steps ago, no
        call of it timed since. Such a source has not been called in all that time (a call
        is timed), as a rule because the figure priced it out ("too dear"); it may have been
        measured beside a busy neighbour, or before the host settled. A source that failed
        is never asked again."""
        due = [
            name
            for name, state in self.sources.items()
            if name not in self._retired
            and state.cost.given
            and self._step - max(state.given_at, state.called_at) > RETIME_AFTER
        ]
        for name in due:
            self.sources[name].given_at = self._step
        return due

    def threads_changed(self, threads: int) -> None:
        """The backend now computes with `threads` threads: decodes cost what they cost
        with that count (learned anew the first time, kept for when it comes back)."""
        self.cost = self._costs.setdefault(threads, DecodeCost())

    def observe_decode(self, layout: Sequence[tuple[int, int]], seconds: float) -> None:
        """A decode of `layout` took `seconds`: the cost curve learns, and every source's
        probing budget grows by its share of that time."""
        self.cost.observe(self._passes(layout), seconds)
        earned = PROBE_BUDGET * seconds
        for state in self.sources.values():
            state.credit = min(0.0, state.credit + earned)

    def record(self, seq: EngineSequence, draft: DraftProposal, accepted: int) -> None:
        """A verified draft: `accepted` of its tokens were right."""
        state = self.sources.get(draft.source)
        if state is None:
            return
        k = len(draft.tokens)
        state.proposed += k
        state.accepted += accepted
        state.drafts += 1
        state.k = k
        own = self._own(seq, state.name)
        for acceptance in _counts(state, own, draft.kind):
            acceptance.add(k, accepted)
        if accepted:
            self._hit(own)
        bet = self._bets.pop(seq.key, None)
        if bet is not None and bet[0] == state.name:
            state.calibration.add(bet[1], accepted)

    def forget(self, seq: EngineSequence) -> None:
        """The sequence is done: score its last shadow drafts, drop what was learned about
        it alone."""
        self._score_shadows(seq)
        self._seqs.pop(seq.key, None)

    def _count(self, state: SourceState, own: _Own, kind: str, position: int, right: bool) -> None:
        """A shadow draft of `kind` reached `position`, its token there `right` or not."""
        counts = _counts(state, own, kind)
        if position == 0:
            for acceptance in counts:
                acceptance.begin()
            state.shadowed += 1
            if right:
                self._hit(own)
        for acceptance in counts:
            acceptance.reach(position, right)

    def _hit(self, own: _Own) -> None:
        """A draft's first token was right: whatever this request showed before, its text
        may have turned to something the source can guess, so it is probed again now."""
        if own.backoff:
            own.backoff = 0
            own.probe_at = min(own.probe_at, self._step)

    def _own(self, seq: EngineSequence, source: str) -> _Own:
        request = self._seqs.get(seq.key)
        if request is None:
            request = self._seqs[seq.key] = _Request()
        own = request.sources.get(source)
        if own is None:
            # A new request probes a source known to be dear once it has decoded a few
            # tokens: by then the cheaper sources' drafts show whether it is needed at all.
            # One whose cost is not known yet (it gave none, `reame_draft_cost`) is looked at
            # at once.
            wait = PROBE_EVERY if self.sources[source].cost.known else 0
            own = request.sources[source] = _Own(probe_at=self._step + wait)
        return own

    def _behind(self, seq: EngineSequence, own: _Own) -> int:
        """Tokens the source must catch up on before it can propose for `seq`: what was
        committed since it last looked, but for the start of its own proposal that came
        true (a draft model keeps those in its context)."""
        behind = _length(seq) - own.seen
        if own.proposal and behind > 0:
            start = own.seen - len(seq.prompt_tokens)
            new = seq.output[start : start + len(own.proposal)]
            kept = 0
            for mine, real in zip(own.proposal, new, strict=False):
                if mine != real:
                    break
                kept += 1
            behind -= kept
        return behind

    def _shadow(self, proposal: DraftProposal, verified: int) -> None:
        request = self._seqs.get(proposal.seq.key)
        if request is None or len(request.shadows) >= SHADOWS_MAX:
            return
        start = len(proposal.seq.output_tokens)
        request.shadows.append(
            ShadowDraft(proposal.source, proposal.tokens, start, verified, proposal.kind)
        )

    def _score_shadows(self, seq: EngineSequence) -> None:
        request = self._seqs.get(seq.key)
        if request is None or not request.shadows:
            return
        for shadow in request.shadows:
            state, own = self.sources[shadow.source], request.sources[shadow.source]
            shadow.score(seq.output, functools.partial(self._count, state, own, shadow.kind))
        request.shadows = [shadow for shadow in request.shadows if not shadow.done]

    # ---------------------------------------------------------- judging

    def expected_gain(self, state: SourceState, every_one_true: bool = False) -> float | None:
        """Best expected speed-up from this source over all requests, at the last step's
        number of decoding sequences (one of them drafting, or all of them, which may
        share a pass), its propose time included; with `every_one_true`, the most it could
        bring if all of its drafts came true (verification priced at most, as the probes'
        gate prices it). None before the plain step is priced."""
        n = self._decoding
        if not all(self.cost.covers(size) for size in self._passes([(i, 1) for i in range(n)])):
            return None
        base = self._step_seconds(drafting=0, k=0)
        weight = self.cost.prompt_share()
        best = 0.0
        rates = state.calibration.rates(state.acceptance.rates(max(K_LADDER)))
        expected = accepted_by_length(rates)
        if every_one_true:
            expected = [float(j) for j in range(max(K_LADDER) + 1)]
        for k in K_LADDER:
            if k > self.draft_max:
                break
            for drafting in {1, n}:
                propose = state.cost.predict(k, drafting, weight)
                seconds = self._step_seconds(drafting, k, at_most=every_one_true) + propose
                tokens = n + drafting * expected[k]
                best = max(best, (tokens / seconds) / (n / base))
        return best

    def _judge(self, state: SourceState) -> None:
        """Say, for reports, whether the source pays over all requests, how it is asked,
        and why."""
        gain = self.expected_gain(state)
        state.gain = gain
        evidence = f"at acceptance {state.alpha:.2f} over {state.acceptance.drafts:.0f} drafts"
        price = self._price(state, self._step_seconds(drafting=0, k=0))
        best = None
        if gain is not None and price == "dear":
            best = self.expected_gain(state, every_one_true=True)
        if gain is None:
            state.enabled, state.state = True, "new"
            state.reason = "decode cost not measured yet"
        elif best is not None and best <= 1.0:
            priced = (
                f"at most {best:.2f}x even if every draft came true, at "
                f"{state.cost.typical() * 1000:.1f} ms a call"
            )
            if state.cost.timed and not state.cost.settled:
                # Too few calls timed to condemn it (one may have met a busy neighbour): it
                # is asked again at once, to confirm its price.
                state.enabled, state.state = True, "timing"
                state.reason = f"{priced}: timed again before it is judged"
            else:
                state.enabled, state.state = False, "too dear"
                state.reason = f"{priced}: not asked"
                if state.cost.given:
                    state.reason += f" (its cost is asked anew after {RETIME_AFTER} steps)"
        elif not state.acceptance.reached:
            state.enabled, state.state = True, "new"
            state.reason = "no drafts yet"
        elif gain >= 1.0:
            state.enabled, state.state = True, "drafting"
            state.reason = f"expected gain {gain:.2f}x {evidence}"
        elif price == "cheap":
            state.enabled, state.state = False, "watched"
            state.reason = (
                f"expected gain {gain:.2f}x < 1 {evidence}; asked every step (it costs next "
                "to nothing), verified where a request's own drafts pay"
            )
        else:
            state.enabled, state.state = False, "probed"
            state.reason = (
                f"expected gain {gain:.2f}x < 1 {evidence}; asked where its drafts should "
                f"yield more than the others', else probed within {PROBE_BUDGET:.0%} of "
                "decode time"
            )

    @staticmethod
    def _price(state: SourceState, base: float | None) -> Price | None:
        """How a call of the source compares with a plain step of `base` seconds: "cheap"
        (at most `PROBE_BUDGET` of it: asked every step), "dear" (more than the step: a
        draft model, called only where it can pay), else "middling"; None while either
        is unmeasured. Asking and reporting read it from here, so they never disagree."""
        if base is None or not state.cost.known:
            return None
        typical = state.cost.typical()
        if typical <= PROBE_BUDGET * base:
            return "cheap"
        return "dear" if typical > base else "middling"

    def _step_seconds(self, drafting: int, k: int, at_most: bool = False) -> float:
        """Predicted time of a step of the last planned size in which the first `drafting`
        sequences verify `k` draft tokens each; with `at_most`, the most it may take as far
        as the measurements show (`DecodeCost.pass_seconds_at_most`)."""
        n = self._decoding
        passes = self._passes([(i, 1 + k if i < drafting else 1) for i in range(n)])
        if at_most:
            return sum(self.cost.pass_seconds_at_most(size) for size in passes)
        return self.cost.seconds(passes)

    # ---------------------------------------------------------- reporting

    def report(self) -> dict[str, Any]:
        """What the governor knows and decided, as plain values (for the API and CLI)."""
        for state in self.sources.values():
            if state.name not in self._retired:
                self._judge(state)
        return {
            "mode": self.mode,
            "draft_max": self.draft_max,
            "sources": [
                {
                    "source": s.name,
                    "enabled": s.enabled,
                    "state": s.state,
                    "reason": s.reason,
                    "proposed": s.proposed,
                    "accepted": s.accepted,
                    "acceptance_rate": round(s.acceptance_rate, 4),
                    "drafts": s.drafts,
                    "shadow_drafts": s.shadowed,
                    "k": s.k,
                    "expected_gain": None if s.gain is None else round(s.gain, 3),
                    "calibration": s.calibration.report(),
                    "kinds": {kind: round(a.pooled, 4) for kind, a in sorted(s.kinds.items())},
                    "propose_ms": round(s.propose_seconds / s.calls * 1000, 3) if s.calls else 0.0,
                    "probes": s.probes,
                    "probe_ms": round(s.probe_seconds * 1000, 3),
                }
                for s in self.sources.values()
            ],
            "pass_ms": {n: round(t * 1000, 3) for n, t in self.cost.curve().items()},
        }


def _counts(state: SourceState, own: _Own, kind: str) -> list[Acceptance]:
    """The counts a draft of `kind` from `state`'s source teaches, over all requests and
    for its own: the source's, and the kind's if it has one (made on first use)."""
    counts = [state.acceptance, own.acceptance]
    if kind:
        counts += [_kind(state.kinds, kind, DECAY), _kind(own.kinds, kind, SEQ_DECAY)]
    return counts


def _kind(kinds: dict[str, Acceptance], kind: str, decay: float) -> Acceptance:
    """The counts of `kind` in `kinds`, made on first use."""
    counts = kinds.get(kind)
    if counts is None:
        counts = kinds[kind] = Acceptance(decay)
    return counts


def _length(seq: EngineSequence) -> int:
    return len(seq.prompt_tokens) + len(seq.output)


def _seq_id(seq: EngineSequence) -> int:
    return seq.seq_id


def _cut(proposal: DraftProposal, limit: int) -> DraftProposal:
    if len(proposal.tokens) <= limit:
        return proposal
    probs = None if proposal.probs is None else proposal.probs[:limit]
    return dataclasses.replace(proposal, tokens=proposal.tokens[:limit], probs=probs)
