"""Prompt lookup: draft by copying what followed the sequence's last few tokens before.

Rewrites, edits, extraction and code changes repeat long stretches of their input. When the
last n tokens of a sequence (prompt + output so far) occurred earlier, the tokens that
followed them then are a good guess for what follows now. Each sequence keeps an index from
n-gram to its latest earlier end, updated as tokens are committed, so a lookup costs a few
dictionary probes whatever the length. Longer n-grams are tried first. A match that runs into
the present (a repetition) continues periodically.

A deterministic source: it proposes no probabilities (q is one-hot).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import (
    DraftProposal,
    DraftRequest,
    ModelInfo,
    SequenceView,
    Vocabulary,
)
from reame_core.per_sequence import PerSequence
from reame_core.settings import Settings

NAME = "prompt_lookup"


class PromptLookupSettings(BaseModel):
    """``[plugins.prompt_lookup]``: the n-gram lengths that may match, and the least text a
    match of only `ngram_min` tokens must span (`match_bytes_min`): two tokens of
    punctuation (`": "` in JSON) recur everywhere and predict little, two long tokens of a
    word or of code much more."""

    model_config = ConfigDict(extra="forbid")

    ngram_min: int = Field(2, ge=1, le=16)
    ngram_max: int = Field(4, ge=1, le=16)
    match_bytes_min: int = Field(8, ge=0, le=256)

    @model_validator(mode="after")
    def _ordered(self) -> PromptLookupSettings:
        if self.ngram_min > self.ngram_max:
            raise ValueError("ngram_min must not exceed ngram_max")
        return self


class NgramIndex:
    """The tokens of one sequence and, for each n-gram, where its latest earlier
    occurrence ended (the continuation starts there)."""

    def __init__(
        self,
        ngram_min: int,
        ngram_max: int,
        match_bytes_min: int = 0,
        width: Callable[[int], int] = lambda token: 1,
    ) -> None:
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self.match_bytes_min = match_bytes_min
        self.width = width  # a token's length in bytes
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], int] = {}

    def extend(self, tokens: Sequence[int]) -> None:
        own = self.tokens
        for token in tokens:
            end = len(own)  # the n-grams ending here now have a continuation: `token`
            for n in range(self.ngram_min, min(self.ngram_max, end) + 1):
                self._ends[tuple(own[end - n : end])] = end
            own.append(token)

    def propose(self, max_tokens: int) -> tuple[int, ...]:
        own = self.tokens
        length = len(own)
        for n in range(min(self.ngram_max, length), self.ngram_min - 1, -1):
            if n == self.ngram_min < self.ngram_max and self._too_narrow(own[length - n :]):
                break
            start = self._ends.get(tuple(own[length - n :]))
            if start is None:
                continue
            period = length - start
            draft: list[int] = []
            for i in range(max_tokens):
                draft.append(own[start + i] if i < period else draft[i - period])
            return tuple(draft)
        return ()

    def _too_narrow(self, tokens: Sequence[int]) -> bool:
        return sum(self.width(token) for token in tokens) < self.match_bytes_min


class PromptLookup:
    def __init__(self) -> None:
        self.settings = PromptLookupSettings.model_validate({})
        self._indexes = PerSequence(self._new_index)
        self._widths: dict[int, int] = {}
        self._vocab: Vocabulary | None = None

    @hookimpl
    def reame_configure(self, settings: Settings, model: ModelInfo) -> None:
        self.settings = settings.plugin_section(NAME, PromptLookupSettings)
        self._vocab = model.vocab
        self._widths.clear()
        self._indexes.clear()

    @hookimpl
    def reame_describe(self) -> str:
        s = self.settings
        return (
            f"drafts by copying earlier text ({s.ngram_min}-{s.ngram_max}-gram matches "
            f"spanning {s.match_bytes_min}+ bytes)"
        )

    @hookimpl
    def reame_propose_drafts(self, requests: Sequence[DraftRequest]) -> list[DraftProposal]:
        proposals = []
        for request in requests:
            index = self._indexes.of(request.seq)
            tokens = index.propose(request.max_tokens)
            if tokens:
                proposals.append(DraftProposal(request.seq, NAME, tokens))
        return proposals

    @hookimpl
    def reame_generation_finished(self, seq: SequenceView, finish_reason: str, text: str) -> None:
        self._indexes.drop(seq)

    def _new_index(self, seq: SequenceView) -> NgramIndex:
        s = self.settings
        index = NgramIndex(s.ngram_min, s.ngram_max, s.match_bytes_min, self._width)
        index.extend(seq.prompt_tokens)
        return index

    def _width(self, token: int) -> int:
        width = self._widths.get(token)
        if width is None:
            width = len(self._vocab.token_bytes(token)) if self._vocab is not None else 1
            self._widths[token] = width
        return width
