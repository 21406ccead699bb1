"""Proves the prefill hooks work as one: `reame_prefix_store_points` asks for a snapshot
halfway through each prompt, `reame_prefix_store` keeps it in memory, and
`reame_prefix_lookup` hands it to another engine, which restores it instead of computing."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import ModelInfo, PrefixHit

stored: dict[tuple[int, ...], bytes] = {}


@hookimpl
def reame_prefix_store_points(tokens: Sequence[int], model: ModelInfo) -> Iterable[int]:
    return [len(tokens) // 2]


@hookimpl
def reame_prefix_store(tokens: Sequence[int], state: bytes, model: ModelInfo) -> None:
    stored[tuple(tokens)] = state


@hookimpl
def reame_prefix_lookup(tokens: Sequence[int], reused: int, model: ModelInfo) -> PrefixHit | None:
    for held, state in stored.items():
        if reused < len(held) <= len(tokens) - 2 and tuple(tokens[: len(held)]) == held:
            return PrefixHit(len(held), state, "prefix_memory")
    return None
