"""`reame pull`, `reame ls`, `reame rm`: the models on this machine."""

from __future__ import annotations

import time
from typing import TextIO

from rich.console import Console
from rich.table import Table

from reame_core.autoconfig.plan import size
from reame_core.models import ModelStore, parse_model_name
from reame_core.settings import Settings


def pull_command(settings: Settings, name: str, out: TextIO) -> int:
    store = ModelStore.in_cache_dir(settings.cache_path)
    result = store.pull(parse_model_name(name))
    out.write(f"{result.name}: {result.note}, {size(result.size)} at {result.path}\n")
    return 0


def ls_command(settings: Settings, console: Console, *, include_available: bool) -> int:
    store = ModelStore.in_cache_dir(settings.cache_path)
    table = Table(title="Models" if include_available else "Models on this machine")
    for column in ("name", "quant", "size", "path", "last used"):
        table.add_column(column, overflow="fold")
    for entry in store.entries(include_available=include_available):
        shown_size = size(entry.size) if entry.path else f"~{size(entry.size)}"
        path = str(entry.path) if entry.path else "not downloaded"
        table.add_row(entry.name, entry.quant, shown_size, path, _when(entry.last_used))
    console.print(table)
    if not include_available:
        console.print("`reame ls --all` also lists the models Reame knows by name.")
    return 0


def rm_command(settings: Settings, name: str, out: TextIO) -> int:
    store = ModelStore.in_cache_dir(settings.cache_path)
    ref = parse_model_name(name)
    freed = store.remove(ref)
    out.write(f"Removed {ref.name} ({size(freed)} freed).\n")
    return 0


def _when(timestamp: float | None) -> str:
    if timestamp is None:
        return "never"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp))
