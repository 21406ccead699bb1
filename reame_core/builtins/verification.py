"""Verifying drafts against the target model, so speculation never changes the output.

Deterministic sources (prompt lookup, grammar, archive, a greedy draft model: no `probs`)
are checked by sampling the target's own token at each draft position, exactly as plain
decoding would (same adjustments, same random stream, one draw per committed token), and
keeping the draft while they agree. Greedy requests keep the longest prefix equal to the
argmax; sampled requests accept draft x with probability p(x), the one-hot case of
speculative sampling, and a seeded request gives the same tokens with or without drafts.
Drafts that come with their distribution q (a sampling draft model) go through speculative
rejection sampling: x is kept with probability min(1, p(x) / q(x)), otherwise a token is
drawn from the residual max(0, p - q), renormalized. Either way the tokens follow the
target's distribution exactly.
"""

from __future__ import annotations

import numpy as np

from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import DraftProposal, SequenceView, TargetSampler, Verification


@hookimpl
def reame_describe() -> str:
    return "verifies drafts from every source: greedy argmax match, speculative sampling"


@hookimpl
def reame_verify_drafts(
    seq: SequenceView, draft: DraftProposal, logits: np.ndarray, sampler: TargetSampler
) -> Verification:
    accepted: list[int] = []
    if draft.probs is None or sampler.greedy:
        for i, token in enumerate(draft.tokens):
            target = sampler.sample(logits[i], accepted)
            if target != token:
                return Verification(len(accepted), (*accepted, target))
            accepted.append(token)
    else:
        for i, token in enumerate(draft.tokens):
            p = sampler.distribution(logits[i], accepted)
            q = draft.probs[i]
            if q[token] <= 0.0 or sampler.uniform() * q[token] >= p[token]:
                residual = np.maximum(p - q, 0.0)
                if residual.sum() <= 0.0:
                    residual = p
                return Verification(len(accepted), (*accepted, sampler.draw(residual)))
            accepted.append(token)
    bonus = sampler.sample(logits[len(draft.tokens)], accepted)
    return Verification(len(accepted), (*accepted, bonus))
