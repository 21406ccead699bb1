"""Proves `reame_draft_cost`: a source that says, before its first call, what a call costs is
priced with that from the first step. It says a call takes `SECONDS` and counts its calls;
its drafts are the fake model's greedy continuation, always right."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from reame_core.backend.fake import FakeBackend
from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import DraftCost, DraftProposal, DraftRequest

NAME = "priced_drafts"
SECONDS = 60.0  # a call, as the source says before it is ever called
calls = 0
_model = FakeBackend()


@hookimpl
def reame_draft_cost() -> DraftCost:
    return DraftCost(SECONDS, drafted=4)


@hookimpl
def reame_propose_drafts(requests: Sequence[DraftRequest]) -> list[DraftProposal]:
    global calls
    calls += 1
    proposals = []
    for request in requests:
        tokens = [*request.seq.prompt_tokens, *request.seq.output_tokens]
        guess: list[int] = []
        for _ in range(request.max_tokens):
            guess.append(int(np.argmax(_model.logits_after([*tokens, *guess]))))
        proposals.append(DraftProposal(request.seq, NAME, tuple(guess)))
    return proposals
