"""The cache from the shell: the `--kv-cache-*` flags and `reame cache stats|clear`.

The commands read the same settings as the server (flags, ``REAME_PLUGINS__DISKKV__*``,
the ``[plugins.diskkv]`` table), so they look at the directory the server uses. They
never load a model.
"""

from __future__ import annotations

import argparse
import datetime
import sqlite3
from typing import Any

from rich.console import Console
from rich.table import Table

from reame_core.settings import Settings
from reame_diskkv.settings import NAME, DiskKVSettings
from reame_diskkv.store import LAYOUT, DiskStore


def add_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("disk prefix cache (plugin diskkv)")
    group.add_argument(
        "--kv-cache-dir",
        dest=f"plugins.{NAME}.dir",
        metavar="DIR",
        help="where prefix snapshots are kept (default ~/.cache/reame/kv)",
    )
    group.add_argument(
        "--kv-cache-budget",
        dest=f"plugins.{NAME}.budget",
        metavar="BYTES",
        help="most disk the snapshots may take, e.g. 20GB or 512MiB (default: a quarter "
        "of the free disk, at most 10 GiB)",
    )


def add_cache_command(commands: argparse._SubParsersAction[Any]) -> None:
    cache = commands.add_parser(
        "cache",
        help="the disk prefix cache: stats, or clear it",
        description="Show what the disk prefix cache holds (stats), or delete it all (clear).",
    )
    cache.add_argument("action", choices=("stats", "clear"))
    cache.set_defaults(handler=cache_command)


def cache_command(
    settings: Settings, args: argparse.Namespace, console: Console | None = None
) -> int:
    console = console or Console()
    section = settings.plugin_section(NAME, DiskKVSettings)
    directory = section.directory()
    if not (directory / LAYOUT).is_dir():
        console.print(f"No disk prefix cache at {directory}.")
        return 0
    try:
        store = DiskStore(directory)
    except (OSError, sqlite3.Error) as error:
        console.print(f"Cannot open the disk prefix cache at {directory}: {error}")
        return 1
    try:
        if args.action == "clear":
            entries, size = store.clear()
            console.print(f"Deleted {entries} entries ({_size(size)}) from {directory}.")
            return 0
        _print_stats(console, store, section)
        return 0
    finally:
        store.close()


def _print_stats(console: Console, store: DiskStore, section: DiskKVSettings) -> None:
    held = store.total_size()
    origin = "default" if section.budget is None else "set"
    console.print(f"directory  {store.directory}")
    console.print(f"holds      {store.count()} entries, {_size(held)}")
    console.print(f"budget     {_size(section.budget_bytes(held))} ({origin})")
    console.print(f"free disk  {_size(store.free_bytes())}")
    table = Table(title="by model")
    for column in ("model", "fingerprint", "entries", "size", "tokens", "last used"):
        table.add_column(column)
    for usage in store.usage():
        used = datetime.datetime.fromtimestamp(usage.last_used).strftime("%Y-%m-%d %H:%M")
        table.add_row(
            usage.model,
            usage.fingerprint[:12],
            str(usage.entries),
            _size(usage.bytes),
            str(usage.tokens),
            used,
        )
    console.print(table)


def _size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
