"""Proves `reame_tokens_committed` reports exactly the output: what it hears per candidate,
joined, equals the tokens the request returns (plain, speculative and n > 1 alike)."""

from __future__ import annotations

from collections.abc import Sequence

from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import SequenceView

committed: dict[tuple[str, int], list[int]] = {}


@hookimpl
def reame_tokens_committed(seq: SequenceView, tokens: Sequence[int]) -> None:
    committed.setdefault((seq.request_id, seq.candidate), []).extend(tokens)
