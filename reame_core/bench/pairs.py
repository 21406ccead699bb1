"""The draft model a benchmarked model pairs with, or why it has none here.

A model pairs with the draft model its alias card names (same vocabulary); a model given as
a file path is known by its file's name. The draft model must already be on this machine:
`reame bench` measures, it does not download a model the user did not ask for.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from reame_core.models.registry import CARDS, ModelCard


def card_of(name: str, path: Path) -> ModelCard | None:
    """The card of the model called `name`, or of the one whose file `path` is."""
    card = CARDS.get(name)
    if card is not None:
        return card
    return next((c for c in CARDS.values() if c.file == path.name), None)


# The pair named when a model has none: the one the benchmarks measure.
EXAMPLE = "qwen2.5-coder-1.5b"


def draft_for(
    name: str, path: Path, locate: Callable[[str], Path | None]
) -> tuple[str | None, str | None]:
    """(the draft model's file, None), or (None, why there is none): `locate` finds an
    alias's file on this machine without downloading it (None if it is not here)."""
    card = card_of(name, path)
    if card is None or card.draft is None:
        example = f"{EXAMPLE} has one, {CARDS[EXAMPLE].draft}"
        return None, f"{name} has no same-vocabulary draft model ({example})"
    found = locate(card.draft)
    if found is None:
        return (
            None,
            f"its draft model {card.draft} is not on this machine (reame pull {card.draft})",
        )
    return str(found), None
