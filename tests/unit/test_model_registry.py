"""The alias registry: every card is usable as it stands."""

from __future__ import annotations

import pytest

from reame_core.models.names import is_split_part, quant_of
from reame_core.models.registry import CARDS, ModelCard, card_for_file

ISSUE_ALIASES = {
    "qwen2.5-0.5b",
    "qwen2.5-1.5b",
    "qwen2.5-3b",
    "qwen2.5-7b",
    "qwen2.5-coder-0.5b",
    "qwen2.5-coder-1.5b",
    "qwen2.5-coder-7b",
    "tinyllama-1.1b",
    "smollm2-135m",
}


def test_the_registry_has_the_models_reame_is_for() -> None:
    assert set(CARDS) == ISSUE_ALIASES


@pytest.mark.parametrize("card", CARDS.values(), ids=lambda card: card.alias)
def test_each_card_names_one_single_file_gguf_of_its_quantization(card: ModelCard) -> None:
    assert card.file.endswith(".gguf")
    assert not is_split_part(card.file)
    assert quant_of(card.file) == card.quant
    assert card.license and card.template and card.use


@pytest.mark.parametrize(
    "card", [c for c in CARDS.values() if c.draft], ids=lambda card: card.alias
)
def test_a_draft_model_is_a_smaller_alias_with_the_same_vocabulary(card: ModelCard) -> None:
    assert card.draft is not None
    draft = CARDS[card.draft]
    assert draft.shape.n_vocab == card.shape.n_vocab
    assert draft.size_bytes < card.size_bytes


def test_the_coder_models_carry_fill_in_the_middle() -> None:
    assert all(card.fim for alias, card in CARDS.items() if "coder" in alias)
    assert not CARDS["qwen2.5-1.5b"].fim


def test_a_hub_file_is_shown_under_its_alias() -> None:
    card = CARDS["qwen2.5-7b"]

    assert card_for_file(card.repo, card.file) is card
    assert card_for_file(card.repo, "Qwen2.5-7B-Instruct-Q8_0.gguf") is None
