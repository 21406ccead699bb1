"""Proves per-step selection (`CandidatePlan.select_each_step`): the plugin is asked after
every step in which candidates committed, before any of them finishes, and ends the race
after `RACE_TOKENS` tokens, keeping the most likely candidate so far."""

from __future__ import annotations

from collections.abc import Sequence

from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import CandidatePlan, CandidateView, ModelInfo, Selection
from reame_core.request import GenerationRequest

RACE_TOKENS = 4
seen: list[tuple[bool, tuple[int, ...]]] = []  # (final, every candidate's token count)
kept: dict[str, int] = {}


@hookimpl
def reame_plan_candidates(request: GenerationRequest, model: ModelInfo) -> CandidatePlan:
    return CandidatePlan(request.n, select_each_step=True)


@hookimpl(tryfirst=True)
def reame_select_candidates(
    request: GenerationRequest, candidates: Sequence[CandidateView], final: bool
) -> Selection | None:
    seen.append((final, tuple(len(c.tokens) for c in candidates)))
    if request.request_id in kept:
        return Selection((kept[request.request_id],))
    if min(len(c.tokens) for c in candidates) < RACE_TOKENS:
        return None
    best = max(candidates, key=lambda c: c.cumulative_logprob)
    kept[request.request_id] = best.candidate
    return Selection((best.candidate,), stop_others=True)
