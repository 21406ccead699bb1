from __future__ import annotations

from typing import Any

import pytest
from litestar.testing import TestClient
from pydantic import ValidationError

from reame_core.backend.fake import FakeBackend
from reame_core.errors import RequestError
from reame_core.plugins import PluginHost
from reame_core.request import GenerationRequest, SamplingParams
from reame_core.runtime import start_runtime
from reame_core.server.app import create_app
from reame_core.server.service import ServerState
from reame_core.settings import Settings
from reame_suggeritore import plugin as suggeritore_plugin


def test_suggeritore_is_discovered_through_its_entry_point() -> None:
    records = {record.name: record for record in PluginHost().records()}
    record = records["suggeritore"]
    assert record.enabled
    assert record.distribution == "reame-suggeritore"
    assert "reame_configure" in record.hooks


def test_suggeritore_does_not_claim_a_feature_it_does_not_have() -> None:
    record = next(r for r in PluginHost().records() if r.name == "suggeritore")
    assert "not active" in record.description


def test_suggeritore_can_be_disabled_per_deployment() -> None:
    record = next(r for r in PluginHost(["suggeritore"]).records() if r.name == "suggeritore")
    assert not record.enabled
    assert record.hooks == ()


def test_suggeritore_refuses_unknown_settings() -> None:
    host = PluginHost()
    settings = Settings(plugins={"suggeritore": {"no_such_option": 1}})
    with pytest.raises(ValidationError):
        host.hook.reame_configure(settings=settings, model=FakeBackend().info)


# ------------------------------------------------------------------ requests

STRUCTURED = [
    ("grammar", 'root ::= "yes" | "no"'),
    ("json_schema", {"type": "object"}),
    ("regex", "[a-z]+"),
    ("response_format", {"type": "json_object"}),
    ("response_format", {"type": "json_schema", "json_schema": {"type": "object"}}),
]


def check(host: PluginHost, **extensions: Any) -> None:
    prompt = FakeBackend().tokenize("Answer.", add_special=True, parse_special=False)
    request = GenerationRequest(prompt, SamplingParams(max_tokens=4), extensions=extensions)
    host.hook.reame_check_request(request=request, model=FakeBackend().info)


def test_suggeritore_claims_its_request_fields() -> None:
    claimed: dict[str, str] = {}
    for fields in PluginHost().hook.reame_request_extensions():
        claimed.update(fields)

    assert {"grammar", "json_schema", "regex", "response_format"} <= set(claimed)


@pytest.mark.parametrize(("field", "value"), STRUCTURED)
def test_structured_output_is_refused_naming_the_field_and_saying_it_is_not_active(
    field: str, value: Any
) -> None:
    with pytest.raises(RequestError) as refused:
        check(PluginHost(), **{field: value})

    assert refused.value.param == field
    assert f"'{field}'" in refused.value.message
    assert "installed but not active in this release" in refused.value.message


@pytest.mark.parametrize("value", [{"type": "text"}, None])
def test_a_plain_text_response_format_passes(value: Any) -> None:
    check(PluginHost(), response_format=value)


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/v1/completions", {"prompt": "Answer.", "regex": "[a-z]+"}),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "Answer."}],
                "response_format": {"type": "json_object"},
            },
        ),
    ],
)
def test_the_api_answers_structured_output_with_a_400_naming_the_field(
    route: str, body: dict[str, Any]
) -> None:
    host = PluginHost(discover=False)
    host.register(suggeritore_plugin, "suggeritore")
    server = ServerState(Settings())
    with TestClient(create_app(server)) as client:
        server.runtime = start_runtime(Settings(), backend=FakeBackend(), plugins=host)
        try:
            response = client.post(route, json={**body, "max_tokens": 4})
            plain = client.post(
                "/v1/chat/completions",
                json={
                    "messages": [{"role": "user", "content": "Answer."}],
                    "response_format": {"type": "text"},
                    "max_tokens": 4,
                },
            )
        finally:
            server.runtime.close()

    assert response.status_code == 400
    error = response.json()["error"]
    field = next(key for key in body if key not in ("prompt", "messages"))
    assert error["param"] == field
    assert "not active in this release" in error["message"]
    assert plain.status_code == 200
