"""Proves `CandidatePlan.at_once` with `Selection.start` and `Selection.report`: a request
with ``waves: [N, K]`` runs N candidates K at a time, each wave started by the selection
once the previous one has finished, and the final selection reports how many ran."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import CandidatePlan, CandidateView, ModelInfo, Selection
from reame_core.request import GenerationRequest

FIELD = "waves"
views: list[CandidateView] = []  # the candidates the final selection saw


@hookimpl
def reame_request_extensions() -> Mapping[str, str]:
    return {FIELD: "[N, K]: run N candidates, K at a time"}


@hookimpl
def reame_plan_candidates(request: GenerationRequest, model: ModelInfo) -> CandidatePlan | None:
    if FIELD not in request.extensions:
        return None
    total, at_once = request.extensions[FIELD]
    return CandidatePlan(total, hold_back=True, at_once=at_once)


@hookimpl(tryfirst=True)
def reame_select_candidates(
    request: GenerationRequest, candidates: Sequence[CandidateView], final: bool
) -> Selection | None:
    if FIELD not in request.extensions:
        return None
    total, at_once = request.extensions[FIELD]
    if final:
        views[:] = candidates
        report = {"waves": {"ran": len(candidates)}}
        return Selection((candidates[-1].candidate,), report=report)
    if all(c.finish_reason is not None for c in candidates):
        return Selection(start=min(at_once, total - len(candidates)))
    return None
