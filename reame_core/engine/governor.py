"""The speculation governor: whether each sequence drafts this step, from which source,
and how many tokens, so that speculation pays on this host or is not done at all.

It learns online what it needs:
  - the target's cost of a decode by its passes over the weights (`DecodeCost`), so
    "verify k drafts" is priced against "decode one token" for the batch at hand;
  - each source's acceptance (decayed, globally and per sequence) and its cost of proposing.
Each step it evaluates a few plans (no drafts; drafts of k tokens for the most promising
sequences, k in a small ladder) and keeps the one with the most expected tokens per second.
A source whose expected gain falls below 1 is switched off, and tried again now and then
(with a growing interval while it keeps failing).

Modes: ``off`` never drafts; ``on`` verifies every proposal at full length (to measure
what speculation costs); ``auto`` is the governor. A request may choose its own mode.
The governor decides; the engine calls the sources and verifies.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from reame_core.engine.decode_cost import DecodeCost
from reame_core.engine.sequence import Sequence as EngineSequence
from reame_core.hooktypes import DraftProposal, DraftRequest

Mode = Literal["auto", "on", "off"]
MODES: tuple[Mode, ...] = ("auto", "on", "off")

# Draft lengths the planner tries; longer drafts only pay at high acceptance.
K_LADDER = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
DECAY = 0.98  # per verified draft: a source's acceptance follows its recent drafts
MIN_DRAFTS = 4  # drafts of evidence (or steps declined) before a source may be switched off
PROBE_EVERY = 64  # steps before a switched-off source is tried again (doubling)
PROBE_MAX = 4096
PROBE_BUDGET = 0.01  # probing may cost at most this share of the decoding time
PROBE_DRAFTS = 4  # drafts verified while probing
PROBE_TOKENS = 4  # tokens per probing draft
SEQ_PRIOR = 2.0  # weight of the source's acceptance in a sequence's own estimate


@dataclass
class Acceptance:
    """How drafts fared by position: (decayed) counts of drafts that reached position j,
    all tokens before it right, and of those whose token j was right too. Acceptance is
    not one coin per token: a copy that is on track tends to stay on track, so later
    positions pass more often than the first, and one rate for all positions misjudges
    what a long draft brings."""

    decay: float = 1.0
    reached: list[float] = field(default_factory=list)
    passed: list[float] = field(default_factory=list)

    def add(self, k: int, accepted: int) -> None:
        if len(self.reached) < k:
            grow = k - len(self.reached)
            self.reached += [0.0] * grow
            self.passed += [0.0] * grow
        if self.decay < 1.0:
            self.reached = [n * self.decay for n in self.reached]
            self.passed = [n * self.decay for n in self.passed]
        for j in range(min(accepted + 1, k)):
            self.reached[j] += 1.0
        for j in range(accepted):
            self.passed[j] += 1.0

    @property
    def pooled(self) -> float:
        """One rate for every position, with a weak prior (0.5 before any evidence)."""
        return (sum(self.passed) + 0.5) / (sum(self.reached) + 1.0)

    def rates(self, k: int, prior: Sequence[float], weight: float) -> list[float]:
        """Chance that draft token j is right given the ones before it were, for j < k:
        the counts, pulled towards `prior[j]` with `weight` pseudo-drafts."""
        out = []
        for j in range(k):
            reached = self.reached[j] if j < len(self.reached) else 0.0
            passed = self.passed[j] if j < len(self.passed) else 0.0
            out.append((passed + weight * prior[j]) / (reached + weight))
        return out


def accepted_by_length(rates: Sequence[float]) -> list[float]:
    """Expected accepted tokens of a draft cut to n tokens, for n = 0 .. len(rates)."""
    expected, survive = [0.0], 1.0
    for rate in rates:
        survive *= rate
        expected.append(expected[-1] + survive)
    return expected


@dataclass(frozen=True)
class _Offer:
    proposal: DraftProposal
    expected: list[float]  # expected accepted tokens by draft length (`accepted_by_length`)


@dataclass
class SourceState:
    """One draft source as the governor sees it."""

    name: str
    proposed: int = 0
    accepted: int = 0
    drafts: int = 0
    acceptance: Acceptance = field(default_factory=lambda: Acceptance(DECAY))
    propose_seconds: float = 0.0  # average time of one call proposing for all sequences
    calls: int = 0
    enabled: bool = True
    reason: str = "no drafts verified yet"
    gain: float | None = None
    k: int = 0  # length of its last verified draft
    declined: int = 0  # steps in a row its proposals were in no chosen plan
    probe_at: int = 0
    probe_left: int = 0
    backoff: int = PROBE_EVERY

    @property
    def alpha(self) -> float:
        """Per-token acceptance over all positions (for reports)."""
        return self.acceptance.pooled

    def rates(self, k: int) -> list[float]:
        return self.acceptance.rates(k, [self.acceptance.pooled] * k, 1.0)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0


class Governor:
    def __init__(
        self,
        sources: Iterable[str],
        passes: Callable[[Sequence[tuple[int, int]]], list[int]],
        *,
        mode: Mode = "auto",
        draft_max: int = 16,
        threads: int = 1,
    ) -> None:
        self.mode = mode
        self.draft_max = draft_max
        self.cost = DecodeCost()
        self._costs = {threads: self.cost}  # one curve per thread count (`threads_changed`)
        self.sources = {name: SourceState(name) for name in sources}
        self._passes = passes
        self._seqs: dict[tuple[int, str], Acceptance] = {}
        self._step = 0
        self._decoding = 1  # sequences decoding at the last planned step

    # ------------------------------------------------------------- asking

    def mode_of(self, seq: EngineSequence) -> Mode:
        return seq.params.speculate or self.mode

    def requests(
        self, decoding: Sequence[EngineSequence], n_ctx_seq: int, room: int
    ) -> tuple[list[DraftRequest], set[str]]:
        """Which sequences may draft (at most how many tokens each, keeping the step
        within `room` batch tokens) and which sources to ask."""
        self._step += 1
        self._decoding = max(1, len(decoding))
        if not decoding or self.draft_max <= 0 or not self.sources:
            return [], set()
        per_sequence = min(self.draft_max, room // len(decoding) - 1)
        requests = []
        modes = set()
        for seq in decoding:
            mode = self.mode_of(seq)
            context_left = n_ctx_seq - seq.n_kv - 2
            output_left = seq.params.max_tokens - len(seq.output) - 1
            limit = min(per_sequence, context_left, output_left)
            if mode != "off" and limit > 0:
                requests.append(DraftRequest(seq, limit))
                modes.add(mode)
        if not requests:
            return [], set()
        if "on" in modes:
            return requests, set(self.sources)
        for state in self.sources.values():
            if not state.enabled and state.probe_left == 0 and self._step >= state.probe_at:
                state.probe_left = PROBE_DRAFTS
        asked = {s.name for s in self.sources.values() if s.enabled or s.probe_left > 0}
        return (requests if asked else []), asked

    def proposed(self, source: str, seconds: float) -> None:
        """A source's propose call took `seconds`."""
        state = self.sources.get(source)
        if state is None:
            return
        state.calls += 1
        state.propose_seconds += (seconds - state.propose_seconds) / min(state.calls, 20)

    # ----------------------------------------------------------- planning

    def choose(
        self,
        decoding: Sequence[EngineSequence],
        requests: Sequence[DraftRequest],
        proposals: Iterable[DraftProposal],
    ) -> dict[int, DraftProposal]:
        """The drafts to verify this step, keyed by id(seq), each cut to its chosen length."""
        limits = {id(r.seq): r.max_tokens for r in requests}
        forced: dict[int, DraftProposal] = {}
        offers: dict[int, _Offer] = {}
        by_id = {id(seq): seq for seq in decoding}
        for proposal in proposals:
            key = id(proposal.seq)
            seq = by_id.get(key)
            limit = limits.get(key, 0)
            if seq is None or not proposal.tokens or limit <= 0:
                continue
            proposal = _cut(proposal, limit)
            state = self.sources.get(proposal.source)
            if self.mode_of(seq) == "on" or state is None:
                best = forced.get(key)
                if best is None or len(proposal.tokens) > len(best.tokens):
                    forced[key] = proposal
            elif not state.enabled:  # probing: verify a short draft to learn its acceptance
                if state.probe_left > 0 and key not in forced:
                    forced[key] = _cut(proposal, PROBE_TOKENS)
            else:
                offer = _Offer(proposal, self._expected(key, state, len(proposal.tokens)))
                if key not in offers or offer.expected[-1] > offers[key].expected[-1]:
                    offers[key] = offer
        if not offers:
            return forced
        ordered = sorted(decoding, key=_seq_id)  # batch order
        base = self._passes([(seq.seq_id, 1) for seq in ordered])
        if not all(self.cost.covers(n) for n in base):
            return forced  # the plain step is not measured yet: nothing to price against
        plan = self._plan(ordered, forced, offers)
        self._note_declined(offers, plan)
        return plan

    def _note_declined(self, offers: dict[int, _Offer], plan: dict[int, DraftProposal]) -> None:
        """A source whose proposals no plan wants is judged even though none are verified:
        asking it still costs its propose time."""
        offered = {offer.proposal.source for offer in offers.values()}
        chosen = {proposal.source for proposal in plan.values()}
        for name in offered:
            state = self.sources[name]
            if name in chosen:
                state.declined = 0
                continue
            state.declined += 1
            if state.declined >= MIN_DRAFTS:
                state.declined = 0
                self._judge(state, probing=False)

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
            draft = plan.get(id(seq))
            n = len(draft.tokens) if draft else 0
            layout.append((seq.seq_id, 1 + n))
            offer = offers.get(id(seq))
            if draft is not None and offer is not None:  # forced drafts count as misses
                tokens += offer.expected[n]
        seconds = self.cost.seconds(self._passes(layout))
        return tokens / seconds if seconds > 0 else 0.0

    def _expected(self, key: int, state: SourceState, k: int) -> list[float]:
        """Expected accepted tokens by draft length for this sequence: its own record,
        pulled towards its source's."""
        rates = state.rates(k)
        record = self._seqs.get((key, state.name))
        if record is not None:
            rates = record.rates(k, rates, SEQ_PRIOR)
        return accepted_by_length(rates)

    # ---------------------------------------------------------- learning

    def threads_changed(self, threads: int) -> None:
        """The backend now computes with `threads` threads: decodes cost what they cost
        with that count (learned anew the first time, kept for when it comes back)."""
        self.cost = self._costs.setdefault(threads, DecodeCost())

    def observe_decode(self, layout: Sequence[tuple[int, int]], seconds: float) -> None:
        self.cost.observe(self._passes(layout), seconds)

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
        state.acceptance.add(k, accepted)
        self._seqs.setdefault((id(seq), state.name), Acceptance()).add(k, accepted)
        if state.probe_left > 0:
            state.probe_left -= 1
            if state.probe_left == 0:
                self._judge(state, probing=True)
        elif self.mode_of(seq) == "auto" and state.drafts >= MIN_DRAFTS:
            self._judge(state, probing=False)

    def forget(self, seq: EngineSequence) -> None:
        """The sequence is done: drop what was learned about it alone."""
        for name in self.sources:
            self._seqs.pop((id(seq), name), None)

    def _judge(self, state: SourceState, probing: bool) -> None:
        """Keep the source on while its best draft length is expected to pay, its cost of
        proposing included; otherwise switch it off until the next probe."""
        gain = self.expected_gain(state)
        if gain is None:
            return
        state.gain = gain
        if gain >= 1.0:
            state.enabled = True
            state.backoff = PROBE_EVERY
            state.reason = f"expected gain {gain:.2f}x at acceptance {state.alpha:.2f}"
            return
        if probing or state.enabled:
            state.backoff = min(state.backoff * 2, PROBE_MAX) if probing else PROBE_EVERY
        state.enabled = False
        wait = state.backoff * max(1, math.ceil(self.probe_spacing() / PROBE_EVERY))
        state.probe_at = self._step + wait
        state.reason = (
            f"expected gain {gain:.2f}x < 1 at acceptance {state.alpha:.2f}; "
            f"tried again in {wait} steps"
        )

    def probe_spacing(self) -> int:
        """Fewest steps between probes for their verification to cost at most
        `PROBE_BUDGET` of the decoding time; the wait before a probe is the backoff
        stretched to at least this. On a host where a short draft costs several plain
        steps, this is what keeps a useless source nearly free."""
        base = self._step_seconds(drafting=0, k=0)
        probe = self._step_seconds(drafting=1, k=PROBE_TOKENS)
        if base <= 0:
            return PROBE_EVERY
        return math.ceil(PROBE_DRAFTS * max(0.0, probe - base) / (PROBE_BUDGET * base))

    def expected_gain(self, state: SourceState) -> float | None:
        """Best expected speed-up from this source at the last step's number of decoding
        sequences: one of them drafting, or all of them (which may share a pass)."""
        n = self._decoding
        if not all(self.cost.covers(size) for size in self._passes([(i, 1) for i in range(n)])):
            return None
        base = self._step_seconds(drafting=0, k=0)
        best = 0.0
        expected = accepted_by_length(state.rates(max(K_LADDER)))
        for k in K_LADDER:
            if k > self.draft_max:
                break
            for drafting in {1, n}:
                seconds = self._step_seconds(drafting, k) + state.propose_seconds
                tokens = n + drafting * expected[k]
                best = max(best, (tokens / seconds) / (n / base))
        return best

    def _step_seconds(self, drafting: int, k: int) -> float:
        """Predicted time of a step of the last planned size in which the first `drafting`
        sequences verify `k` draft tokens each."""
        n = self._decoding
        return self.cost.seconds(
            self._passes([(i, 1 + k if i < drafting else 1) for i in range(n)])
        )

    # ---------------------------------------------------------- reporting

    def report(self) -> dict[str, Any]:
        """What the governor knows and decided, as plain values (for the API and CLI)."""
        return {
            "mode": self.mode,
            "draft_max": self.draft_max,
            "sources": [
                {
                    "source": s.name,
                    "enabled": s.enabled,
                    "reason": s.reason,
                    "proposed": s.proposed,
                    "accepted": s.accepted,
                    "acceptance_rate": round(s.acceptance_rate, 4),
                    "drafts": s.drafts,
                    "k": s.k,
                    "expected_gain": None if s.gain is None else round(s.gain, 3),
                    "propose_ms": round(s.propose_seconds * 1000, 3),
                }
                for s in self.sources.values()
            ],
            "pass_ms": {n: round(t * 1000, 3) for n, t in self.cost.curve().items()},
        }


def _seq_id(seq: EngineSequence) -> int:
    return seq.seq_id


def _cut(proposal: DraftProposal, limit: int) -> DraftProposal:
    if len(proposal.tokens) <= limit:
        return proposal
    probs = None if proposal.probs is None else proposal.probs[:limit]
    return DraftProposal(proposal.seq, proposal.source, proposal.tokens[:limit], probs)
