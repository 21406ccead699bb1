"""The draft-model source's checks that need no model: which draft to load, and refusing a
draft whose vocabulary differs (the real-model behaviour is in tests/integration)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from reame_core.backend.fake import FakeBackend
from reame_core.builtins.draft_model import check_same_vocabulary, draft_model_name
from reame_core.errors import ModelLoadError
from reame_core.settings import Settings


def pieces_of(backend: FakeBackend) -> list[bytes]:
    return [backend.token_bytes(t, special=True) for t in range(backend.info.n_vocab)]


def test_auto_takes_the_partner_named_by_the_model_card() -> None:
    assert draft_model_name(Settings(model="qwen2.5-1.5b", draft_model="auto")) == "qwen2.5-0.5b"


def test_auto_loads_nothing_for_a_model_without_a_partner() -> None:
    assert draft_model_name(Settings(model="smollm2-135m", draft_model="auto")) is None


def test_an_explicit_draft_model_is_taken_as_given() -> None:
    assert draft_model_name(Settings(draft_model="/models/small.gguf")) == "/models/small.gguf"
    assert draft_model_name(Settings()) is None


class LookedUp(FakeBackend):
    """A fake draft model that records which tokens' text was read."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens: list[int] = []

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        self.tokens.append(token)
        return super().token_bytes(token, special=special)


def test_a_draft_with_the_same_vocabulary_is_accepted_after_every_token_is_compared() -> None:
    draft = LookedUp()

    check_same_vocabulary(pieces_of(FakeBackend()), cast(Any, draft), "target")  # no error

    assert sorted(draft.tokens) == list(range(draft.info.n_vocab))


def test_a_draft_differing_in_its_last_token_is_refused() -> None:
    target = pieces_of(FakeBackend())
    last = len(target) - 1
    target[last] = b"\xff\xfe"

    with pytest.raises(ModelLoadError, match=f"token {last}"):
        check_same_vocabulary(target, cast(Any, FakeBackend()), "target")


def test_a_draft_whose_token_means_other_text_is_refused_naming_the_token() -> None:
    target = pieces_of(FakeBackend())
    target[97] = b"x"

    with pytest.raises(ModelLoadError, match="token 97"):
        check_same_vocabulary(target, cast(Any, FakeBackend()), "target")


def test_a_draft_with_another_vocabulary_size_is_refused() -> None:
    with pytest.raises(ModelLoadError, match="share the target's vocabulary"):
        check_same_vocabulary(pieces_of(FakeBackend())[:-1], cast(Any, FakeBackend()), "target")
