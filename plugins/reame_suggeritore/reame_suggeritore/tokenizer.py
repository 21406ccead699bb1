"""The model's vocabulary as llguidance sees it: an `LLTokenizer` built from `ModelInfo.vocab`.

llguidance needs every token's bytes, which tokens are markup, the end-of-sequence token and
a way to tokenize text. All of it comes from the read-only `Vocabulary` the core hands to
plugins, never from the backend: the plugin holds no llama.cpp pointer. Markup tokens are
marked the way `llguidance.llamacpp.lltokenizer_from_vocab` marks them (control tokens, and
user-defined tokens written as a tag), so a grammar's text never matches a control token
that happens to spell the same characters.

Building the token trie takes a fraction of a second on a 150k vocabulary: done once per
model, in `reame_configure`.
"""

from __future__ import annotations

from collections.abc import Sequence

import llguidance

from reame_core.hooktypes import ModelInfo


class VocabularyTokenizer:
    """The object `llguidance.LLTokenizer` reads a tokenizer from (the shape of
    `llguidance.TokenizerWrapper`): token bytes, markup token ids, EOS/BOS, and a call that
    tokenizes text without special tokens."""

    is_tokenizer_wrapper = True

    def __init__(self, model: ModelInfo) -> None:
        vocab = model.vocab
        self._vocab = vocab
        self.tokens: Sequence[bytes] = vocab.pieces()
        self.special_token_ids: Sequence[int] = sorted(vocab.control_tokens())
        self.eos_token_id = end_of_sequence(model)
        self.bos_token_id = model.bos

    def __call__(self, text: str) -> list[int]:
        return self._vocab.tokenize(text, add_special=False, parse_special=False)


def end_of_sequence(model: ModelInfo) -> int:
    """The token llguidance allows where the grammar may end. The model may end on any of its
    end-of-generation tokens; the constraint lets them all through where this one is."""
    if model.eos is not None:
        return model.eos
    if model.eog:
        return min(model.eog)
    raise ValueError(f"{model.name} has no end-of-generation token: a grammar could not end")


def build_tokenizer(model: ModelInfo) -> llguidance.LLTokenizer:
    return llguidance.LLTokenizer(VocabularyTokenizer(model))  # type: ignore[arg-type]
