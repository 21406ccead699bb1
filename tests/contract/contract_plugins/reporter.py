"""Proves the reporting hooks reach their readers: `reame_describe` becomes the plugin's
line in the plugin listing, `reame_collect_stats` counters appear in the metrics (a store's
disk faults as one labelled counter)."""

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
    return {"contract": {"answers": 42}, "disk_faults": {"contract_store": {"torn_page": 3}}}
