"""Proves the promise hooks work as one: a store shared by several engines, as a disk
cache is by several processes. `reame_prefix_computing` records which prefixes an engine
is computing for storage, `reame_prefix_pending` tells another engine behind the same
prefix, and `reame_prefix_store`, storing one, ends its promise."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import ModelInfo, PrefixHit

stored: dict[tuple[int, ...], bytes] = {}
promised: set[tuple[int, ...]] = set()
computing: list[tuple[int, ...]] = []  # the points of each `reame_prefix_computing` call


@hookimpl
def reame_prefix_store_points(tokens: Sequence[int], model: ModelInfo) -> Iterable[int]:
    return [len(tokens) // 2]


@hookimpl
def reame_prefix_computing(tokens: Sequence[int], points: Sequence[int], model: ModelInfo) -> None:
    computing.append(tuple(points))
    prompt = tuple(tokens)
    for prefix in [p for p in promised if prompt[: len(p)] == p]:
        promised.discard(prefix)
    promised.update(prompt[:point] for point in points)


@hookimpl
def reame_prefix_pending(tokens: Sequence[int], have: int, model: ModelInfo) -> int | None:
    prompt = tuple(tokens)
    lengths = [
        len(p) for p in promised if have < len(p) <= len(prompt) - 2 and prompt[: len(p)] == p
    ]
    return max(lengths, default=None)


@hookimpl
def reame_prefix_store(tokens: Sequence[int], state: bytes, model: ModelInfo) -> None:
    stored[tuple(tokens)] = state
    promised.discard(tuple(tokens))


@hookimpl
def reame_prefix_lookup(tokens: Sequence[int], reused: int, model: ModelInfo) -> PrefixHit | None:
    for held, state in stored.items():
        if reused < len(held) <= len(tokens) - 2 and tuple(tokens[: len(held)]) == held:
            return PrefixHit(len(held), state, "prefix_promises")
    return None
