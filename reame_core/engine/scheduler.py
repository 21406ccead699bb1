"""The scheduler: which requests hold slots, and what each step decodes.

It owns the waiting queue and the requests in flight. It admits a waiting request into
free slots when they suffice, reusing the longest prefix resident in a slot and then a
longer stored one (hook `reame_prefix_lookup`); a prompt whose beginning another slot is
computing right now waits for those chunks and copies them (`Phase.AWAITING_PREFIX`), so
requests arriving together behind one system prompt compute it once; one whose beginning
another process is computing and has promised to store waits for the stored state
(`reame_prefix_pending`, `Phase.AWAITING_STORE`). It learns where the prompt's prefixes
are worth storing (`reame_prefix_store_points`; a chunk ends there and its state goes to
`reame_prefix_store`), and says so (`reame_prefix_computing`). Each step it plans the
decodes: one batch with every decoding sequence's next token plus the drafts the governor
chose among those the sources offered (`reame_propose_drafts`), and one batch per prompt
chunk.

It decides what runs and never runs it: the runner decodes the batches, the committer
turns their rows into tokens.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections import deque
from collections.abc import Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any

import structlog

from reame_core.backend.base import Batch
from reame_core.engine.governor import Governor
from reame_core.engine.sampler import TokenSampler
from reame_core.engine.sequence import Candidate, Phase, RequestGroup
from reame_core.engine.slots import KVSlots, Slot, common_prefix
from reame_core.engine.stats import EngineStats
from reame_core.hooktypes import DraftProposal, DraftRequest, ModelInfo

log = structlog.get_logger(__name__)

FILLER_TOKEN = 0  # what a gap filler feeds: any token does, its row is thrown away
# The longest a request waits for a prefix another process promised (`Phase.AWAITING_STORE`),
# whatever its estimate; before the engine has computed a prompt, how long it waits.
MAX_PREFIX_WAIT_S = 30.0


@dataclass
class Planned:
    """One sequence's part of a decode: the tokens it feeds, the draft among them, and
    where its logits rows start in the decode's output."""

    seq: Candidate
    tokens: list[int]
    draft: DraftProposal | None = None
    first_row: int = 0
    unverified: bool = False  # a certain draft: one row of logits, after its last token


@dataclass
class DecodeCall:
    """One call of `backend.decode`: the batch, and whose tokens it holds in batch order.
    Not `priced`: a step with certain drafts or gap fillers, cheaper than verifying as many
    tokens, which the governor's cost curve (the price of drafts to verify) does not learn
    from. `fillers`: throwaway rows joining the sequence ids into fewer passes, to remove
    once the call has run."""

    batch: Batch
    planned: list[Planned]
    priced: bool = True
    fillers: dict[int, int] = dataclasses.field(default_factory=dict)  # `KVSlots.gap_fillers`


class Scheduler:
    def __init__(
        self,
        slots: KVSlots,
        info: ModelInfo,
        hook: Any,
        governor: Governor,
        draft_sources: Mapping[str, Any],
        stats: EngineStats,
        prefill_chunk: int,
        *,
        sessions_first: bool = True,
    ) -> None:
        self.slots = slots
        self.info = info
        self.hook = hook
        self.governor = governor
        self.stats = stats
        self.prefill_chunk = prefill_chunk
        self.sessions_first = sessions_first
        self.waiting: deque[RequestGroup] = deque()
        self.running: list[RequestGroup] = []
        self._draft_sources = dict(draft_sources)
        self._drafting = bool(self._draft_sources)

    # ------------------------------------------------------------- the queues

    def add(self, group: RequestGroup) -> None:
        self.waiting.append(group)

    def next_admissible(self) -> RequestGroup | None:
        """The next waiting request whose candidates the free slots hold, now running.

        First come, first served; but a request waiting for more slots than are free can
        be passed by later ones that fit, and with `sessions_first` a conversation's turn
        (a request naming its session) passes requests that name none: someone is waiting
        for each answer before asking the next, so every wait in the queue adds to the
        whole conversation's time, while a request on its own waits once. Either way the
        request at the head is passed by at most `n_seq_max` others. After that nothing
        starts before it, so the running requests free its slots as they finish: it waits
        a bounded time, and others are not held up behind it meanwhile. Candidates a
        running request starts later wait the same way (see `overdue`).
        """
        if not self.waiting:
            return None
        head = self.waiting[0]
        free = self.slots.free_count()
        may_pass = head.passed_by < self.info.n_seq_max
        group = None
        if self.sessions_first and may_pass:
            group = next((g for g in self.waiting if _turn(g) and g.width <= free), None)
        if group is None and head.width <= free:
            group = head
        if group is None and may_pass:
            group = next((g for g in self.waiting if g.width <= free), None)
        if group is not None and group is not head:
            head.passed_by += 1
        if group is not None:
            for running in self.running:
                if running.to_start:
                    running.passed_by += 1
            self.waiting.remove(group)
            self.running.append(group)
            group.passed_by = 0
        return group

    def overdue(self) -> list[RequestGroup]:
        """Running requests whose later candidates have let `n_seq_max` requests start
        before them: they go first now."""
        limit = self.info.n_seq_max
        return [g for g in self.running if g.to_start and g.passed_by >= limit]

    def start_later(self, group: RequestGroup) -> Candidate | None:
        """One of the candidates a selection asked for, in a free slot with the prompt's KV
        restored (or, should the model refuse the state, to compute again); None while
        no slot is free or the request runs as many as it may at once."""
        if group.running >= group.width or not self.slots.free_count():
            return None
        assert group.sampler is not None and group.prompt_state is not None
        number = len(group.sequences)
        seq = Candidate(
            group, number, self.slots.acquire(), group.sampler.fork(group.seed + number)
        )
        group.sequences.append(seq)
        group.to_start -= 1
        prompt = group.request.prompt_tokens
        if self.slots.restore(seq.slot, group.prompt_state, prompt):
            seq.phase = Phase.DECODING
        else:
            log.warning("the prompt's state was refused; computing it again")
            seq.phase = Phase.PREFILL
        return seq

    def drop(self, group: RequestGroup) -> None:
        """The request has ended (finished, failed or cancelled): it no longer runs."""
        self.running.remove(group)
        self._withdraw(group)

    def take_cancelled_waiting(self) -> list[RequestGroup]:
        cancelled = [g for g in self.waiting if g.cancelled]
        for group in cancelled:
            self.waiting.remove(group)
        return cancelled

    def cancelled_running(self) -> list[RequestGroup]:
        return [g for g in self.running if g.cancelled]

    def take_done(self) -> list[RequestGroup]:
        """Drop the requests whose candidates have all finished; count the sequences still
        running (before their callers hear of it: a reply may be read before the next step)."""
        done = []
        active = 0
        for group in self.running:
            if group.done:
                done.append(group)
            active += group.running
        for group in done:
            self.running.remove(group)
            self._withdraw(group)
        self.stats.active_sequences = active
        self.stats.waiting_requests = len(self.waiting)
        return done

    # -------------------------------------------------------------- admission

    def start(self, group: RequestGroup) -> None:
        """Give an admitted request its slots, the prefix they can reuse and its samplers."""
        request = group.request
        prompt = request.prompt_tokens
        seed = request.params.fixed_seed
        if seed is None:
            seed = secrets.randbits(63)
        sampler = TokenSampler(request.params, eog=self.info.eog, history=prompt, seed=seed)
        # At least two prompt tokens are computed: the last one's logits are needed, and a
        # lone token would take llama.cpp's decode path instead of the prefill path.
        limit = max(0, len(prompt) - 2)
        match = self.slots.longest_prefix(prompt, limit)
        session = request.session_id
        prefer = match.slot if match and self.slots.worth_taking(match, session) else None
        slot = self.slots.acquire(prefer=prefer, session=session)
        # Sequences own their slots from here on, so a failure below releases them.
        group.sequences.append(Candidate(group, 0, slot, sampler))
        if group.unstarted:  # candidates that may start later fork a sampler kept unused
            group.seed, group.sampler = seed, sampler.fork(seed)
        for candidate in range(1, group.width):
            sibling = Candidate(
                group, candidate, self.slots.acquire(), sampler.fork(seed + candidate)
            )
            group.sequences.append(sibling)
        if match is None:
            self.slots.truncate(slot, 0)
        elif match.slot is slot:
            self.slots.truncate(slot, match.length)
        else:
            self.slots.copy(match.slot, slot, match.length)
        self.slots.restore_spilled(slot, session, prompt, limit)
        held = len(slot.tokens)
        restored = self._restore_prefix(group, slot, limit)
        group.usage.prompt_tokens = len(prompt)
        group.usage.cached_tokens = len(slot.tokens)
        self.stats.prompt_tokens += len(prompt)
        if restored:  # the restored state replaced what the slot held
            self.stats.restored_tokens += len(slot.tokens)
        else:
            self.stats.reused_tokens += held
        have = len(slot.tokens)
        first = group.sequences[0]
        in_flight = self._prefix_in_flight(group, prompt, limit, have)
        promised = None if in_flight is not None else self._promised_elsewhere(prompt, have, limit)
        if in_flight is not None:
            first.leader, first.leader_prefix = in_flight
            first.phase = Phase.AWAITING_PREFIX
            have = first.leader_prefix
        elif promised is not None:
            first.phase = Phase.AWAITING_STORE
            first.prefix_due = time.perf_counter() + self._patience(promised - have)
            self.stats.prefix_waits += 1
            have = promised
        # On the grid: a stored prefix is restored and reused like a resident one.
        group.store_points = sorted(
            {
                self.slots.reusable(point)
                for points in self.hook.reame_prefix_store_points(
                    tokens=prompt, model=self.info, session=request.session_id
                )
                for point in points
                if have < self.slots.reusable(point) < len(prompt)
            }
        )
        if group.store_points:
            self._announce(group)
        group.prefill_started = time.perf_counter()

    def _announce(self, group: RequestGroup) -> None:
        """Tell the plugins which of the prompt's prefixes this request still means to store.
        A promise is a hint to other processes: a plugin failing to hear it fails nothing."""
        try:
            self.hook.reame_prefix_computing(
                tokens=group.request.prompt_tokens,
                points=tuple(group.store_points),
                model=self.info,
                request_id=group.request.request_id,
            )
        except Exception:
            log.exception("reame_prefix_computing failed; going on without the promise")

    def _promised_elsewhere(self, prompt: Seq[int], have: int, limit: int) -> int | None:
        """The longest prefix of `prompt` beyond `have` (at most `limit`) another process
        promised to store, or None (also should the plugin fail: then nothing is waited for)."""
        try:
            promised = self.hook.reame_prefix_pending(tokens=prompt, have=have, model=self.info)
        except Exception:
            log.exception("reame_prefix_pending failed; computing the prefix")
            return None
        return promised if promised is not None and have < promised <= limit else None

    def _withdraw(self, group: RequestGroup) -> None:
        """The request has ended with prefixes it said it would store unstored: other
        processes waiting for them stop waiting. (Store points left are points announced:
        a request announces them as it starts, and again whenever it drops some.)"""
        if group.store_points:
            group.store_points = []
            self._announce(group)

    def _patience(self, tokens: int) -> float:
        """How long a request waits at most for `tokens` prompt tokens another process
        promised: about as long as computing them here would take, at the rate this
        engine's prompt chunks have run so far. Before it has computed any, for as long as
        the promise stands: any rate assumed would be wrong tenfold between a small model
        on a fast host and a larger one on a slow host, and giving up early means waiting
        and then computing the prefix all the same."""
        stats = self.stats
        if stats.prefill_seconds > 0 and stats.prefill_tokens > 0:
            seconds = tokens * stats.prefill_seconds / stats.prefill_tokens
            return min(MAX_PREFIX_WAIT_S, seconds)
        return MAX_PREFIX_WAIT_S

    def _prefix_in_flight(
        self, group: RequestGroup, prompt: Seq[int], limit: int, have: int
    ) -> tuple[Candidate, int] | None:
        """The candidate of another request whose prompt, still being computed, shares the
        longest beginning with `prompt` beyond the `have` tokens already in this request's
        slot, and that length (on the grid, at most `limit`); None if none shares more.
        Only where a copied state can be cut back to the shared length."""
        if not self.info.prefix_trim_safe:
            return None
        best: tuple[Candidate, int] | None = None
        for other in self.running:
            if other is group:
                continue
            for seq in other.sequences:
                if seq.phase is not Phase.PREFILL:
                    continue
                shared = self.slots.reusable(min(common_prefix(seq.prompt_tokens, prompt), limit))
                if shared > have and (best is None or shared > best[1]):
                    best = (seq, shared)
        return best

    def _join_leader(self, seq: Candidate) -> None:
        """A candidate waiting for another slot to compute the beginning of its prompt:
        while that slot computes it, it waits; then it copies what the slot holds of it
        (all of it, or what there is if the other request ended first) and computes the
        rest of its prompt itself."""
        leader, until = seq.leader, seq.leader_prefix
        assert leader is not None
        if leader.phase is Phase.PREFILL and leader.n_kv < until:
            return
        prompt = seq.prompt_tokens
        have = seq.n_kv
        there = self.slots.shared_prefix(leader.slot, prompt, max(0, len(prompt) - 2))
        if there > have:
            self.slots.copy(leader.slot, seq.slot, there)
            seq.group.usage.cached_tokens += there - have
            self.stats.reused_tokens += there - have
        seq.leader = None
        seq.phase = Phase.PREFILL

    def _await_store(self, seq: Candidate) -> None:
        """A candidate waiting for a prefix another process is computing: while that is
        still promised, and for no longer than `_patience` allows, it waits;
        then it restores what is stored (all of it, or whatever there is if the other
        process did not store it) and computes the rest of its prompt itself."""
        group, prompt = seq.group, seq.prompt_tokens
        now = time.perf_counter()
        limit = max(0, len(prompt) - 2)
        if now < seq.prefix_due and self._promised_elsewhere(prompt, seq.n_kv, limit):
            return
        self.stats.prefix_wait_seconds += now - group.prefill_started
        held = seq.n_kv
        if self._restore_prefix(group, seq.slot, limit):
            # What the slot held was counted when the request started; count the rest.
            self.stats.restored_tokens += seq.n_kv - held
        have = seq.n_kv
        if group.store_points and group.store_points[0] <= have:
            group.store_points = [point for point in group.store_points if point > have]
            self._announce(group)
        seq.phase = Phase.PREFILL

    def _restore_prefix(self, group: RequestGroup, slot: Slot, limit: int) -> bool:
        """Restore the longest stored prefix of the request's prompt the plugins offer
        beyond what `slot` holds, into the request's usage: the state replaces the slot's,
        so all its tokens are restored ones."""
        prompt = group.request.prompt_tokens
        if not self._restore_offered(slot, prompt, len(slot.tokens), limit):
            return False
        group.usage.restored_tokens = group.usage.cached_tokens = len(slot.tokens)
        return True

    def _restore_offered(self, slot: Slot, prompt: Seq[int], reused: int, limit: int) -> bool:
        hit = self.hook.reame_prefix_lookup(tokens=prompt, reused=reused, model=self.info)
        if hit is None or hit.n_tokens <= reused or hit.n_tokens > len(prompt):
            return False
        held = prompt[: hit.n_tokens] if hit.state_tokens is None else hit.state_tokens
        if common_prefix(held, prompt) < hit.n_tokens or (
            len(held) > hit.n_tokens and not self.info.prefix_trim_safe
        ):
            log.error("stored prefix does not match the prompt; not restored", source=hit.source)
            return False
        if not self.slots.restore(slot, hit.state, held):
            log.warning("stored prefix was refused by the model", source=hit.source)
            return False
        self.slots.truncate(slot, self.slots.reusable(min(hit.n_tokens, limit)))
        return len(slot.tokens) > reused

    def store_prefix(self, seq: Candidate) -> None:
        """A prompt chunk ended short of the prompt's end: store the prefix if a store
        point asked for it there."""
        points = seq.group.store_points
        if points and points[0] == seq.n_kv:
            points.pop(0)
            state = self.slots.snapshot(seq.slot)
            tokens = list(seq.prompt_tokens[: seq.n_kv])
            self.hook.reame_prefix_store(tokens=tokens, state=state, model=self.info)

    # --------------------------------------------------------------- planning

    def schedule(self) -> list[DecodeCall]:
        """This step's decodes, in the order they run (none when nothing runs)."""
        decoding: list[Candidate] = []
        prefilling: list[Candidate] = []
        active = 0
        for group in self.running:
            for seq in group.sequences:
                phase = seq.phase
                if phase is Phase.AWAITING_PREFIX:
                    self._join_leader(seq)
                    phase = seq.phase
                elif phase is Phase.AWAITING_STORE:
                    self._await_store(seq)
                    phase = seq.phase
                if phase is Phase.DECODING:
                    decoding.append(seq)
                elif phase is Phase.PREFILL:
                    prefilling.append(seq)
                if phase is not Phase.FINISHED:
                    active += 1
        self.stats.active_sequences = active
        self.stats.waiting_requests = len(self.waiting)
        # Decode tokens (one per sequence) and each prompt chunk go to llama.cpp in separate
        # calls: it computes a sequence with one token in a micro-batch along another path
        # than one with several, and a prompt chunk must be computed the same way whatever
        # else runs, or its tokens would depend on the neighbours.
        calls = [self._plan_decoding(decoding)] if decoding else []
        if prefilling:
            calls += self._plan_prefill(prefilling)
        return calls

    def _plan_decoding(self, decoding: list[Candidate]) -> DecodeCall:
        drafts: dict[int, DraftProposal] = {}
        if self._drafting:
            # Prompt chunks have calls of their own: the decode batch may fill n_batch.
            requests = self.governor.requests(decoding, self.info.n_ctx_seq, self.info.n_batch)
            if requests:
                proposals = self._propose(requests)
                drafts = self.governor.choose(decoding, requests, proposals)
        if len(decoding) > 1:
            # With per-sequence KV, llama.cpp puts sequences in one micro-batch only while
            # their ids ascend by one in batch order; any other order costs extra passes.
            decoding = sorted(decoding, key=_seq_id)
        feeds = []
        for seq in decoding:
            draft = drafts.get(seq.key) if drafts else None
            tokens = [seq.next_token, *draft.tokens] if draft else [seq.next_token]
            feeds.append((seq, draft, tokens))
        fillers = self.slots.gap_fillers([(seq.seq_id, len(tokens)) for seq, _, tokens in feeds])
        gaps = sorted(fillers.items(), reverse=True)
        batch = Batch()
        planned = []
        rows = 0
        for seq, draft, tokens in feeds:
            while gaps and gaps[-1][0] < seq.seq_id:
                seq_id, position = gaps.pop()
                batch.add(FILLER_TOKEN, position, seq_id, False)
            # Certain tokens need no row of their own: only the one after them is sampled.
            unverified = draft is not None and draft.certain and not seq.group.keeps_logprobs
            last = len(tokens) - 1
            for offset, token in enumerate(tokens):
                batch.add(token, seq.n_kv + offset, seq.seq_id, not unverified or offset == last)
            planned.append(Planned(seq, tokens, draft, rows, unverified))
            rows += 1 if unverified else len(tokens)
        return DecodeCall(batch, planned, priced=rows == len(batch), fillers=fillers)

    def _propose(self, requests: list[DraftRequest]) -> list[DraftProposal]:
        """Ask the draft sources, cheapest first, what the governor wants of each (given
        what the ones before offered), timing them: it weighs their cost. Proposals carry
        the name of the plugin that made them."""
        proposals: list[DraftProposal] = []
        for name in self.governor.ordered():
            asked = self.governor.ask(name, requests, proposals)
            if not asked:
                continue
            started = time.perf_counter()
            try:
                result = self._draft_sources[name].function(requests=asked)
                made = [
                    p if p.source == name else dataclasses.replace(p, source=name)
                    for p in result or ()
                ]
            except Exception as error:  # a broken source costs its drafts, nothing more
                reason = f"its reame_propose_drafts raised {type(error).__name__}"
                log.exception("draft source failed; it is asked no more", source=name)
                self.governor.retire(name, reason)
                continue
            self.governor.proposed(name, time.perf_counter() - started, asked, made)
            proposals += made
        return proposals

    def _plan_prefill(self, prefilling: list[Candidate]) -> list[DecodeCall]:
        """One batch per prompt chunk, at most `prefill_chunk` prompt tokens a step: a long
        prompt cannot freeze the streams decoding beside it, and a request arriving while
        it is computed starts after one chunk, not after the whole prompt (a call is not
        interrupted). On CPUs a chunk of 128 costs about what a batch of 512 does per token
        (benchmarks/prefill_chunk.py)."""
        budget = self.prefill_chunk
        calls = []
        for seq in self._prefill_order(prefilling):
            if budget <= 0:
                seq.prefill_passed += 1
                continue
            seq.prefill_passed = 0
            take = self._chunk_length(seq, budget)
            start = seq.n_kv
            end = start + take
            last = len(seq.prompt_tokens) - 1
            batch = Batch()
            for position in range(start, end):
                batch.add(seq.prompt_tokens[position], position, seq.seq_id, position == last)
            calls.append(DecodeCall(batch, [Planned(seq, list(seq.prompt_tokens[start:end]))]))
            budget -= take
        return calls

    def _prefill_order(self, prefilling: list[Candidate]) -> list[Candidate]:
        """Shortest remaining prompt first: a request whose prefix was reused has a few
        tokens left to compute, and its first token should not wait behind a cold prompt
        of thousands that arrived before it. A prompt left without a chunk in `n_seq_max`
        steps goes first (in arrival order), so short prompts arriving without end cannot
        starve a long one. The order never changes a token: each chunk is computed on its
        own, on the grid, whatever runs beside it."""
        limit = self.info.n_seq_max

        def key(seq: Candidate) -> tuple[int, int]:
            return (0, 0) if seq.prefill_passed >= limit else (1, seq.prompt_remaining)

        return sorted(prefilling, key=key)

    def _chunk_length(self, seq: Candidate, budget: int) -> int:
        """How many prompt tokens to compute now: within the budget, on the grid, ending
        at the next store point, and never leaving or making a one-token chunk (a chunk of
        one is computed along the decode path, so its KV would differ from a cold
        prefill's)."""
        start, stop = seq.n_kv, len(seq.prompt_tokens)
        end = self.slots.chunk_end(start, stop, budget, self.info.n_batch)
        points = seq.group.store_points
        dropped = False
        while points and points[0] - start < 2:
            points.pop(0)  # too close to snapshot there without a one-token chunk
            dropped = True
        if dropped:
            self._announce(seq.group)
        if points and points[0] < end:
            end = points[0]
        return end - start


def _seq_id(seq: Candidate) -> int:
    return seq.seq_id


def _turn(group: RequestGroup) -> bool:
    """Whether a request is a turn of a conversation (it names its session)."""
    return group.request.session_id is not None
