"""Tool calls through the HTTP API on the fake backend: the request fields and their 400s,
tool_calls in whole and streamed replies, and the conversation's calls and results.

A grammar plugin is what makes a model write calls; here `ScriptedModel` stands in for the
grammar and the model together: it claims ``tools`` and, through the same logits hook a
grammar uses, makes the fake model write a fixed text and stop. The official openai client
and instructor read the replies as they read OpenAI's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

import httpx
import instructor
import numpy as np
import openai
import pytest
from litestar import Litestar
from litestar.testing import TestClient
from pydantic import BaseModel

from reame_core.backend.fake import EOS
from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import ModelInfo, SequenceView
from reame_core.plugins import PluginHost
from reame_core.request import GenerationRequest
from reame_core.tools import ToolUse, call_text

Client = TestClient[Litestar]
CHAT = "/v1/chat/completions"
QUESTION = [{"role": "user", "content": "Weather in Rome?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The forecast for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "clock"}}
ROME = call_text("weather", {"city": "Rome", "days": 2})
DEEP: dict[str, Any] = {"type": "string"}
for _ in range(100):
    DEEP = {"type": "object", "properties": {"a": DEEP}}
TIME = call_text("clock", {})


class ScriptedModel:
    """Claims ``tools`` and makes the fake model write `script`, then end."""

    def __init__(self, script: str = ROME) -> None:
        self.script = script.encode()
        self.requests: list[GenerationRequest] = []

    @hookimpl
    def reame_request_extensions(self) -> dict[str, str]:
        return {"tools": "function calls, constrained to the functions' schemas"}

    @hookimpl
    def reame_check_request(self, request: GenerationRequest, model: ModelInfo) -> None:
        self.requests.append(request)

    @hookimpl
    def reame_constrain_logits(
        self, seq: SequenceView, pending: list[int], logits: np.ndarray
    ) -> None:
        at = len(seq.output_tokens) + len(pending)
        logits.fill(-np.inf)
        logits[self.script[at] if at < len(self.script) else EOS] = 0.0


@pytest.fixture
def scripted(plugins: PluginHost) -> ScriptedModel:
    model = ScriptedModel()
    plugins.register(model, "scripted")
    return model


@pytest.fixture
def client(serve: Callable[..., Client], scripted: ScriptedModel) -> Client:
    return serve()


def chat(client: Client, **fields: Any) -> httpx.Response:
    body = {"messages": QUESTION, "tools": [WEATHER, CLOCK], "temperature": 0, **fields}
    return client.post(CHAT, json=body)


def ok(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def refused(response: httpx.Response, param: str) -> str:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    message: str = error["message"]
    return message


def stream_events(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.text
    payloads = [line[len("data: ") :] for line in response.text.split("\n\n") if line]
    assert payloads.pop() == "[DONE]"
    return [json.loads(payload) for payload in payloads]


# ------------------------------------------------------------------- the request


def test_calls_without_a_plugin_that_constrains_them_are_refused(
    serve: Callable[..., Client],
) -> None:
    client = serve()  # the built-in plugins only: none claims `tools`
    message = refused(chat(client), "tools")
    assert "no enabled plugin handles it; `reame plugins` lists them" in message
    refused(chat(client, tool_choice="required"), "tools")


def test_tool_choice_none_needs_no_plugin_and_calls_nothing(
    serve: Callable[..., Client],
) -> None:
    [choice] = ok(chat(serve(), tool_choice="none", max_tokens=8))["choices"]
    assert choice["finish_reason"] == "length"
    assert set(choice["message"]) == {"role", "content"}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": []}, "tools"),
        ({"tool_choice": {"type": "function", "function": {"name": "radio"}}}, "tool_choice"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": None, "tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"function": {"name": "weather"}}]}, "tools[0].type"),
        (
            {"tools": [{"type": "function", "function": {"name": "get weather"}}]},
            "tools[0].function.name",
        ),
        ({"tools": [CLOCK, CLOCK]}, "tools[1].function.name"),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}
                ]
            },
            "tools[0].function.parameters",
        ),
        ({"parallel_tool_calls": "sometimes"}, "parallel_tool_calls"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": DEEP}}]},
            "tools[0].function.parameters",
        ),
        ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages[0]"),
        ({"messages": [*QUESTION, {"role": "tool", "content": "sunny"}]}, "messages[1]"),
        (
            {"messages": [{"role": "user", "content": "x", "tool_call_id": "call_1"}]},
            "messages[0]",
        ),
    ],
    ids=[
        "no tools",
        "named function not offered",
        "unknown choice",
        "required without tools",
        "tool without type",
        "function name with a space",
        "two functions of one name",
        "parameters not an object",
        "parallel_tool_calls not a boolean",
        "parameters nested too deep",
        "a user's tool_calls",
        "a tool result without its call id",
        "a call id outside a tool result",
    ],
)
def test_bad_tool_fields_are_400s_naming_the_field(
    client: Client, fields: dict[str, Any], param: str
) -> None:
    refused(chat(client, **fields), param)


def test_the_plugin_gets_the_tools_as_the_core_read_them_and_as_sent(
    client: Client, scripted: ScriptedModel
) -> None:
    named = {"type": "function", "function": {"name": "weather"}}
    ok(chat(client, tool_choice=named, parallel_tool_calls=False))
    [request] = scripted.requests
    assert isinstance(request.tools, ToolUse)
    assert [f.name for f in request.tools.functions] == ["weather", "clock"]
    assert (request.tools.choice, request.tools.only, request.tools.single) == (
        "required",
        "weather",
        True,
    )
    assert request.tools.functions[1].parameters["properties"] == {}
    assert request.extensions == {"tools": [WEATHER, CLOCK]}


# ---------------------------------------------------------------------- replies


def test_a_reply_that_calls_has_tool_calls_null_content_and_its_finish_reason(
    client: Client,
) -> None:
    [choice] = ok(chat(client))["choices"]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["role"] == "assistant" and message["content"] is None
    [call] = message["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"]["name"] == "weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Rome", "days": 2}


def test_a_reply_in_text_under_auto_is_plain_content(
    serve: Callable[..., Client], plugins: PluginHost
) -> None:
    plugins.register(ScriptedModel("It is sunny."), "scripted")
    [choice] = ok(chat(serve()))["choices"]
    assert choice["finish_reason"] == "stop"
    assert choice["message"] == {"role": "assistant", "content": "It is sunny."}


def test_max_tokens_cuts_a_call_with_finish_reason_length(client: Client) -> None:
    [choice] = ok(chat(client, max_tokens=len(ROME) - 20))["choices"]
    assert choice["finish_reason"] == "length"
    arguments = choice["message"]["tool_calls"][0]["function"]["arguments"]
    assert ROME.split('"arguments": ')[1].startswith(arguments)


def test_a_streamed_call_comes_as_openai_streams_it(client: Client) -> None:
    chunks = stream_events(chat(client, stream=True))
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks if chunk["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    fragments = [d["tool_calls"] for d in deltas if "tool_calls" in d]
    assert all(len(fragment) == 1 and fragment[0]["index"] == 0 for fragment in fragments)
    first, rest = fragments[0][0], [fragment[0] for fragment in fragments[1:]]
    assert first["id"].startswith("call_") and first["type"] == "function"
    assert first["function"]["name"] == "weather"
    assert rest and all(set(part) == {"index", "function"} for part in rest)
    arguments = first["function"]["arguments"] + "".join(p["function"]["arguments"] for p in rest)
    assert json.loads(arguments) == {"city": "Rome", "days": 2}
    assert not any(d.get("content") for d in deltas[1:])
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_conversation_with_calls_and_results_is_accepted(client: Client) -> None:
    called = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city": "Rome"}'},
            }
        ],
    }
    result = {"role": "tool", "tool_call_id": "call_1", "name": "weather", "content": "sunny"}
    ok(chat(client, messages=[*QUESTION, called, result]))


# -------------------------------------------------------------------- clients


def openai_client(client: Client) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://testserver.local/v1", api_key="-", http_client=client)


def test_the_openai_client_reads_calls_whole_and_streamed(client: Client) -> None:
    api = openai_client(client)
    whole = api.chat.completions.create(
        model="fake",
        messages=QUESTION,
        tools=[WEATHER, CLOCK],
        temperature=0,  # type: ignore[arg-type]
    )
    [call] = whole.choices[0].message.tool_calls or []
    assert call.function.name == "weather"  # type: ignore[union-attr]
    with api.chat.completions.stream(
        model="fake",
        messages=QUESTION,
        tools=[WEATHER, CLOCK],
        temperature=0,  # type: ignore[arg-type]
    ) as events:
        final = events.get_final_completion()
    [streamed] = final.choices[0].message.tool_calls or []
    assert streamed.function.arguments == call.function.arguments  # type: ignore[union-attr]
    assert final.choices[0].finish_reason == "tool_calls"


class Forecast(BaseModel):
    city: str
    days: int
    unit: Literal["celsius", "fahrenheit"] = "celsius"


def test_instructor_tools_mode_reads_the_call_into_its_model(
    serve: Callable[..., Client], plugins: PluginHost
) -> None:
    model = ScriptedModel(call_text("Forecast", {"city": "Rome", "days": 2}))
    plugins.register(model, "scripted")
    extract = instructor.from_openai(openai_client(serve()), mode=instructor.Mode.TOOLS)
    forecast = extract.chat.completions.create(
        model="fake", response_model=Forecast, messages=QUESTION, temperature=0
    )
    assert forecast.model_dump() == {"city": "Rome", "days": 2, "unit": "celsius"}
    [request] = model.requests
    assert request.tools is not None and request.tools.only == "Forecast"
