"""The engine: one thread that owns the backend and advances every request, one step at a time.

Each step it admits waiting requests into free slots (reusing resident or stored prefixes),
asks the speculation governor which sequences draft and how much, builds one batch holding
every decoding sequence's next token (plus its drafts) and one batch per bounded prompt
chunk, decodes them, then samples or verifies per sequence and streams the new text out.
Callers talk to it only through `submit` (thread-safe) and the events it emits; nothing
outside this thread touches the backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import queue
import secrets
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import numpy as np
import structlog

from reame_core.backend.base import Backend, Batch, DecodeError
from reame_core.engine.cpu_share import CpuShare
from reame_core.engine.governor import Governor, Mode
from reame_core.engine.sampler import TokenSampler
from reame_core.engine.sequence import Candidate, Phase, RequestGroup
from reame_core.engine.slots import KVRollbackError, KVSlots, Slot, common_prefix
from reame_core.hooktypes import CandidateView, DraftProposal, DraftRequest, Verification
from reame_core.plugins import PluginHost
from reame_core.request import (
    Event,
    FinishEvent,
    FinishReason,
    GenerationRequest,
    TokenEvent,
    TokenLogprob,
    check_request,
)

log = structlog.get_logger(__name__)

_WAKE = object()


@dataclass
class EngineStats:
    """Counters since start; read by metrics and benchmarks (written by the engine only)."""

    requests_submitted: int = 0
    requests_finished: int = 0
    prompt_tokens: int = 0
    prefill_tokens: int = 0
    reused_tokens: int = 0
    restored_tokens: int = 0
    generated_tokens: int = 0
    decode_steps: int = 0
    decode_seconds: float = 0.0
    batch_tokens: int = 0
    active_sequences: int = 0
    waiting_requests: int = 0
    decode_errors: int = 0


@dataclass
class _Planned:
    seq: Candidate
    tokens: list[int]
    draft: DraftProposal | None = None


class Ticket:
    """A submitted request, as its submitter holds it."""

    def __init__(self, engine: Engine, group: RequestGroup) -> None:
        self._engine = engine
        self._group = group

    @property
    def request_id(self) -> str:
        return self._group.request.request_id

    def cancel(self) -> None:
        self._engine._cancel(self._group)


class Engine:
    def __init__(
        self,
        backend: Backend,
        plugins: PluginHost | None = None,
        *,
        prefill_chunk: int = 128,
        draft_max: int = 16,
        speculate: Mode = "auto",
        max_sessions: int | None = None,
        exact_reuse: bool = True,
        cpu_share: CpuShare | None = None,
        adapt_threads: bool = True,
    ) -> None:
        self.backend = backend
        self.info = backend.info
        self.plugins = plugins or PluginHost(discover=False)
        self.hook = self.plugins.hook
        self.slots = KVSlots(backend, max_sessions, exact_reuse=exact_reuse)
        self.prefill_chunk = prefill_chunk
        self._draft_sources = {
            impl.plugin_name: impl for impl in self.hook.reame_propose_drafts.get_hookimpls()
        }
        self.governor = Governor(
            list(self._draft_sources),
            backend.passes,
            mode=speculate,
            draft_max=draft_max,
            threads=backend.info.n_threads,
        )
        self.stats = EngineStats()
        if cpu_share is None and adapt_threads:
            cpu_share = CpuShare(self.info.n_threads, len(os.sched_getaffinity(0)))
        self.cpu_share = cpu_share
        if cpu_share is not None and cpu_share.active:
            backend.set_threads(cpu_share.threads)  # an earlier engine may have changed it
        self._inbox: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._waiting: deque[RequestGroup] = deque()
        self._groups: list[RequestGroup] = []
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._drafting = bool(self._draft_sources)
        self._constrained = self.plugins.has_implementations("reame_constrain_logits")
        self._committing = self.plugins.has_implementations("reame_tokens_committed")

    # ------------------------------------------------------------ public API

    def start(self) -> Engine:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="reame-engine", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Finish the engine thread; pending requests end as cancelled."""
        if self._thread is not None:
            self._stopping = True
            self._inbox.put(_WAKE)
            self._thread.join()
            self._thread = None
        self.hook.reame_shutdown()

    def submit(
        self, request: GenerationRequest, emit: Callable[[Event], None], *, checked: bool = False
    ) -> Ticket:
        """Queue a request (any thread). Raises RequestError if it cannot be served; with
        `checked`, the caller has run `check` on it already (the server does, before it
        takes a place in its queue)."""
        if not checked:
            self.check(request)
        group = RequestGroup(request, emit)
        self._inbox.put(group)
        return Ticket(self, group)

    def check(self, request: GenerationRequest, *, prompt_param: str = "prompt") -> None:
        """Refuse a request this engine cannot serve (any thread): the model's limits
        (`check_request`), then the plugins' (hook `reame_check_request`)."""
        check_request(request, self.info, prompt_param=prompt_param)
        self.hook.reame_check_request(request=request, model=self.info)

    def generate(
        self, request: GenerationRequest, on_event: Callable[[TokenEvent], None] | None = None
    ) -> FinishEvent:
        """Submit and wait (blocking). The engine thread must be running."""
        finished: list[FinishEvent] = []
        done = threading.Event()

        def emit(event: Event) -> None:
            if isinstance(event, FinishEvent):
                finished.append(event)
                done.set()
            elif on_event is not None:
                on_event(event)

        ticket = self.submit(request, emit)
        try:
            done.wait()
        except BaseException:
            ticket.cancel()
            raise
        return finished[0]

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Event]:
        """Submit and yield events; leaving the iteration early cancels the request."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()

        def emit(event: Event) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        ticket = self.submit(request, emit)
        finished = False
        try:
            while not finished:
                event = await events.get()
                finished = isinstance(event, FinishEvent)
                yield event
        finally:
            if not finished:
                ticket.cancel()

    def _cancel(self, group: RequestGroup) -> None:
        group.cancelled = True
        self._inbox.put(_WAKE)

    @property
    def busy(self) -> bool:
        return bool(self._groups or self._waiting or self.slots.stale_session())

    # ------------------------------------------------------------ the loop

    def _run(self) -> None:
        while not self._stopping:
            idle = not self.busy
            self._take_inbox(block=idle)
            if idle and self.cpu_share is not None:
                self.cpu_share.resume()
            if self._stopping:
                break
            try:
                self.step()
            except Exception as error:
                # Whatever went wrong, the thread must live on: every request depends on it.
                with contextlib.suppress(Exception):
                    log.exception("engine step failed; failing the requests in flight")
                self._fail_all(f"internal error in the engine ({type(error).__name__})")
        for group in [*self._groups, *self._waiting]:
            group.cancelled = True
        self._reap_cancelled()

    def _take_inbox(self, block: bool) -> None:
        try:
            item = self._inbox.get(block=block)
            while True:
                if isinstance(item, RequestGroup):
                    self._waiting.append(item)
                    self.stats.requests_submitted += 1
                item = self._inbox.get_nowait()
        except queue.Empty:
            return

    def step(self) -> bool:
        """Advance every request by one decode. Returns False when there was nothing to do."""
        self._take_inbox(block=False)
        self._reap_cancelled()
        self._admit()
        running = [seq for group in self._groups for seq in group.sequences]
        decoding = [seq for seq in running if seq.phase is Phase.DECODING]
        prefilling = [seq for seq in running if seq.phase is Phase.PREFILL]
        self._count_active()
        if not decoding and not prefilling:
            return self._refresh_session()

        # Decode tokens (one per sequence) and each prompt chunk go to llama.cpp in separate
        # calls: it computes a sequence with one token in a micro-batch along another path
        # than one with several, and a prompt chunk must be computed the same way whatever
        # else runs, or its tokens would depend on the neighbours.
        calls: list[tuple[Batch, list[_Planned]]] = []
        if decoding:
            batch = Batch()
            calls.append((batch, self._plan_decoding(batch, decoding)))
        calls += self._plan_prefill(prefilling, busy=bool(decoding))
        for batch, planned in calls:
            self._decode(batch, planned)
        self._settle_groups()
        self._count_active()
        self._fit_threads()
        return True

    def _fit_threads(self) -> None:
        """Decode with as many threads as the cores neighbours leave free (`CpuShare`)."""
        share = self.cpu_share
        threads = share.update() if share is not None else None
        if share is None or threads is None:
            return
        self.backend.set_threads(threads)
        self.governor.threads_changed(threads)
        self.hook.reame_threads_changed(threads=threads)
        log.info(
            "decoding threads changed", threads=threads, neighbours_cores=round(share.others, 2)
        )

    def _decode(self, batch: Batch, planned: list[_Planned]) -> None:
        """Decode one batch and hand each sequence its rows (valid until the next decode)."""
        started = time.perf_counter()
        try:
            logits = self.backend.decode(batch)
        except DecodeError as error:
            self.stats.decode_errors += 1
            log.error("decode failed", error=str(error), batch=len(batch))
            for item in planned:
                self._fail(item.seq.group, "the model could not decode this request")
            return
        elapsed = time.perf_counter() - started
        if self._drafting:  # the governor prices drafts by what decodes cost
            self.governor.observe_decode(
                [(item.seq.seq_id, len(item.tokens)) for item in planned], elapsed
            )
        self.stats.decode_steps += 1
        self.stats.decode_seconds += elapsed
        self.stats.batch_tokens += len(batch)

        row = 0
        for item in planned:
            seq = item.seq
            if seq.finished:  # failed or cancelled by an earlier call of this step
                continue
            self.slots.appended(seq.slot, item.tokens)
            if seq.phase is Phase.PREFILL:
                self.stats.prefill_tokens += len(item.tokens)
                if seq.prompt_remaining > 0:
                    self._store_prefix(seq)
                    continue
                self._prompt_ready(seq, logits[row])
                row += 1
            else:
                rows = logits[row : row + len(item.tokens)]
                row += len(item.tokens)
                if item.draft is None:
                    token, logprob = self._pick(seq, rows[0])
                    self._commit(seq, [token], [logprob] if logprob else [])
                else:
                    self._verify(seq, item.draft, rows, elapsed)

    def _refresh_session(self, session: str | None = None) -> bool:
        """Recompute a pinned session's generated tokens as prompt chunks, so its next turn
        can reuse them exactly (see `KVSlots`): when idle, or as that next turn arrives.
        Returns whether it did work."""
        slot = self.slots.stale_session(session)
        if slot is None:
            return False
        tokens = slot.tokens[slot.exact :] if len(slot.tokens) - slot.exact > 1 else []
        start = slot.exact
        if not tokens:  # one stale token: recompute it with its predecessor
            start = max(0, slot.exact - 1)
            tokens = slot.tokens[start:]
        self.slots.truncate(slot, start)
        while tokens:
            take = min(len(tokens), self.info.n_batch)
            if len(tokens) - take == 1:
                take -= 1
            batch = Batch()
            for offset, token in enumerate(tokens[:take]):
                batch.add(token, start + offset, slot.seq_id, False)
            try:
                self.backend.decode(batch)
            except DecodeError as error:
                log.warning("session refresh failed", error=str(error))
                self.slots.truncate(slot, 0)
                return True
            self.stats.decode_steps += 1
            self.stats.batch_tokens += take
            self.slots.appended(slot, tokens[:take])
            start += take
            tokens = tokens[take:]
        return True

    def _count_active(self) -> None:
        running = [seq for group in self._groups for seq in group.sequences]
        self.stats.active_sequences = sum(not seq.finished for seq in running)
        self.stats.waiting_requests = len(self._waiting)

    # ------------------------------------------------------------ admission

    def _admit(self) -> None:
        while self._waiting and self.slots.free_count() >= self._waiting[0].request.n:
            group = self._waiting.popleft()
            self._groups.append(group)
            try:
                if group.request.session_id is not None:  # its turn came before idle time
                    self._refresh_session(group.request.session_id)
                self._start(group)
            except Exception as error:  # one bad request must not wedge its slots
                log.error("request could not start", error=f"{type(error).__name__}: {error}")
                self._fail(group, "the request could not be started")

    def _start(self, group: RequestGroup) -> None:
        request = group.request
        prompt = request.prompt_tokens
        seed = request.params.seed
        if seed is None or seed < 0:  # llama.cpp's convention: a negative seed is random
            seed = secrets.randbits(63)
        sampler = TokenSampler(request.params, eog=self.info.eog, history=prompt, seed=seed)
        # At least two prompt tokens are computed: the last one's logits are needed, and a
        # lone token would take llama.cpp's decode path instead of the prefill path.
        limit = max(0, len(prompt) - 2)
        match = self.slots.longest_prefix(prompt, limit)
        slot = self.slots.acquire(prefer=match.slot if match else None, session=request.session_id)
        # Sequences own their slots from here on, so a failure below releases them.
        group.sequences.append(Candidate(group, 0, slot, sampler))
        for candidate in range(1, request.n):
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
        reused = len(slot.tokens)
        restored = self._restore_prefix(slot, prompt, reused, limit)
        group.usage.prompt_tokens = len(prompt)
        group.usage.cached_tokens = len(slot.tokens)
        group.usage.restored_tokens = len(slot.tokens) if restored else 0
        self.stats.prompt_tokens += len(prompt)
        self.stats.reused_tokens += 0 if restored else reused
        self.stats.restored_tokens += len(slot.tokens) if restored else 0
        group.store_points = sorted(
            {
                point
                for points in self.hook.reame_prefix_store_points(tokens=prompt, model=self.info)
                for point in points
                if len(slot.tokens) < point < len(prompt)
            }
        )
        group.prefill_started = time.perf_counter()

    def _restore_prefix(self, slot: Slot, prompt: Seq[int], reused: int, limit: int) -> bool:
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
        self.slots.truncate(slot, min(hit.n_tokens, limit))
        return len(slot.tokens) > reused

    def _store_prefix(self, seq: Candidate) -> None:
        points = seq.group.store_points
        if points and points[0] == seq.n_kv:
            points.pop(0)
            state = self.slots.snapshot(seq.slot)
            tokens = list(seq.prompt_tokens[: seq.n_kv])
            self.hook.reame_prefix_store(tokens=tokens, state=state, model=self.info)

    # ------------------------------------------------------------- planning

    def _plan_decoding(self, batch: Batch, decoding: list[Candidate]) -> list[_Planned]:
        drafts: dict[int, DraftProposal] = {}
        if self._drafting and decoding:
            # Prompt chunks have calls of their own: the decode batch may fill n_batch.
            requests = self.governor.requests(decoding, self.info.n_ctx_seq, self.info.n_batch)
            if requests:
                proposals = self._propose(requests)
                drafts = self.governor.choose(decoding, requests, proposals)
        planned = []
        # With per-sequence KV, llama.cpp puts sequences in one micro-batch only while their
        # ids ascend by one in batch order; any other order costs extra passes over weights.
        for seq in sorted(decoding, key=lambda s: s.seq_id):
            draft = drafts.get(id(seq))
            tokens = [seq.next_token, *draft.tokens] if draft else [seq.next_token]
            for offset, token in enumerate(tokens):
                batch.add(token, seq.n_kv + offset, seq.seq_id, True)
            planned.append(_Planned(seq, tokens, draft))
        return planned

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
            result = self._draft_sources[name].function(requests=asked)
            made = [
                p if p.source == name else dataclasses.replace(p, source=name) for p in result or ()
            ]
            self.governor.proposed(name, time.perf_counter() - started, asked, made)
            proposals += made
        return proposals

    def _plan_prefill(
        self, prefilling: list[Candidate], busy: bool
    ) -> list[tuple[Batch, list[_Planned]]]:
        """One batch per prompt chunk. While others decode, at most `prefill_chunk` prompt
        tokens run per step, so a long prompt cannot freeze their streams."""
        budget = self.prefill_chunk if busy else self.info.n_batch
        calls = []
        for seq in prefilling:
            if budget <= 0:
                break
            take = self._chunk_length(seq, budget)
            start = seq.n_kv
            end = start + take
            last = len(seq.prompt_tokens) - 1
            batch = Batch()
            for position in range(start, end):
                batch.add(seq.prompt_tokens[position], position, seq.seq_id, position == last)
            calls.append((batch, [_Planned(seq, list(seq.prompt_tokens[start:end]))]))
            budget -= take
        return calls

    def _chunk_length(self, seq: Candidate, budget: int) -> int:
        """How many prompt tokens to compute now: within the budget, ending at the next
        store point, and never leaving or making a one-token chunk (a chunk of one is
        computed along the decode path, so its KV would differ from a cold prefill's)."""
        remaining = seq.prompt_remaining
        take = min(remaining, max(budget, 2))
        points = seq.group.store_points
        while points and points[0] - seq.n_kv < 2:
            points.pop(0)  # too close to snapshot there without a one-token chunk
        if points and points[0] - seq.n_kv < take:
            take = points[0] - seq.n_kv
        if remaining - take == 1:
            take = take - 1 if take > 2 else take + 1
        return min(take, remaining, self.info.n_batch)

    # ------------------------------------------------------------- sampling

    def _pick(
        self, seq: Candidate, row: np.ndarray, pending: Seq[int] = ()
    ) -> tuple[int, TokenLogprob | None]:
        if self._constrained:
            self.hook.reame_constrain_logits(seq=seq, pending=pending, logits=row)
        sampler = seq.sampler
        adjusted = sampler.adjust(row, pending)
        if sampler.params.greedy:
            token = int(np.argmax(adjusted))
        else:
            token = sampler.draw(sampler.probabilities(adjusted))
        top = sampler.params.logprobs
        # Log-probabilities are the model's own (raw logits), as OpenAI and llama-server report.
        return token, (sampler.logprob(row, token, top) if top is not None else None)

    def _prompt_ready(self, seq: Candidate, row: np.ndarray) -> None:
        group = seq.group
        group.prefill_done = time.perf_counter()
        group.usage.prompt_ms = (group.prefill_done - group.prefill_started) * 1000
        siblings = [s for s in group.sequences if s.phase is Phase.AWAITING_CLONE]
        for sibling in siblings:
            self.slots.copy(seq.slot, sibling.slot, seq.n_kv)
        for candidate in [seq, *siblings]:
            candidate.phase = Phase.DECODING
            self.hook.reame_sequence_started(seq=candidate)
            own_row = row if candidate is seq else np.array(row, copy=True)
            token, logprob = self._pick(candidate, own_row)
            self._commit(candidate, [token], [logprob] if logprob else [])

    def _verify(
        self, seq: Candidate, draft: DraftProposal, rows: np.ndarray, elapsed: float
    ) -> None:
        if self._constrained:
            for i in range(len(rows)):
                self.hook.reame_constrain_logits(seq=seq, pending=draft.tokens[:i], logits=rows[i])
        verdict: Verification | None = self.hook.reame_verify_drafts(
            seq=seq, draft=draft, logits=rows, sampler=seq.sampler
        )
        if verdict is None:  # no verifier registered: keep nothing, sample normally
            verdict = Verification(0, (seq.sampler.sample(rows[0]),))
        accepted = verdict.accepted
        # KV now holds next_token + every draft; keep next_token + the accepted ones.
        try:
            self.slots.rollback(seq.slot, seq.n_kv - len(draft.tokens) + accepted)
        except KVRollbackError as error:  # only this request's KV is in doubt
            log.error("rejected drafts could not be dropped", error=str(error))
            self._fail(seq.group, "the model could not take back rejected draft tokens")
            return
        self.governor.record(seq, draft, accepted)  # it keeps the totals per source
        usage = seq.group.usage
        usage.draft_proposed[draft.source] = usage.draft_proposed.get(draft.source, 0) + len(
            draft.tokens
        )
        usage.draft_accepted[draft.source] = usage.draft_accepted.get(draft.source, 0) + accepted
        self.hook.reame_drafts_verified(
            seq=seq, draft=draft, accepted=accepted, step_seconds=elapsed
        )
        logprobs: list[TokenLogprob] = []
        top = seq.params.logprobs
        if top is not None:
            for i, token in enumerate(verdict.tokens):
                logprobs.append(seq.sampler.logprob(rows[i], token, top))
        self._commit(seq, list(verdict.tokens), logprobs)

    # ----------------------------------------------------------- committing

    def _commit(self, seq: Candidate, tokens: list[int], logprobs: list[TokenLogprob]) -> None:
        params = seq.params
        eog = self.info.eog
        committed: list[int] = []
        text = ""
        reason: FinishReason | None = None
        for token in tokens:
            if token in eog and not params.ignore_eos:
                reason = "stop"
                break
            committed.append(token)
            seq.output.append(token)
            seq.sampler.accept(token)
            text += seq.text.push(self.backend.token_bytes(token))
            if seq.text.stopped:
                reason = "stop"
                break
            if len(seq.output) >= params.max_tokens or seq.n_kv + 1 >= self.info.n_ctx_seq:
                reason = "length"
                break
        kept_logprobs = tuple(logprobs[: len(committed)])
        for item in kept_logprobs:
            seq.cumulative_logprob += item.logprob
        self.stats.generated_tokens += len(committed)
        if committed:
            seq.next_token = committed[-1]
            if self._committing:
                self.hook.reame_tokens_committed(seq=seq, tokens=committed)
        if reason is not None:
            text += seq.text.finish()
        if committed or text:
            self._emit(seq.group, TokenEvent(seq.candidate, tuple(committed), text, kept_logprobs))
        if reason is not None:
            self._finish(seq, reason)

    def _finish(self, seq: Candidate, reason: FinishReason) -> None:
        seq.phase = Phase.FINISHED
        seq.finish_reason = reason
        group = seq.group
        pin = group.request.session_id if seq.candidate == 0 else None
        self.slots.release(seq.slot, session=pin)
        group.usage.completion_tokens += len(seq.output)
        self._ended(seq)
        if len(group.sequences) > 1 and not group.done and not group.stop_others:
            selection = self.hook.reame_select_candidates(
                request=group.request, candidates=self._views(group), final=False
            )
            if selection is not None and selection.stop_others:
                group.stop_others = True
                for other in group.sequences:
                    if not other.finished:
                        self._finish(other, "stop")

    def _ended(self, seq: Candidate) -> None:
        """Every sequence passes here once, however it ends."""
        self.governor.forget(seq)
        reason = seq.finish_reason or "stop"
        self.hook.reame_generation_finished(seq=seq, finish_reason=reason, text=seq.text.text)

    def _settle_groups(self) -> None:
        done = [g for g in self._groups if g.done]
        for group in done:
            self._groups.remove(group)
        # Counted before the callers hear of it: a reply may be read before the next step.
        self._count_active()
        for group in done:
            self._complete(group)

    def _complete(self, group: RequestGroup, error: str | None = None) -> None:
        now = time.perf_counter()
        if group.prefill_done:
            group.usage.predicted_ms = (now - group.prefill_done) * 1000
        chosen: tuple[int, ...] = tuple(range(len(group.sequences)))
        if error is None and len(group.sequences) > 1:
            selection = self.hook.reame_select_candidates(
                request=group.request, candidates=self._views(group), final=True
            )
            if selection is not None:
                chosen = selection.chosen
        results = tuple(group.sequences[i].result() for i in chosen)
        self.stats.requests_finished += 1
        self._emit(group, FinishEvent(results, group.usage, error))

    def _views(self, group: RequestGroup) -> list[CandidateView]:
        return [
            CandidateView(
                s.candidate, tuple(s.output), s.text.text, s.finish_reason, s.cumulative_logprob
            )
            for s in group.sequences
        ]

    def _emit(self, group: RequestGroup, event: Event) -> None:
        try:
            group.emit(event)
        except Exception as error:  # a vanished listener cancels its request, nothing more
            log.warning(
                "event listener failed; cancelling",
                request=group.request.request_id,
                error=str(error),
            )
            group.cancelled = True

    # ------------------------------------------------------------- failures

    def _reap_cancelled(self) -> None:
        for group in [g for g in self._waiting if g.cancelled]:
            self._waiting.remove(group)
            self._complete(group)
        for group in [g for g in self._groups if g.cancelled]:
            for seq in group.sequences:
                if not seq.finished:
                    self._finish(seq, "cancelled")
            self._groups.remove(group)
            self._complete(group)

    def _fail(self, group: RequestGroup, message: str) -> None:
        if group not in self._groups:
            return
        for seq in group.sequences:
            self.slots.truncate(seq.slot, 0)
            if not seq.finished:
                seq.phase = Phase.FINISHED
                seq.finish_reason = "error"
                group.usage.completion_tokens += len(seq.output)
                self.slots.release(seq.slot)
                self._ended(seq)
        self._groups.remove(group)
        self._complete(group, error=message)

    def _fail_all(self, message: str) -> None:
        for group in list(self._groups):
            self._fail(group, message)
