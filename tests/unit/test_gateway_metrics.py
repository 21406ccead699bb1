"""The gauges an inference gateway's endpoint picker reads from every `reame serve`
(Gateway API Inference Extension, model server protocol)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from litestar import Litestar
from litestar.testing import TestClient
from prometheus_client.parser import text_string_to_metric_families

from reame_core.backend.fake import FakeBackend
from reame_core.plugins import PluginHost
from reame_core.request import GenerationRequest, SamplingParams
from reame_core.runtime import start_runtime
from reame_core.server.metrics import ServerMetrics
from reame_core.server.service import ServerState
from reame_core.settings import Settings

GAUGES = ("reame_num_requests_waiting", "reame_num_requests_running", "reame_kv_cache_usage_perc")


def gauges(text: str) -> dict[str, float]:
    families = text_string_to_metric_families(text)
    return {f.name: f.samples[0].value for f in families if f.name in GAUGES}


@pytest.fixture
def server() -> Iterator[ServerState]:
    server = ServerState(Settings())
    backend = FakeBackend(n_seq_max=1, step_cost_s=0.005)  # a request lasts seconds
    server.runtime = start_runtime(Settings(), backend=backend, plugins=PluginHost(discover=False))
    server.metrics = ServerMetrics(server)
    yield server
    server.runtime.close()


def test_an_idle_server_reports_empty_queues_and_cache(client: TestClient[Litestar]) -> None:
    client.post("/v1/completions", json={"prompt": "warm up", "max_tokens": 2})
    assert gauges(client.get("/metrics").text) == dict.fromkeys(GAUGES, 0.0)


def test_running_and_waiting_requests_show_in_the_gauges(server: ServerState) -> None:
    assert server.runtime is not None and server.metrics is not None
    engine, vocab = server.runtime.engine, server.runtime.backend.info.vocab
    prompt = vocab.tokenize("count with me " * 10, add_special=True, parse_special=False)
    endless = SamplingParams(max_tokens=1500, ignore_eos=True)
    tickets = [engine.submit(GenerationRequest(prompt, endless), lambda _: None) for _ in "ab"]
    try:
        deadline = time.monotonic() + 10
        while True:
            seen = gauges(server.metrics.render().decode())
            # The running request holds cells only once its first prompt chunk is in.
            filled = seen["reame_kv_cache_usage_perc"] > 0
            if (seen["reame_num_requests_waiting"] == 1 and filled) or time.monotonic() > deadline:
                break
            time.sleep(0.01)
    finally:
        for ticket in tickets:
            ticket.cancel()
    # One slot: one request runs, the other waits for it.
    assert seen["reame_num_requests_running"] == 1
    assert seen["reame_num_requests_waiting"] == 1
    assert 0 < seen["reame_kv_cache_usage_perc"] <= 1
