"""Proves `reame_plan_candidates` with `hold_back`: a request with ``best_of: N`` runs as N
candidates, nothing is streamed before the selection, and what comes back is the one
candidate with the highest cumulative log-probability, as choice 0."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from reame_core.errors import RequestError
from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import CandidatePlan, CandidateView, ModelInfo, Selection
from reame_core.request import GenerationRequest

FIELD = "best_of"


@hookimpl
def reame_request_extensions() -> Mapping[str, str]:
    return {FIELD: "run this many candidates and return the most likely one"}


@hookimpl
def reame_check_request(request: GenerationRequest, model: ModelInfo) -> None:
    best_of = request.extensions.get(FIELD)
    if best_of is not None and (not isinstance(best_of, int) or best_of < request.n):
        raise RequestError(f"'{FIELD}' must be an integer of at least n.", param=FIELD)


@hookimpl
def reame_plan_candidates(request: GenerationRequest, model: ModelInfo) -> CandidatePlan | None:
    best_of = request.extensions.get(FIELD)
    return None if best_of is None else CandidatePlan(best_of, hold_back=True)


@hookimpl(tryfirst=True)
def reame_select_candidates(
    request: GenerationRequest, candidates: Sequence[CandidateView], final: bool
) -> Selection | None:
    if FIELD not in request.extensions or not final:
        return None
    ranked = sorted(candidates, key=lambda c: c.cumulative_logprob, reverse=True)
    return Selection(tuple(c.candidate for c in ranked[: request.n]))
