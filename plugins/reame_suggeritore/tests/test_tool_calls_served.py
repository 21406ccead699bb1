"""Tool calls served with Il Suggeritore on the fake backend: a toy model that knows nothing of
functions answers with calls whose arguments follow their schemas, because the grammar leaves
it nothing else to write."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from litestar.testing import TestClient

from reame_core.backend.fake import FakeBackend
from reame_core.plugins import PluginHost
from reame_core.runtime import start_runtime
from reame_core.server.app import create_app
from reame_core.server.service import ServerState
from reame_core.settings import Settings
from reame_suggeritore.plugin import Suggeritore

FORECAST = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "days", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "weather", "parameters": FORECAST}},
    {"type": "function", "function": {"name": "clock"}},
]
SCHEMAS = {"weather": FORECAST, "clock": {"type": "object", "additionalProperties": False}}


@pytest.fixture
def client() -> Iterator[TestClient[Any]]:
    host = PluginHost(discover=False)
    host.register(Suggeritore(), "suggeritore")
    server = ServerState(Settings())
    with TestClient(create_app(server)) as client:
        server.runtime = start_runtime(Settings(), backend=FakeBackend(), plugins=host)
        try:
            yield client
        finally:
            server.runtime.close()


def ask(client: TestClient[Any], **fields: Any) -> dict[str, Any]:
    body = {
        "messages": [{"role": "user", "content": "Weather in Rome?"}],
        "tools": TOOLS,
        "max_tokens": 300,
        **fields,
    }
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    choice: dict[str, Any] = response.json()["choices"][0]
    return choice


def valid_calls(choice: dict[str, Any]) -> list[str]:
    """The names of the calls in a complete reply, each checked against its function's
    schema."""
    assert choice["finish_reason"] == "tool_calls", choice
    names = []
    for call in choice["message"]["tool_calls"]:
        name = call["function"]["name"]
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[name])
        names.append(name)
    return names


@pytest.mark.parametrize("seed", range(6))
def test_a_required_call_follows_its_schema_greedy_and_sampled(
    client: TestClient[Any], seed: int
) -> None:
    sampling = {"temperature": 0} if seed == 0 else {"temperature": 1.0, "seed": seed}
    choice = ask(client, tool_choice="required", parallel_tool_calls=False, **sampling)
    assert len(valid_calls(choice)) == 1


def test_a_named_function_is_the_one_call(client: TestClient[Any]) -> None:
    named = {"type": "function", "function": {"name": "clock"}}
    for seed in range(3):
        choice = ask(client, tool_choice=named, temperature=1.0, seed=seed)
        assert valid_calls(choice) == ["clock"]


def test_parallel_calls_follow_one_another_until_the_model_stops(
    client: TestClient[Any],
) -> None:
    """The toy model never chooses to stop calling: max_tokens ends it mid-call."""
    choice = ask(client, tool_choice="required", temperature=0)
    assert choice["finish_reason"] == "length"
    *complete, cut = choice["message"]["tool_calls"]
    assert len(complete) >= 2
    valid_calls({"finish_reason": "tool_calls", "message": {"tool_calls": complete}})
    assert cut["function"]["name"] in SCHEMAS


def test_auto_leaves_the_toy_model_its_text(client: TestClient[Any]) -> None:
    choice = ask(client, temperature=0, max_tokens=20)
    assert choice["message"]["content"] and "tool_calls" not in choice["message"]


def test_a_schema_llguidance_cannot_compile_is_a_400_naming_the_tool(
    client: TestClient[Any],
) -> None:
    broken = {
        "type": "function",
        "function": {
            "name": "broken",
            "parameters": {"type": "object", "properties": {"a": {"type": "text"}}},
        },
    }
    response = client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "Hi"}], "tools": [*TOOLS, broken]},
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "tools[2].function.parameters"
