"""Proves `reame_select_candidates` with ``final=False``: as soon as one candidate finishes,
the plugin keeps it and stops the others (``stop_others``), which end at once, unfinished."""

from __future__ import annotations

from collections.abc import Sequence

from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import CandidateView, Selection
from reame_core.request import GenerationRequest

calls: list[bool] = []


@hookimpl(tryfirst=True)
def reame_select_candidates(
    request: GenerationRequest, candidates: Sequence[CandidateView], final: bool
) -> Selection | None:
    calls.append(final)
    done = [c.candidate for c in candidates if c.finish_reason in ("stop", "length")]
    return Selection(tuple(done[:1]), stop_others=not final)
