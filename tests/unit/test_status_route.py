"""GET /status: what the server runs on, what it is doing and what it has saved."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from litestar import Litestar
from litestar.testing import TestClient

from reame_core.hookspecs import hookimpl
from reame_core.plugins import PluginHost

Serve = Callable[..., TestClient[Litestar]]


def test_status_counts_prompt_tokens_reused_by_a_session(client: TestClient[Litestar]) -> None:
    turn = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}
    session = {"X-Session-ID": "web-test"}
    client.post("/v1/chat/completions", json=turn, headers=session)
    second = client.post("/v1/chat/completions", json=turn, headers=session).json()

    tokens = client.get("/status").json()["tokens"]
    assert tokens["reused"] + tokens["restored"] == second["timings"]["cached_n"] > 0
    assert tokens["computed"] + tokens["reused"] + tokens["restored"] == tokens["prompt"]
    assert tokens["generated"] == 8


def test_status_tells_model_load_governor_and_host(client: TestClient[Litestar]) -> None:
    report = client.get("/status").json()

    assert report["model"]["slots"] >= 1
    assert report["load"] == {"slots_busy": 0, "queued": 0, "in_flight": 0, "max_queue": 64}
    sources = {row["source"] for row in report["speculation"]["sources"]}
    assert sources == {"prompt_lookup", "draft_model"}
    assert report["host"]["logical_cpus"] >= 1
    assert report["guarantees"].startswith("deterministic")
    assert report["configuration"] == []  # a backend the test supplied was not planned
    assert report["request_fields"] == []  # no plugin installed here


def test_status_is_503_while_the_model_loads(serve: Serve) -> None:
    client = serve()
    server = client.app.state.server
    runtime, server.runtime = server.runtime, None
    try:
        response = client.get("/status")
    finally:
        server.runtime = runtime

    assert response.status_code == 503
    assert response.json()["error"]["code"] == "loading"


class Archive:
    """A plugin that claims a request field and counts what it keeps."""

    @hookimpl
    def reame_request_extensions(self) -> Mapping[str, str]:
        return {"best_of": "sample this many answers and keep the one most agree on"}

    @hookimpl
    def reame_collect_stats(self) -> Mapping[str, Mapping[str, Any]]:
        return {"archive": {"entries": 3, "bytes_on_disk": 4096}}


def test_status_tells_what_plugins_count_and_which_fields_they_handle(
    plugins: PluginHost, serve: Serve
) -> None:
    plugins.register(Archive(), "archive")
    report = serve().get("/status").json()

    assert report["plugins"] == {"archive": {"entries": 3, "bytes_on_disk": 4096}}
    assert report["request_fields"] == ["best_of"]
