from __future__ import annotations

from typing import Any

import pytest
from litestar.testing import TestClient
from pydantic import ValidationError

from reame_conclave import plugin as conclave_plugin
from reame_core.backend.fake import FakeBackend
from reame_core.errors import RequestError
from reame_core.plugins import PluginHost
from reame_core.request import GenerationRequest, SamplingParams
from reame_core.runtime import start_runtime
from reame_core.server.app import create_app
from reame_core.server.service import ServerState
from reame_core.settings import Settings


def test_conclave_is_discovered_through_its_entry_point() -> None:
    records = {record.name: record for record in PluginHost().records()}
    record = records["conclave"]
    assert record.enabled
    assert record.distribution == "reame-conclave"
    assert "reame_configure" in record.hooks


def test_conclave_does_not_claim_a_feature_it_does_not_have() -> None:
    record = next(r for r in PluginHost().records() if r.name == "conclave")
    assert "not active" in record.description


def test_conclave_can_be_disabled_per_deployment() -> None:
    record = next(r for r in PluginHost(["conclave"]).records() if r.name == "conclave")
    assert not record.enabled
    assert record.hooks == ()


def test_conclave_refuses_unknown_settings() -> None:
    host = PluginHost()
    settings = Settings(plugins={"conclave": {"no_such_option": 1}})
    with pytest.raises(ValidationError):
        host.hook.reame_configure(settings=settings, model=FakeBackend().info)


# ------------------------------------------------------------------ requests


def check(host: PluginHost, **extensions: Any) -> None:
    prompt = FakeBackend().tokenize("Vote.", add_special=True, parse_special=False)
    request = GenerationRequest(prompt, SamplingParams(max_tokens=4), extensions=extensions)
    host.hook.reame_check_request(request=request, model=FakeBackend().info)


def test_conclave_claims_best_of() -> None:
    claimed: dict[str, str] = {}
    for fields in PluginHost().hook.reame_request_extensions():
        claimed.update(fields)

    assert "best_of" in claimed


def test_best_of_is_refused_naming_the_field_and_saying_the_plugin_is_not_active() -> None:
    with pytest.raises(RequestError) as refused:
        check(PluginHost(), best_of=3)

    assert refused.value.param == "best_of"
    assert "'best_of'" in refused.value.message
    assert "installed but not active in this release" in refused.value.message


@pytest.mark.parametrize("best_of", [None, 1])
def test_best_of_one_asks_for_nothing_and_passes(best_of: int | None) -> None:
    check(PluginHost(), best_of=best_of)


def test_the_api_answers_best_of_with_a_400_naming_the_field() -> None:
    host = PluginHost(discover=False)
    host.register(conclave_plugin, "conclave")
    server = ServerState(Settings())
    with TestClient(create_app(server)) as client:
        server.runtime = start_runtime(Settings(), backend=FakeBackend(), plugins=host)
        try:
            body = {"prompt": "Vote.", "max_tokens": 4, "best_of": 3}
            response = client.post("/v1/completions", json=body)
        finally:
            server.runtime.close()

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "best_of"
    assert "not active in this release" in error["message"]
