"""Text on the fake vocabulary (one token per byte) and a sequence as a draft source sees
it: what the draft sources' tests write their cases in."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from reame_core.backend.fake import FakeVocabulary

VOCAB = FakeVocabulary()


def encode(text: str) -> list[int]:
    return VOCAB.tokenize(text, add_special=False, parse_special=False)


def decode(tokens: Sequence[int]) -> str:
    return b"".join(VOCAB.token_bytes(t) for t in tokens).decode()


@dataclass
class View:
    """A sequence as a draft source sees it."""

    prompt_tokens: list[int]
    output_tokens: list[int] = field(default_factory=list)
    key: int = field(default_factory=itertools.count().__next__)
