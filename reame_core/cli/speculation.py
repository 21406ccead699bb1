"""`reame speculation`: a running server's speculation governor, per draft source."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from rich.console import Console
from rich.table import Table

from reame_core.errors import ReameError


def fetch_report(url: str, api_key: str | None) -> dict[str, Any]:
    request = urllib.request.Request(f"{url.rstrip('/')}/speculation")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return dict(json.load(response))
    except urllib.error.HTTPError as error:
        raise ReameError(f"{url} answered {error.code}: {error.read().decode()[:200]}") from None
    except (urllib.error.URLError, OSError) as error:
        raise ReameError(f"no Reame server at {url} ({error})") from None


def speculation_command(url: str, api_key: str | None, console: Console | None = None) -> int:
    report = fetch_report(url, api_key)
    table = Table(title=f"Speculation ({report['mode']}, at most {report['draft_max']} tokens)")
    columns = ("source", "state", "proposed", "accepted", "rate", "k", "gain", "why")
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in report["sources"]:
        gain = row["expected_gain"]
        table.add_row(
            row["source"],
            row["state"],
            str(row["proposed"]),
            str(row["accepted"]),
            f"{row['acceptance_rate']:.0%}",
            str(row["k"]),
            "-" if gain is None else f"{gain:.2f}x",
            row["reason"],
        )
    console = console or Console()
    console.print(table)
    curve = ", ".join(f"{n}: {ms} ms" for n, ms in report["pass_ms"].items())
    console.print(f"measured pass cost by tokens: {curve or 'nothing yet'}")
    return 0
