"""Default candidate selection: a request with n candidates gets all n back, in order.

A plugin that chooses among the candidates (best-of-N voting) overrides this with
``tryfirst``; a request it planned more candidates for than n (`reame_plan_candidates`)
gets its first n when left to this default.
"""

from __future__ import annotations

from collections.abc import Sequence

from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import CandidateView, Selection
from reame_core.request import GenerationRequest


@hookimpl(trylast=True)
def reame_select_candidates(
    request: GenerationRequest, candidates: Sequence[CandidateView], final: bool
) -> Selection | None:
    if not final:
        return None
    return Selection(tuple(candidate.candidate for candidate in candidates[: request.n]))


@hookimpl
def reame_describe() -> str:
    return "returns every candidate of a request with n > 1"
