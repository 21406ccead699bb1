"""What a running server tells about speculation: GET /speculation, /metrics and the
`reame speculation` command that prints the governor's view."""

from __future__ import annotations

import io
import socket
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import TestClient
from rich.console import Console

from reame_core.cli import speculation
from reame_core.errors import ReameError

# The fake model's greedy text soon repeats itself: prompt lookup has something to copy.
REPETITIVE = {"prompt": "abc abc abc abc", "max_tokens": 64, "temperature": 0, "speculate": "on"}


def test_speculation_route_lists_every_draft_source(client: TestClient[Litestar]) -> None:
    report = client.get("/speculation").json()

    assert report["mode"] == "auto"
    assert {row["source"] for row in report["sources"]} == {"prompt_lookup", "draft_model"}


def test_speculation_route_counts_verified_drafts(client: TestClient[Litestar]) -> None:
    body = client.post("/v1/completions", json=REPETITIVE).json()

    rows = {row["source"]: row for row in client.get("/speculation").json()["sources"]}
    lookup, timings = rows["prompt_lookup"], body["timings"]["drafts"]["prompt_lookup"]
    assert lookup["proposed"] == timings["proposed"] > 0
    assert lookup["accepted"] == timings["accepted"]
    assert client.get("/speculation").json()["pass_ms"]


def test_metrics_show_which_sources_the_governor_lets_draft(client: TestClient[Litestar]) -> None:
    text = client.get("/metrics").text

    assert 'reame_draft_source_enabled{source="prompt_lookup"} 1.0' in text
    assert 'reame_draft_source_tokens{source="prompt_lookup"}' in text


def test_speculation_command_prints_one_row_per_source(
    client: TestClient[Litestar], monkeypatch: pytest.MonkeyPatch
) -> None:
    client.post("/v1/completions", json=REPETITIVE)

    def fetch(url: str, api_key: str | None) -> dict[str, Any]:
        return dict(client.get("/speculation").json())

    monkeypatch.setattr(speculation, "fetch_report", fetch)
    out = io.StringIO()
    status = speculation.speculation_command("http://x", None, Console(file=out, width=200))

    printed = out.getvalue()
    assert status == 0
    assert "prompt_lookup" in printed and "draft_model" in printed
    assert "measured pass cost by tokens" in printed


def test_speculation_command_without_a_server_says_so() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there

    with pytest.raises(ReameError, match="no Reame server at"):
        speculation.fetch_report(f"http://127.0.0.1:{port}", None)
