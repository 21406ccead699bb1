"""The draft-model source's checks that need no model: which draft to load, and refusing a
draft whose vocabulary differs (the real-model behaviour is in tests/integration)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from reame_core.backend.fake import FakeBackend, FakeVocabulary
from reame_core.builtins.draft_model import check_same_vocabulary, draft_model_name
from reame_core.errors import ModelLoadError
from reame_core.settings import Settings


class EditedVocabulary(FakeVocabulary):
    """The fake vocabulary with some token pieces replaced."""

    def __init__(self, pieces: Sequence[bytes]) -> None:
        self._edited = list(pieces)

    def pieces(self) -> Sequence[bytes]:
        return self._edited


def model_with(pieces: Sequence[bytes]) -> FakeBackend:
    return FakeBackend(vocab=EditedVocabulary(pieces))


def test_auto_takes_the_partner_named_by_the_model_card() -> None:
    assert draft_model_name(Settings(model="qwen2.5-1.5b", draft_model="auto")) == "qwen2.5-0.5b"


def test_auto_loads_nothing_for_a_model_without_a_partner() -> None:
    assert draft_model_name(Settings(model="smollm2-135m", draft_model="auto")) is None


def test_an_explicit_draft_model_is_taken_as_given() -> None:
    assert draft_model_name(Settings(draft_model="/models/small.gguf")) == "/models/small.gguf"
    assert draft_model_name(Settings()) is None


def test_a_draft_with_the_same_vocabulary_is_accepted() -> None:
    check_same_vocabulary(FakeBackend().info, FakeBackend(name="draft").info)


def test_a_draft_whose_token_means_other_text_is_refused_naming_the_token() -> None:
    pieces = list(FakeVocabulary().pieces())
    pieces[97] = b"x"

    with pytest.raises(ModelLoadError, match="token 97"):
        check_same_vocabulary(model_with(pieces).info, FakeBackend(name="draft").info)


def test_a_draft_with_another_vocabulary_size_is_refused() -> None:
    with pytest.raises(ModelLoadError, match="share the target's vocabulary"):
        target = model_with(FakeVocabulary().pieces()[:-1])
        check_same_vocabulary(target.info, FakeBackend(name="draft").info)


def test_a_draft_differing_only_in_its_last_token_is_refused() -> None:
    """Every token is compared, not a sample of them."""
    pieces = list(FakeVocabulary().pieces())
    last = len(pieces) - 1
    pieces[last] = b"\xff\xfe"

    with pytest.raises(ModelLoadError, match=f"token {last}"):
        check_same_vocabulary(model_with(pieces).info, FakeBackend(name="draft").info)
