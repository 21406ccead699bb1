"""Which sequences may draft this step, how many tokens, and which proposal to verify.

This is the seam the speculation governor fills: the engine asks `DraftPolicy` for draft
requests, calls the draft sources through ``reame_propose_drafts``, lets the policy pick
one proposal per sequence, and reports each verified draft back to it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from collections.abc import Sequence as Seq

from reame_core.engine.sequence import Sequence
from reame_core.hooktypes import DraftProposal, DraftRequest


class DraftPolicy:
    """Let every decoding sequence draft up to `max_tokens`; verify the longest proposal."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.proposed: Counter[str] = Counter()
        self.accepted: Counter[str] = Counter()

    def requests(self, decoding: Seq[Sequence], n_ctx_seq: int, room: int) -> list[DraftRequest]:
        """Draft requests that keep the whole step within `room` batch tokens."""
        if not decoding or self.max_tokens <= 0:
            return []
        per_sequence = min(self.max_tokens, room // len(decoding) - 1)
        requests = []
        for seq in decoding:
            context_left = n_ctx_seq - seq.n_kv - 2
            output_left = seq.params.max_tokens - len(seq.output) - 1
            limit = min(per_sequence, context_left, output_left)
            if limit > 0:
                requests.append(DraftRequest(seq, limit))
        return requests

    def choose(
        self, requests: Seq[DraftRequest], proposals: Iterable[DraftProposal]
    ) -> dict[int, DraftProposal]:
        """One proposal per sequence (by seq_id), cut to what was asked for."""
        limits = {id(request.seq): request.max_tokens for request in requests}
        chosen: dict[int, DraftProposal] = {}
        for proposal in proposals:
            limit = limits.get(id(proposal.seq), 0)
            if not proposal.tokens or limit <= 0:
                continue
            if len(proposal.tokens) > limit:
                proposal = DraftProposal(
                    proposal.seq,
                    proposal.source,
                    proposal.tokens[:limit],
                    None if proposal.probs is None else proposal.probs[:limit],
                )
            key = id(proposal.seq)
            if key not in chosen or len(proposal.tokens) > len(chosen[key].tokens):
                chosen[key] = proposal
        return chosen

    def record(self, draft: DraftProposal, accepted: int) -> None:
        self.proposed[draft.source] += len(draft.tokens)
        self.accepted[draft.source] += accepted
