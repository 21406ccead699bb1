"""Proves the reporting hooks reach their readers: `reame_describe` becomes the plugin's
line in the plugin listing, `reame_collect_stats` counters appear in the metrics."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reame_core.hookspecs import hookimpl

DESCRIPTION = "reports one counter for the contract tests"


@hookimpl
def reame_describe() -> str:
    return DESCRIPTION


@hookimpl
def reame_collect_stats() -> Mapping[str, Mapping[str, Any]]:
    return {"contract": {"answers": 42}}
