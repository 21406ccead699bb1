"""Proves `reame_drafts_verified` tells the truth: the drafts it hears of, per source, add
up to what the request's usage counts as proposed and accepted."""

from __future__ import annotations

from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import DraftProposal, SequenceView

proposed_tokens: dict[str, int] = {}
accepted_tokens: dict[str, int] = {}


@hookimpl
def reame_drafts_verified(
    seq: SequenceView, draft: DraftProposal, accepted: int, step_seconds: float
) -> None:
    assert 0 <= accepted <= len(draft.tokens) and step_seconds >= 0.0
    proposed_tokens[draft.source] = proposed_tokens.get(draft.source, 0) + len(draft.tokens)
    accepted_tokens[draft.source] = accepted_tokens.get(draft.source, 0) + accepted
