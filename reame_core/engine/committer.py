"""The committer: what a decode's logits become — tokens, events, finished requests.

Given a decode's rows, it records the computed tokens in each slot, then per sequence:
at the end of a prompt copies the KV to the sibling candidates, starts each one (hook
`reame_sequence_started`) and samples its first token; otherwise samples the next token
or has the drafts verified (hook `reame_verify_drafts`, rolling back the rejected ones) —
all after the hook `reame_constrain_logits`. Committed tokens go through the stop checks
and the `TextStream` to a `TokenEvent` (hook `reame_tokens_committed`). It ends sequences
(hooks `reame_select_candidates`, `reame_generation_finished`) and requests, with a
`FinishEvent` whether they finished, failed or were cancelled. A request whose plan
holds its output back is streamed only then, as the chosen candidates.

It keeps no state of its own: sequences hold theirs, the scheduler holds the requests in
flight (the committer tells it when one leaves), the slots hold the KV record.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from collections.abc import Sequence as Seq
from typing import Any

import numpy as np
import structlog

from reame_core.backend.base import Backend
from reame_core.engine.governor import Governor
from reame_core.engine.recall import answer_key, recallable
from reame_core.engine.scheduler import Planned, Scheduler
from reame_core.engine.sequence import Candidate, Phase, RequestGroup
from reame_core.engine.slots import KVRollbackError, KVSlots
from reame_core.engine.stats import EngineStats
from reame_core.hooktypes import (
    CandidateView,
    DraftProposal,
    RecalledAnswer,
    TargetSampler,
    Verification,
)
from reame_core.plugins import PluginHost
from reame_core.request import (
    CandidateResult,
    Event,
    FinishEvent,
    FinishReason,
    TokenEvent,
    TokenLogprob,
)

log = structlog.get_logger(__name__)


class Committer:
    def __init__(
        self,
        backend: Backend,
        slots: KVSlots,
        scheduler: Scheduler,
        governor: Governor,
        plugins: PluginHost,
        stats: EngineStats,
        *,
        recall: bool = False,
    ) -> None:
        self.backend = backend
        self.info = backend.info
        self.slots = slots
        self.scheduler = scheduler
        self.governor = governor
        self.plugins = plugins
        self.hook: Any = plugins.hook
        self.stats = stats
        self._constrained = plugins.has_implementations("reame_constrain_logits")
        # Answers are remembered only where a request alone fixes them (`engine.recall`).
        self._recall = recall and (
            plugins.has_implementations("reame_recall_answer")
            or plugins.has_implementations("reame_remember_answer")
        )
        self._committing = plugins.has_implementations("reame_tokens_committed")
        self._ending = self._constrained and plugins.has_implementations("reame_forced_end")

    # ----------------------------------------------------------------- memory

    def recall(self, group: RequestGroup) -> bool:
        """Answer a request a plugin remembers (hook `reame_recall_answer`): its output and
        its end are sent now, and it never waits for a slot. False: it is computed."""
        if not self._recall or not recallable(group.request, group.plan):
            return False
        group.answer_key = answer_key(group.request, self.info)
        if group.answer_key is None:
            return False
        try:
            answer = self.hook.reame_recall_answer(
                request=group.request, key=group.answer_key, model=self.info
            )
        except Exception:  # a memory that fails to answer costs the computation, no more
            log.exception("recalling an answer failed; computing it")
            return False
        if answer is None:
            return False
        usage = group.usage
        usage.prompt_tokens = usage.cached_tokens = len(group.request.prompt_tokens)
        usage.completion_tokens = usage.recalled_tokens = len(answer.tokens)
        self.stats.recalled_requests += 1
        self._emit(group, TokenEvent(0, answer.tokens, answer.text))
        result = CandidateResult(0, answer.text, answer.tokens, answer.finish_reason)
        self.stats.requests_finished += 1
        self._emit(group, FinishEvent((result,), usage))
        return True

    def _remember(self, group: RequestGroup, results: Seq[CandidateResult]) -> None:
        """Hand a complete answer that its request alone fixed to the plugins that keep
        them (hook `reame_remember_answer`)."""
        if group.answer_key is None or len(results) != 1:
            return
        result = results[0]
        if result.finish_reason not in ("stop", "length"):
            return
        answer = RecalledAnswer(result.tokens, result.text, result.finish_reason)
        try:
            self.hook.reame_remember_answer(
                request=group.request, key=group.answer_key, answer=answer
            )
        except Exception:  # the answer is sent all the same
            log.exception("remembering an answer failed")

    # ------------------------------------------------------------------- rows

    def take(self, planned: list[Planned], logits: np.ndarray, elapsed: float) -> None:
        """Hand each planned sequence its rows of a decode that took `elapsed` seconds."""
        for item in planned:
            seq = item.seq
            if seq.finished:  # ended earlier in this step: failed, cancelled or stopped
                continue
            try:
                self._take_one(item, logits, elapsed)
            except Exception as error:
                self.fault(seq.group, error)

    def _take_one(self, item: Planned, logits: np.ndarray, elapsed: float) -> None:
        seq = item.seq
        prefill = seq.phase is Phase.PREFILL
        self.slots.appended(seq.slot, item.tokens, chunk=prefill)
        if prefill:
            self.stats.prefill_tokens += len(item.tokens)
            self.stats.prefill_seconds += elapsed
            if seq.prompt_remaining > 0:
                self.scheduler.store_prefix(seq)
                return
            self._prompt_ready(seq, logits[item.first_row])
        else:
            if item.unverified:
                assert item.draft is not None
                self._append_certain(seq, item.draft, logits[item.first_row], elapsed)
                return
            rows = logits[item.first_row : item.first_row + len(item.tokens)]
            if item.draft is None:
                token, logprob = self._pick(seq, rows[0])
                self._commit(seq, [token], [logprob] if logprob else [])
            else:
                self._verify(seq, item.draft, rows, elapsed)

    # --------------------------------------------------------------- sampling

    def _pick(
        self, seq: Candidate, row: np.ndarray, pending: Seq[int] = ()
    ) -> tuple[int, TokenLogprob | None]:
        if self._constrained:
            self.hook.reame_constrain_logits(seq=seq, pending=pending, logits=row)
        token = seq.sampler.sample(row, pending)
        return token, self._logprob(seq, row, token)

    def _logprob(self, seq: Candidate, row: np.ndarray, token: int) -> TokenLogprob | None:
        """The model's own log-probability of `token` (raw logits, as OpenAI and llama-server
        report), when the caller or candidate selection wants it."""
        if not seq.group.keeps_logprobs:
            return None
        return seq.sampler.logprob(row, token, seq.params.logprobs or 0)

    def _prompt_ready(self, seq: Candidate, row: np.ndarray) -> None:
        group = seq.group
        if not group.prefill_done:
            group.prefill_done = time.perf_counter()
            group.usage.prompt_ms = (group.prefill_done - group.prefill_started) * 1000
        if group.sampler is not None and group.prompt_state is None:
            # Candidates that start later get this prompt's KV and logits, not a prefill.
            group.prompt_state = self.slots.snapshot(seq.slot)
            group.prompt_row = np.array(row, copy=True)
        siblings = [s for s in group.sequences if s.phase is Phase.AWAITING_CLONE]
        for sibling in siblings:
            self.slots.copy(seq.slot, sibling.slot, seq.n_kv)
        raw = np.array(row, copy=True) if siblings and self._constrained else row
        for candidate in [seq, *siblings]:
            # A constraint edits its row in place: each candidate's must see the model's own.
            self._begin(candidate, row if candidate is seq else np.array(raw, copy=True))

    def _begin(self, seq: Candidate, row: np.ndarray) -> None:
        """The candidate's prompt is in its KV and `row` holds the prompt's last logits:
        it decodes from here, starting with a token sampled from that row."""
        seq.phase = Phase.DECODING
        self.hook.reame_sequence_started(seq=seq)
        token, logprob = self._pick(seq, row)
        self._commit(seq, [token], [logprob] if logprob else [])

    def start_later(self, running: Seq[RequestGroup]) -> None:
        """Start the candidates selections asked for, as slots allow, within the slots
        their requests may hold at once."""
        for group in list(running):
            try:
                while group.to_start and (seq := self.scheduler.start_later(group)) is not None:
                    if seq.phase is Phase.DECODING:
                        assert group.prompt_row is not None
                        self._begin(seq, np.array(group.prompt_row, copy=True))
            except Exception as error:
                self.fault(group, error)

    def _verify(
        self, seq: Candidate, draft: DraftProposal, rows: np.ndarray, elapsed: float
    ) -> None:
        if self._constrained:
            for i in range(len(rows)):
                self.hook.reame_constrain_logits(seq=seq, pending=draft.tokens[:i], logits=rows[i])
        sampler: TargetSampler = seq.sampler  # what plugins may use of it
        verdict: Verification | None = self.hook.reame_verify_drafts(
            seq=seq, draft=draft, logits=rows, sampler=sampler
        )
        if verdict is None:  # no verifier registered: keep nothing, sample normally
            verdict = Verification(0, (seq.sampler.sample(rows[0]),))
        accepted = verdict.accepted
        # KV now holds next_token + every draft; keep next_token + the accepted ones.
        try:
            self.slots.rollback(seq.slot, seq.n_kv - len(draft.tokens) + accepted)
        except KVRollbackError as error:  # only this request's KV is in doubt
            log.error("rejected drafts could not be dropped", error=str(error))
            self.fail(seq.group, "the model could not take back rejected draft tokens")
            return
        self._account(seq, draft, accepted, elapsed)
        logprobs = [self._logprob(seq, rows[i], token) for i, token in enumerate(verdict.tokens)]
        self._commit(seq, list(verdict.tokens), [lp for lp in logprobs if lp is not None])

    def _append_certain(
        self, seq: Candidate, draft: DraftProposal, row: np.ndarray, elapsed: float
    ) -> None:
        """A certain draft (see `DraftProposal`): its tokens follow as they are, and `row`,
        the logits after the last of them, gives the next token, as after accepted drafts.
        Sampling would have drawn once at each of those places: the candidate's random
        stream draws as often, so a seeded request samples what it samples without drafts."""
        if not seq.sampler.greedy:
            for _ in draft.tokens:
                seq.sampler.uniform()
        token, _ = self._pick(seq, row, draft.tokens)
        self._account(seq, draft, len(draft.tokens), elapsed)
        self._commit(seq, [*draft.tokens, token], [])

    def _account(self, seq: Candidate, draft: DraftProposal, accepted: int, elapsed: float) -> None:
        """`accepted` of the draft's tokens stand: the governor's and the request's totals,
        and the plugins' `reame_drafts_verified`."""
        self.governor.record(seq, draft, accepted)  # it keeps the totals per source
        usage = seq.group.usage
        usage.draft_proposed[draft.source] = usage.draft_proposed.get(draft.source, 0) + len(
            draft.tokens
        )
        usage.draft_accepted[draft.source] = usage.draft_accepted.get(draft.source, 0) + accepted
        self.hook.reame_drafts_verified(
            seq=seq, draft=draft, accepted=accepted, step_seconds=elapsed
        )

    # ------------------------------------------------------------- committing

    def _commit(self, seq: Candidate, tokens: list[int], logprobs: list[TokenLogprob]) -> None:
        params = seq.params
        group = seq.group
        committed: list[int] = []
        # Every token but the last is already in the KV (accepted or certain drafts): each
        # is checked against the room the KV had when one-token steps would have picked it.
        kv_before = seq.n_kv - len(tokens) + 1
        text, reason = self._append(seq, tokens, kv_before, committed)
        kept_logprobs = tuple(logprobs[: len(committed)])
        for item in kept_logprobs:
            seq.cumulative_logprob += item.logprob
        if params.logprobs is None:
            kept_logprobs = ()  # summed for candidate selection only
        self._committed(seq, committed)
        if reason is None and committed and self._may_end_forced(seq):
            ending = self.hook.reame_forced_end(seq=seq)
            if ending is not None:
                # Nothing but these tokens and then the end can follow: they are committed
                # without computing their steps, and the sequence ends as on an
                # end-of-generation token.
                forced: list[int] = []
                more, reason = self._append(seq, ending, kv_before + len(committed), forced)
                text += more
                self._committed(seq, forced)
                committed += forced
                reason = reason or "stop"
        self.stats.generated_tokens += len(committed)
        if reason is not None:
            text += seq.text.finish()
        if committed or text:
            event = TokenEvent(seq.candidate, tuple(committed), text, kept_logprobs)
            if group.held_back:
                seq.held.append(event)
            else:
                self._emit(group, event)
        if group.plan is not None and group.plan.select_each_step:
            group.selection_due = group.selection_due or bool(committed) or reason is not None
        if reason is not None:
            self._finish(seq, reason)

    def _committed(self, seq: Candidate, tokens: list[int]) -> None:
        if tokens:
            seq.next_token = tokens[-1]
            if self._committing:
                self.hook.reame_tokens_committed(seq=seq, tokens=tokens)

    def _may_end_forced(self, seq: Candidate) -> bool:
        """Whether a forced end may be committed without its steps: not where the request
        keeps logprobs (those tokens would have none), nor where it ignores the end (its
        steps would go on past it)."""
        return self._ending and not seq.group.keeps_logprobs and not seq.params.ignore_eos

    def _append(
        self, seq: Candidate, tokens: Seq[int], kv_first: int, committed: list[int]
    ) -> tuple[str, FinishReason | None]:
        """Append `tokens` to the output (and to `committed`) up to an end: an
        end-of-generation token, a stop string, `max_tokens`, or the context full where
        one-token steps would have found it (`kv_first`: the KV's size when the first of
        them was picked). The text they add, and the reason they ended, if they did."""
        params = seq.params
        eog = self.info.eog
        text = ""
        for index, token in enumerate(tokens):
            if token in eog and not params.ignore_eos:
                return text, "stop"
            committed.append(token)
            seq.output.append(token)
            seq.sampler.accept(token)
            text += seq.text.push(self.backend.token_bytes(token))
            if seq.text.stopped:
                return text, "stop"
            if len(seq.output) >= params.max_tokens or kv_first + index + 1 >= self.info.n_ctx_seq:
                return text, "length"
        return text, None

    # ---------------------------------------------------------------- endings

    def _finish(self, seq: Candidate, reason: FinishReason) -> None:
        seq.phase = Phase.FINISHED
        seq.finish_reason = reason
        group = seq.group
        pin = group.request.session_id if seq.candidate == 0 else None
        self.slots.release(seq.slot, session=pin)
        group.usage.completion_tokens += len(seq.output)
        self._ended(seq)
        each_step = group.plan is not None and group.plan.select_each_step
        if reason in ("stop", "length") and not each_step:
            self._select_early(group)

    def select_each_step(self, running: Seq[RequestGroup]) -> None:
        """Selection after a step, for the requests whose plan asks for it (voting per
        token); the others cost a flag test."""
        for group in list(running):
            if group.selection_due:
                group.selection_due = False
                try:
                    self._select_early(group)
                except Exception as error:
                    self.fault(group, error)

    def _select_early(self, group: RequestGroup) -> None:
        """Ask candidate selection (``final=False``) whether the unfinished candidates of a
        request may stop now; those it did not choose end as "abandoned"."""
        if group.stop_others or ((group.done or len(group.sequences) < 2) and not group.unstarted):
            return  # stopped already, or nothing left to decide before the final selection
        selection = self.hook.reame_select_candidates(
            request=group.request, candidates=self._views(group), final=False
        )
        if selection is None:
            return
        if selection.stop_others:
            group.stop_others = True
            group.to_start = 0
            for other in group.sequences:
                if not other.finished and other.candidate not in selection.chosen:
                    self._finish(other, "abandoned")
        elif selection.start > 0:  # they start at the next step, when admission allows
            group.to_start += min(selection.start, group.unstarted)

    def _ended(self, seq: Candidate) -> None:
        """Every sequence passes here once, however it ends."""
        self.governor.forget(seq)
        reason = seq.finish_reason or "stop"
        self.hook.reame_generation_finished(seq=seq, finish_reason=reason, text=seq.text.text)

    def settle(self) -> None:
        """Complete the requests whose candidates have all finished."""
        for group in self.scheduler.take_done():
            self.complete(group)

    def cancel(self, group: RequestGroup) -> None:
        """End a running request its caller cancelled."""
        group.to_start = 0
        for seq in group.sequences:
            if not seq.finished:
                self._finish(seq, "cancelled")
        self.scheduler.drop(group)
        self.complete(group)

    def fault(self, group: RequestGroup, error: Exception) -> None:
        """Fail the one request whose handling raised `error` (most likely in a plugin's
        hook, which the message names); the step goes on for the others."""
        culprit = self.plugins.culprit(error) or "the engine"
        log.error(
            "request failed",
            request=group.request.request_id,
            culprit=culprit,
            error=f"{type(error).__name__}: {error}",
            exc_info=error,
        )
        self.fail(group, f"{culprit} raised {type(error).__name__}")

    def fail(self, group: RequestGroup, message: str) -> None:
        """End a running request with an error. The KV of its unfinished sequences is in
        doubt, so dropped; a finished one's slot was released whole, and may be another
        request's by now."""
        if group not in self.scheduler.running:
            return
        group.to_start = 0
        for seq in group.sequences:
            if seq.finished:
                continue
            self.slots.truncate(seq.slot, 0)
            seq.phase = Phase.FINISHED
            seq.finish_reason = "error"
            group.usage.completion_tokens += len(seq.output)
            self.slots.release(seq.slot)
            try:
                self._ended(seq)
            except Exception:  # the request fails already: nothing more to do about it
                log.exception("a plugin failed at the end of a failed request")
        self.scheduler.drop(group)
        self.complete(group, error=message)

    def complete(self, group: RequestGroup, error: str | None = None) -> None:
        """Send a request's `FinishEvent`, with the candidates the selection keeps."""
        now = time.perf_counter()
        if group.prefill_done:
            group.usage.predicted_ms = (now - group.prefill_done) * 1000
        chosen: tuple[int, ...] = tuple(range(min(len(group.sequences), group.request.n)))
        report: Mapping[str, Any] = {}
        if error is None and (len(group.sequences) > 1 or group.plan is not None):
            try:
                selection = self.hook.reame_select_candidates(
                    request=group.request, candidates=self._views(group), final=True
                )
            except Exception as fault:  # the request has left the scheduler: fail it here
                culprit = self.plugins.culprit(fault) or "the engine"
                log.error("request failed", culprit=culprit, exc_info=fault)
                selection, error = None, f"{culprit} raised {type(fault).__name__}"
            if selection is not None:
                chosen = selection.chosen[: group.request.n]
                report = selection.report
        if group.held_back and error is None:
            # Only now do callers hear of the output: the chosen candidates, as choices 0, 1...
            results = tuple(group.sequences[c].result(i) for i, c in enumerate(chosen))
            for choice, candidate in enumerate(chosen):
                if group.sequences[candidate].held:
                    self._emit(group, _joined(group.sequences[candidate].held, choice))
        else:
            results = tuple(group.sequences[c].result() for c in chosen)
        self.stats.requests_finished += 1
        if error is None and self._recall:
            self._remember(group, results)
        self._emit(group, FinishEvent(results, group.usage, error, report))

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


def _joined(events: Seq[TokenEvent], choice: int) -> TokenEvent:
    """A held-back candidate's events as one, numbered `choice`."""
    return TokenEvent(
        choice,
        tuple(token for event in events for token in event.tokens),
        "".join(event.text for event in events),
        tuple(item for event in events for item in event.logprobs),
    )
