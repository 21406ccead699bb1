"""The lifecycle hooks' contract, on the fake backend, with plugins found by entry point."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from installed_plugins import InstalledPlugins
from litestar import Litestar
from litestar.testing import TestClient

from reame_core.backend.fake import FakeBackend
from reame_core.engine.engine import Engine
from reame_core.errors import RequestError
from reame_core.plugins import PluginHost
from reame_core.request import GenerationRequest, SamplingParams
from reame_core.runtime import start_runtime
from reame_core.settings import Settings

Serve = Callable[[PluginHost], TestClient[Litestar]]
MakeEngine = Callable[..., Engine]


def test_configure_comes_first_shutdown_last_and_each_candidate_starts_and_finishes_once(
    install_plugins: InstalledPlugins,
) -> None:
    plugins = install_plugins("lifecycle")
    runtime = start_runtime(Settings(), backend=FakeBackend(), plugins=plugins)
    request = GenerationRequest([1, 2, 3], SamplingParams(max_tokens=5, ignore_eos=True), n=2)
    finish = runtime.engine.generate(request)
    runtime.close()

    events = install_plugins.module("lifecycle").events
    rid = request.request_id
    texts = {str(result.candidate): result.text for result in finish.candidates}
    assert events[0] == ("configure", "fake")
    assert sorted(events[1:3]) == [("started", rid, "0"), ("started", rid, "1")]
    assert sorted(events[3:5]) == [
        ("finished", rid, "0", "length", texts["0"]),
        ("finished", rid, "1", "length", texts["1"]),
    ]
    assert events[5:] == [("shutdown",)]


def test_cancelled_candidates_are_finished_once_with_reason_cancelled(
    install_plugins: InstalledPlugins, make_engine: MakeEngine
) -> None:
    engine = make_engine(install_plugins("lifecycle"), step_cost_s=0.01)
    request = GenerationRequest([1, 2, 3], SamplingParams(max_tokens=1000, ignore_eos=True))
    started = threading.Event()  # set by the first token: the sequence has started
    ticket = engine.submit(request, lambda event: started.set())
    assert started.wait(timeout=30)
    ticket.cancel()
    engine.stop()

    finished = [e for e in install_plugins.module("lifecycle").events if e[0] == "finished"]
    assert [e[:4] for e in finished] == [("finished", request.request_id, "0", "cancelled")]


def test_claimed_field_reaches_every_candidates_extensions(
    install_plugins: InstalledPlugins, serve: Serve
) -> None:
    client = serve(install_plugins("extension_echo"))

    reply = client.post(
        "/v1/completions",
        json={"prompt": "Hello", "max_tokens": 2, "n": 2, "contract_tag": {"label": "x"}},
    )

    assert reply.status_code == 200, reply.text
    started = install_plugins.module("extension_echo").started
    assert sorted((candidate, ext) for _rid, candidate, ext in started) == [
        (0, {"contract_tag": {"label": "x"}}),
        (1, {"contract_tag": {"label": "x"}}),
    ]


def test_field_no_plugin_claims_is_refused(install_plugins: InstalledPlugins, serve: Serve) -> None:
    client = serve(install_plugins("refuse"))

    reply = client.post("/v1/completions", json={"prompt": "Hi", "contract_tag": "x"})

    assert reply.status_code == 400
    assert "contract_tag" in reply.json()["error"]["message"]


def test_refusing_plugin_answers_400_with_its_own_message(
    install_plugins: InstalledPlugins, serve: Serve
) -> None:
    refuse = install_plugins("refuse")
    client = serve(refuse)

    refused = client.post("/v1/completions", json={"prompt": "Hi", "refuse": True})
    served = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})

    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["message"] == install_plugins.module("refuse").MESSAGE
    assert error["param"] == "refuse"
    assert served.status_code == 200


def test_refusing_plugin_refuses_at_submit_through_the_engine_api(
    install_plugins: InstalledPlugins, make_engine: MakeEngine
) -> None:
    engine = make_engine(install_plugins("refuse"))
    request = GenerationRequest([1, 2, 3], extensions={"refuse": True})

    with pytest.raises(RequestError, match="refuse plugin"):
        engine.submit(request, lambda event: None)
    assert engine.stats.requests_submitted == 0
