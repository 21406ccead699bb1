"""The archive from the shell: the `--palimpsest-*` flags and `reame palimpsest stats|purge`.

The commands read the same settings as the server (flags, ``REAME_PLUGINS__PALIMPSEST__*``,
the ``[plugins.palimpsest]`` table), so they look at the directory the server uses. They
never load a model. `purge` deletes every record of every tokenizer and every remembered
answer; a running server forgets the purged records at its next poll of the directory.
"""

from __future__ import annotations

import argparse
import datetime
from typing import Any

from rich.console import Console
from rich.table import Table

from reame_core.settings import Settings
from reame_palimpsest import answers, record_format, segments
from reame_palimpsest.settings import NAME, PalimpsestSettings


def add_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("generation archive (plugin palimpsest)")
    group.add_argument(
        "--palimpsest-dir",
        dest=f"plugins.{NAME}.dir",
        metavar="DIR",
        help="where finished generations are archived (default <cache dir>/palimpsest)",
    )
    group.add_argument(
        "--palimpsest-budget",
        dest=f"plugins.{NAME}.budget",
        metavar="BYTES",
        help="most disk the archive may take, e.g. 1GiB or 100MB; the oldest records go "
        "first (default: a twentieth of the free disk, at most 1 GiB)",
    )
    group.add_argument(
        "--palimpsest-no-recall",
        dest=f"plugins.{NAME}.recall",
        action="store_const",
        const=False,
        help="compute every request, even one answered before (by default a greedy or seeded "
        "request the server answered before is answered from the answer it kept)",
    )
    group.add_argument(
        "--palimpsest-no-record",
        dest=f"plugins.{NAME}.record",
        action="store_const",
        const=False,
        help="add nothing to the archive (drafts still come from what it holds)",
    )


def add_command(commands: argparse._SubParsersAction[Any]) -> None:
    command = commands.add_parser(
        "palimpsest",
        help="the archive of finished generations: stats, or purge it",
        description="Show what the generation archive holds (stats), or delete it all (purge).",
    )
    command.add_argument("action", choices=("stats", "purge"))
    command.set_defaults(handler=palimpsest_command)


def palimpsest_command(
    settings: Settings, args: argparse.Namespace, console: Console | None = None
) -> int:
    console = console or Console()
    section = settings.plugin_section(NAME, PalimpsestSettings)
    root = section.directory(settings.cache_path)
    if not (root / segments.LAYOUT).is_dir():
        console.print(f"No generation archive at {root}.")
        return 0
    if args.action == "purge":
        deleted, size = segments.purge(root)
        files, answered = answers.purge(root)
        console.print(
            f"Deleted {deleted} segments ({_size(size)}) and {files} remembered answers "
            f"({_size(answered)}) from {root}."
        )
        return 0
    _print_stats(console, root, section)
    return 0


def _print_stats(console: Console, root: Any, section: PalimpsestSettings) -> None:
    usages = segments.usage(root)
    held = sum(u.bytes for u in usages)
    origin = "default" if section.budget is None else "set"
    console.print(f"directory  {root}")
    console.print(f"holds      {sum(u.segments for u in usages)} segments, {_size(held)}")
    console.print(f"budget     {_size(section.budget_bytes())} ({origin})")
    console.print(f"recording  {'on' if section.record else 'off'}")
    files, size = answers.usage(root)
    recall = "on" if section.recall else "off"
    console.print(
        f"answers    {files} kept, {_size(size)} of {_size(int(section.recall_budget))} "
        f"(recall {recall})"
    )
    table = Table(title="by tokenizer")
    for column in ("tokenizer", "segments", "size", "records", "tokens", "damaged", "newest"):
        table.add_column(column)
    for usage in usages:
        records = tokens = damaged = 0
        for path in sorted((root / segments.LAYOUT / usage.fingerprint).glob("*.seg")):
            try:
                scan = record_format.scan(path.read_bytes(), final=True)
            except FileNotFoundError:
                continue
            records += len(scan.records)
            tokens += sum(len(r.tokens) for r in scan.records)
            damaged += scan.damaged
        newest = datetime.datetime.fromtimestamp(usage.newest).strftime("%Y-%m-%d %H:%M")
        table.add_row(
            usage.fingerprint,
            str(usage.segments),
            _size(usage.bytes),
            str(records),
            str(tokens),
            str(damaged),
            newest,
        )
    console.print(table)


def _size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
