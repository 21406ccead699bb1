"""`reame plugins`: what is installed, enabled, and which hooks each implements."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from reame_core.plugins import PluginHost
from reame_core.settings import Settings


def plugins_command(settings: Settings, console: Console | None = None) -> int:
    host = PluginHost(settings.disable_plugins)
    table = Table(title="Reame plugins")
    for column in ("name", "distribution", "version", "state", "hooks", "does"):
        table.add_column(column, overflow="fold")
    for record in host.records():
        state = "enabled" if record.enabled else ("error" if record.error else "disabled")
        hooks = ", ".join(h.removeprefix("reame_") for h in record.hooks) or "-"
        kind = "built-in" if record.builtin else record.distribution
        table.add_row(
            record.name, kind, record.version, state, hooks, record.error or record.description
        )
    (console or Console()).print(table)
    return 0
