"""The `conclave` plugin's hook implementations: best-of-N by vote.

A request with ``best_of: N`` runs as N candidates of one prompt, computed once and
cloned (`CandidatePlan`), sampled with seeds seed, seed+1, ... at the plan's temperature
when the request sets none, decoded together in the engine's batch. Each time one
finishes, its answer is read (`answers`) and the vote (`voting`) is asked whether it is
settled; once it is, the candidates still running are stopped ("abandoned") and their
slots freed. With waves, candidates beyond the first wave start only while the vote is
open. The winner is returned as the request's choice, with the tally in the response's
``conclave`` field; nothing streams before the vote is settled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import structlog

from reame_conclave import answers, cli
from reame_conclave.request_vote import ConclaveSettings, Vote, read_vote
from reame_conclave.voting import Tally, ballot
from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import AnswerExtractor, CandidatePlan, CandidateView, ModelInfo, Selection
from reame_core.request import GenerationRequest
from reame_core.settings import Settings

log = structlog.get_logger(__name__)

NAME = "conclave"
REQUEST_FIELDS = {
    "best_of": "generate this many candidates and return the one whose answer most of them give",
    "vote": "how best-of-N voting reads answers and when it stops (answer, rule, wave, ...)",
}


class Conclave:
    """The plugin's settings, the answer extractors every plugin offers, and counters.
    Per-request state lives in the request (its fields) and the engine (its candidates)."""

    def __init__(self) -> None:
        self.settings = ConclaveSettings()
        self.slots = 1  # the server's sequence slots: the widest a wave may be
        self.extractors: dict[str, AnswerExtractor] = dict(answers.BUILTIN)
        self.counters = {
            "requests": 0,
            "stopped_early": 0,
            "candidates_finished": 0,
            "candidates_stopped": 0,
            "candidates_not_started": 0,
            "tokens_generated": 0,
            "tokens_saved": 0,
        }

    # ------------------------------------------------------------ lifecycle

    @hookimpl
    def reame_configure(self, settings: Settings, model: ModelInfo, hook: Any) -> None:
        self.settings = settings.plugin_section(NAME, ConclaveSettings)
        self.slots = model.n_seq_max
        self.extractors = {}
        for offered in hook.reame_answer_extractors():
            self.extractors.update(offered or {})

    @hookimpl
    def reame_answer_extractors(self) -> Mapping[str, AnswerExtractor]:
        return answers.BUILTIN

    @hookimpl
    def reame_request_extensions(self) -> Mapping[str, str]:
        return REQUEST_FIELDS

    @hookimpl
    def reame_check_request(self, request: GenerationRequest, model: ModelInfo) -> None:
        self._vote(request)

    @hookimpl
    def reame_add_request_options(self, parser: Any) -> None:
        cli.add_request_options(parser)

    # ------------------------------------------------------------ selection

    @hookimpl
    def reame_plan_candidates(
        self, request: GenerationRequest, model: ModelInfo
    ) -> CandidatePlan | None:
        vote = self._vote(request)
        if vote is None:
            return None
        return CandidatePlan(
            candidates=vote.best_of,
            hold_back=True,
            at_once=self._wave(vote),
            temperature=self.settings.temperature,
        )

    @hookimpl(tryfirst=True)
    def reame_select_candidates(
        self, request: GenerationRequest, candidates: Sequence[CandidateView], final: bool
    ) -> Selection | None:
        vote = self._vote(request)
        if vote is None:
            return None
        tally = self._tally(vote, candidates)
        voted = len(tally.ballots)
        remaining = vote.best_of - voted
        if final:
            return self._result(request, vote, tally, candidates)
        if vote.rule.settled(tally, remaining):
            return Selection(tuple(tally.winners()[: request.n]), stop_others=True)
        running = sum(c.finish_reason is None for c in candidates)
        unstarted = vote.best_of - len(candidates)
        if not running and unstarted:  # a wave ended undecided: the next one
            return Selection(start=min(self._wave(vote), unstarted))
        return None

    # -------------------------------------------------------------- reports

    @hookimpl
    def reame_describe(self) -> str:
        s = self.settings
        rule = s.rule + (f" at {s.confidence}" if s.rule == "adaptive" else "")
        return f"best-of-N voting: stops by the {rule} rule; temperature {s.temperature}"

    @hookimpl
    def reame_collect_stats(self) -> Mapping[str, Mapping[str, Any]]:
        return {NAME: dict(self.counters)}

    # -------------------------------------------------------------- helpers

    def _vote(self, request: GenerationRequest) -> Vote | None:
        return read_vote(request.extensions, request.n, self.settings, self.extractors)

    def _wave(self, vote: Vote) -> int:
        """Candidates that run at once: the request's wave, else as many as the slots."""
        return min(vote.wave or self.slots, self.slots, vote.best_of)

    def _tally(self, vote: Vote, candidates: Sequence[CandidateView]) -> Tally:
        """The ballots of the candidates that ran to their end. One cut off by max_tokens
        votes only with what it had said was its answer ("Answer: 12") before going on;
        otherwise its last words are no answer."""
        extract = self.extractors[vote.answer]

        def answer(c: CandidateView) -> str | None:
            text = c.text if c.finish_reason == "stop" else answers.through_marked_answer(c.text)
            if text is None:
                return None
            try:
                return extract(text, vote.argument)
            except Exception as error:  # another plugin's extractor must not stop the engine
                log.warning("answer extractor failed", extractor=vote.answer, error=repr(error))
                return None

        return Tally(
            tuple(ballot(c, answer(c)) for c in candidates if c.finish_reason in ("stop", "length"))
        )

    def _result(
        self,
        request: GenerationRequest,
        vote: Vote,
        tally: Tally,
        candidates: Sequence[CandidateView],
    ) -> Selection:
        winners = tally.winners() or [c.candidate for c in candidates]
        ranking = tally.ranking()
        counts = tally.counts()
        stopped = [c for c in candidates if c.finish_reason == "abandoned"]
        not_started = vote.best_of - len(candidates)
        generated = sum(len(c.tokens) for c in candidates)
        lengths = [len(candidates[b.candidate].tokens) for b in tally.ballots]
        typical = sum(lengths) / len(lengths) if lengths else 0.0
        saved = round(
            sum(max(0.0, typical - len(c.tokens)) for c in stopped) + not_started * typical
        )
        report = {
            "answer": ranking[0] if ranking else None,
            "tally": {answer: counts[answer] for answer in ranking},
            "rule": vote.rule.name,
            "candidates": vote.best_of,
            "finished": len(tally.ballots),
            "stopped": len(stopped),
            "not_started": not_started,
            "tokens": generated,
            "tokens_saved": saved,
        }
        c = self.counters
        c["requests"] += 1
        c["stopped_early"] += bool(stopped or not_started)
        c["candidates_finished"] += len(tally.ballots)
        c["candidates_stopped"] += len(stopped)
        c["candidates_not_started"] += not_started
        c["tokens_generated"] += generated
        c["tokens_saved"] += saved
        return Selection(tuple(winners[: request.n]), report={NAME: report})


plugin = Conclave()
