"""Proves `reame_propose_drafts`: a third-party source's proposals are verified and the right
ones committed. It knows the fake model (its greedy continuation) and spoils every fourth
token, so drafts are partly accepted."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from reame_core.backend.fake import FakeBackend
from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import DraftProposal, DraftRequest

NAME = "oracle_drafts"
_model = FakeBackend()


@hookimpl
def reame_propose_drafts(requests: Sequence[DraftRequest]) -> list[DraftProposal]:
    proposals = []
    for request in requests:
        tokens = [*request.seq.prompt_tokens, *request.seq.output_tokens]
        guess: list[int] = []
        for i in range(request.max_tokens):
            token = int(np.argmax(_model.logits_after([*tokens, *guess])))
            guess.append(0 if (len(tokens) + i) % 4 == 0 else token)
        proposals.append(DraftProposal(request.seq, NAME, tuple(guess)))
    return proposals
