"""Proves `reame_verify_drafts` can be replaced by a plugin (``tryfirst``): this verifier
accepts no draft and commits the target's own next token, so speculation keeps working
and the output is exactly the plain one, with nothing accepted."""

from __future__ import annotations

import numpy as np

from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import DraftProposal, SequenceView, TargetSampler, Verification

verified: list[int] = []


@hookimpl(tryfirst=True)
def reame_verify_drafts(
    seq: SequenceView, draft: DraftProposal, logits: np.ndarray, sampler: TargetSampler
) -> Verification:
    verified.append(len(draft.tokens))
    return Verification(0, (sampler.sample(logits[0]),))
