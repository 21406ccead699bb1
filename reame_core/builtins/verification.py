"""Verifying drafts against the target model, so speculation never changes the output.

Greedy requests keep the longest draft prefix that equals the target's argmax. Sampled
requests use speculative rejection sampling: draft token x is kept with probability
min(1, p(x) / q(x)); on rejection the token is drawn from the residual max(0, p - q),
renormalized. Deterministic sources have q one-hot, so x is kept with probability p(x).
Either way the tokens follow the target's own distribution exactly.
"""

from __future__ import annotations

import numpy as np

from reame_core.engine.sampler import TokenSampler
from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import DraftProposal, SequenceView, Verification


@hookimpl
def reame_describe() -> str:
    return "verifies drafts from every source: greedy argmax match, speculative sampling"


@hookimpl
def reame_verify_drafts(
    seq: SequenceView, draft: DraftProposal, logits: np.ndarray, sampler: TokenSampler
) -> Verification:
    accepted: list[int] = []
    greedy = sampler.params.greedy
    for i, token in enumerate(draft.tokens):
        adjusted = sampler.adjust(logits[i], accepted)
        if greedy:
            target = int(np.argmax(adjusted))
            if target != token:
                return Verification(len(accepted), (*accepted, target))
        else:
            p = sampler.probabilities(adjusted)
            q = draft.probs[i] if draft.probs is not None else None
            q_token = 1.0 if q is None else float(q[token])
            if q_token <= 0.0 or sampler.rng.random() * q_token >= p[token]:
                residual = p.copy()
                if q is None:
                    residual[token] = 0.0
                else:
                    residual = np.maximum(residual - q, 0.0)
                if residual.sum() <= 0.0:
                    residual = p
                return Verification(len(accepted), (*accepted, sampler.draw(residual)))
        accepted.append(token)
    bonus = sampler.sample(logits[len(draft.tokens)], accepted)
    return Verification(len(accepted), (*accepted, bonus))
