"""How deeply a JSON value nests, for the limits on schemas that requests carry."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def exceeds_depth(value: Any, limit: int) -> bool:
    """Whether objects and arrays nest more than `limit` levels deep in `value`.

    Counted without recursion, and given up as soon as the limit is passed: a schema deeper
    than Python's stack must be refused, not crash the check."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False
