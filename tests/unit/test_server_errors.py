"""Every way the HTTP API says no: OpenAI-shaped error bodies that name the bad field,
the right status for each cause, API keys, and no 500 for any malformed input.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from api_errors import openai_error
from litestar import Litestar
from litestar.testing import TestClient

from reame_core.backend.fake import FakeBackend
from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import ModelInfo
from reame_core.plugins import PluginHost
from reame_core.request import GenerationRequest
from reame_core.server.app import create_app
from reame_core.server.service import ServerState
from reame_core.settings import Settings

Client = TestClient[Litestar]
CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"
MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]


def chat_body(**fields: Any) -> dict[str, Any]:
    return {"messages": MESSAGES, "max_tokens": 4, **fields}


def text_body(**fields: Any) -> dict[str, Any]:
    return {"prompt": "Once upon a time", "max_tokens": 4, **fields}


# ------------------------------------------------------------- fields out of their range


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        (CHAT, chat_body(messages=[]), "messages"),
        (CHAT, chat_body(max_tokens=0), "max_tokens"),
        (CHAT, chat_body(max_completion_tokens=0), "max_completion_tokens"),
        (CHAT, chat_body(temperature=2.5), "temperature"),
        (CHAT, chat_body(temperature=-0.1), "temperature"),
        (CHAT, chat_body(top_p=0), "top_p"),
        (CHAT, chat_body(top_p=1.5), "top_p"),
        (CHAT, chat_body(top_k=-1), "top_k"),
        (CHAT, chat_body(min_p=1.0), "min_p"),
        (CHAT, chat_body(n=0), "n"),
        (CHAT, chat_body(n=5), "n"),  # more candidates than the 4 sequence slots
        (CHAT, chat_body(presence_penalty=2.5), "presence_penalty"),
        (CHAT, chat_body(frequency_penalty=-3), "frequency_penalty"),
        (CHAT, chat_body(repeat_penalty=0), "repeat_penalty"),
        (CHAT, chat_body(repeat_penalty=11), "repeat_penalty"),
        (CHAT, chat_body(stop=[""]), "stop"),
        (CHAT, chat_body(stop=[f"s{i}" for i in range(17)]), "stop"),
        (CHAT, chat_body(logit_bias={"x": 1}), "logit_bias"),
        (CHAT, chat_body(logit_bias={"120": 101}), "logit_bias"),
        (CHAT, chat_body(logit_bias={"9999": 1}), "logit_bias"),
        (CHAT, chat_body(top_logprobs=2), "top_logprobs"),
        (CHAT, chat_body(logprobs=True, top_logprobs=21), "top_logprobs"),
        (CHAT, chat_body(session_id="s" * 201), "session_id"),
        (TEXT, text_body(prompt=""), "prompt"),
        (TEXT, text_body(prompt=[]), "prompt"),
        (TEXT, text_body(prompt=[[]]), "prompt"),
        (TEXT, text_body(prompt=[1, 300]), "prompt"),  # beyond the fake's 272 tokens
        (TEXT, text_body(logprobs=6), "logprobs"),
        (TEXT, text_body(echo=True), "echo"),
        (TEXT, text_body(max_tokens=0), "max_tokens"),
        # The same limits on the other route, checked by the same code.
        (TEXT, text_body(temperature=2.5), "temperature"),
        (TEXT, text_body(n=5), "n"),
        (TEXT, text_body(stop=[""]), "stop"),
        (TEXT, text_body(logit_bias={"120": -101}), "logit_bias"),
        (TEXT, text_body(logit_bias={"-1": 1}), "logit_bias"),
        (TEXT, text_body(prompt=[[256, 104], [1, 300]]), "prompt"),
        (CHAT, chat_body(logprobs=True, top_logprobs=-1), "top_logprobs"),
    ],
)
def test_out_of_range_field_is_refused_naming_it(
    client: Client, route: str, body: dict[str, Any], param: str
) -> None:
    error = openai_error(client.post(route, json=body), 400, param=param)
    assert error["type"] == "invalid_request_error"


def test_unknown_field_is_refused_naming_it(client: Client) -> None:
    error = openai_error(client.post(CHAT, json=chat_body(temprature=0.5)), 400, param="temprature")
    assert "temprature" in error["message"]


def test_non_text_content_part_is_refused_naming_the_message(client: Client) -> None:
    part = {"type": "image_url", "image_url": {"url": "https://a.example/cat.png"}}
    messages = [MESSAGES[0], {"role": "user", "content": [part]}]
    error = openai_error(
        client.post(CHAT, json=chat_body(messages=messages)), 400, param="messages[1].content"
    )
    assert "image_url" in error["message"]


def test_unknown_role_is_refused_naming_the_message(client: Client) -> None:
    body = chat_body(messages=[{"role": "wizard", "content": "hi"}])
    error = openai_error(client.post(CHAT, json=body), 400)
    assert error["param"] is not None
    assert error["param"].startswith("messages") and "role" in error["param"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("best_of", 3), ("grammar", "root ::= [a-z]+"), ("json_schema", {"type": "object"})],
)
def test_field_no_enabled_plugin_claims_is_refused_naming_the_field_not_a_plugin(
    client: Client, field: str, value: Any
) -> None:
    error = openai_error(client.post(TEXT, json=text_body(**{field: value})), 400, param=field)
    assert f"'{field}'" in error["message"]
    assert "no enabled plugin handles it; `reame plugins` lists them" in error["message"]
    assert "reame-" not in error["message"]


@pytest.mark.parametrize(
    "response_format",
    [{"type": "json_object"}, {"type": "json_schema", "json_schema": {"type": "object"}}],
)
def test_structured_response_format_without_a_plugin_is_refused_naming_no_plugin(
    client: Client, response_format: dict[str, Any]
) -> None:
    body = chat_body(response_format=response_format)
    error = openai_error(client.post(CHAT, json=body), 400, param="response_format")
    assert response_format["type"] in error["message"]
    assert "reame-" not in error["message"] and "`reame plugins`" in error["message"]


class ClaimingPlugin:
    """Claims request fields, and keeps the extensions of the requests it checks."""

    def __init__(self, *fields: str) -> None:
        self.fields = fields
        self.seen: list[dict[str, Any]] = []

    @hookimpl
    def reame_request_extensions(self) -> dict[str, str]:
        return {field: "a test extension" for field in self.fields}

    @hookimpl
    def reame_check_request(self, request: GenerationRequest, model: ModelInfo) -> None:
        self.seen.append(dict(request.extensions))


@pytest.mark.parametrize(
    ("route", "body", "field"),
    [
        (TEXT, text_body(best_of=3), "best_of"),
        (CHAT, chat_body(response_format={"type": "json_object"}), "response_format"),
        (
            CHAT,
            chat_body(response_format={"type": "json_object", "schema": {"type": "object"}}),
            "response_format",
        ),
        (CHAT, chat_body(tools=[{"type": "function", "function": {"name": "f"}}]), "tools"),
    ],
)
def test_field_an_enabled_plugin_claims_reaches_it_as_an_extension(
    serve: Callable[..., Client], plugins: PluginHost, route: str, body: dict[str, Any], field: str
) -> None:
    plugin = ClaimingPlugin(field)
    plugins.register(plugin, "claiming")

    response = serve().post(route, json=body)

    assert response.status_code == 200, response.text
    assert plugin.seen == [{field: body[field]}]


def test_suffix_with_a_token_id_prompt_is_not_silently_ignored(client: Client) -> None:
    # Fill-in-the-middle is built from text; with token ids the suffix would be dropped.
    body = text_body(prompt=[256, 104, 105], suffix="return x")
    openai_error(client.post(TEXT, json=body), 400, param="suffix")


# ---------------------------------------------------------------------------- model


@pytest.mark.parametrize(("route", "body"), [(CHAT, chat_body()), (TEXT, text_body())])
def test_unknown_model_is_404_model_not_found(
    client: Client, route: str, body: dict[str, Any]
) -> None:
    error = openai_error(
        client.post(route, json={**body, "model": "gpt-4o"}), 404, code="model_not_found"
    )
    assert error["param"] == "model"
    assert "gpt-4o" in error["message"]


# ----------------------------------------------------------------------- context size


@pytest.fixture
def small(serve: Callable[..., Client]) -> Client:
    """A server whose sequences hold 64 tokens."""
    return serve(backend=FakeBackend(n_ctx_seq=64))


def test_prompt_plus_max_tokens_beyond_context_is_refused(small: Client) -> None:
    body = text_body(prompt="x" * 30, max_tokens=40)  # 31 prompt tokens + 40 > 64
    openai_error(small.post(TEXT, json=body), 400, param="prompt", code="context_length_exceeded")


def test_chat_beyond_context_names_messages(small: Client) -> None:
    body = chat_body(max_tokens=60)  # the chat prompt alone is 42 tokens
    openai_error(small.post(CHAT, json=body), 400, param="messages", code="context_length_exceeded")


def test_chat_prompt_longer_than_context_names_messages(small: Client) -> None:
    body = {"messages": [{"role": "user", "content": "x" * 100}]}
    openai_error(small.post(CHAT, json=body), 400, param="messages", code="context_length_exceeded")


def test_text_prompt_longer_than_context_names_prompt(small: Client) -> None:
    body = text_body(prompt="x" * 100, max_tokens=None)  # None: "as much as fits"
    openai_error(small.post(TEXT, json=body), 400, param="prompt", code="context_length_exceeded")


@pytest.mark.parametrize(("route", "param"), [(CHAT, "messages"), (TEXT, "prompt")])
def test_huge_max_tokens_is_refused_as_context_overflow_naming_the_prompt(
    small: Client, route: str, param: str
) -> None:
    body = chat_body(max_tokens=2**70) if route == CHAT else text_body(max_tokens=2**70)
    openai_error(small.post(route, json=body), 400, param=param, code="context_length_exceeded")


def test_request_that_exactly_fills_the_context_is_served(small: Client) -> None:
    body = text_body(prompt="x" * 30, max_tokens=33, temperature=0)  # 31 + 33 == 64
    response = small.post(TEXT, json=body)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 33
    assert response.json()["choices"][0]["finish_reason"] == "length"


# --------------------------------------------------------------- transport and routing


def test_body_over_the_size_limit_is_413(serve: Callable[..., Client]) -> None:
    client = serve(Settings(max_body_bytes=2048))
    response = client.post(TEXT, json=text_body(prompt="x" * 4000))
    openai_error(response, 413, code="request_too_large")


@pytest.mark.parametrize("raw", [b'{"prompt": "Once', b"prompt=x", b"\xff\xfe", b""])
def test_malformed_json_is_400(client: Client, raw: bytes) -> None:
    response = client.post(TEXT, content=raw, headers={"content-type": "application/json"})
    openai_error(response, 400)


@pytest.mark.parametrize("body", [[], "Once upon a time", 5, None])
def test_body_that_is_not_an_object_is_400(client: Client, body: Any) -> None:
    openai_error(client.post(TEXT, json=body), 400)


def test_unknown_route_is_404_in_openai_shape(client: Client) -> None:
    openai_error(client.get("/v1/engines"), 404, code="not_found")


def test_wrong_method_is_405_in_openai_shape(client: Client) -> None:
    openai_error(client.get(CHAT), 405)


@pytest.mark.parametrize(
    ("route", "body"),
    [
        (CHAT, {"messages": "hello"}),
        (CHAT, chat_body(n="two")),
        (CHAT, chat_body(stop=5)),
        (CHAT, chat_body(stop=[5])),
        (CHAT, chat_body(temperature="hot")),
        (CHAT, chat_body(max_tokens=1.5)),
        (CHAT, chat_body(seed="lucky")),
        (CHAT, chat_body(logit_bias={"120": "a lot"})),
        (CHAT, chat_body(logit_bias=[120])),
        (CHAT, chat_body(stream_options="yes")),
        (CHAT, chat_body(stream_options={"include_usage": True, "extra": 1})),
        (CHAT, chat_body(response_format="json")),
        (CHAT, chat_body(metadata={"team": 1})),
        (CHAT, chat_body(user=5)),
        (CHAT, chat_body(session_id=5)),
        (CHAT, {"messages": [None]}),
        (CHAT, {"messages": [{"content": "no role"}]}),
        (CHAT, {"messages": [{"role": "user", "content": 5}]}),
        (CHAT, {"messages": [{"role": "user", "content": ["hi"]}]}),
        (CHAT, {"messages": [{"role": "user", "content": [{"text": "no type"}]}]}),
        (CHAT, {"messages": [{"role": "user", "content": "x", "tool_calls": []}]}),
        (CHAT, {}),
        (TEXT, {"prompt": {}}),
        (TEXT, {"prompt": None}),
        (TEXT, {"prompt": [1.5]}),
        (TEXT, {"prompt": [-1]}),
        (TEXT, {"prompt": [[-1]]}),
        (TEXT, {"prompt": [1, "a"]}),
        (TEXT, {"prompt": [[1], "a"]}),
        (TEXT, text_body(logprobs=-1)),
        (TEXT, text_body(suffix=5)),
        (TEXT, text_body(max_tokens=2**70)),
        (TEXT, {}),
    ],
)
def test_wrong_types_are_a_4xx_never_a_500(
    client: Client, route: str, body: dict[str, Any]
) -> None:
    response = client.post(route, json=body)
    assert 400 <= response.status_code < 500, response.text
    openai_error(response, response.status_code)


# ---------------------------------------------------------------------------- loading


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [("GET", "/v1/models", None), ("POST", CHAT, chat_body()), ("POST", TEXT, text_body())],
)
def test_api_answers_503_while_the_model_loads(
    method: str, path: str, body: dict[str, Any] | None
) -> None:
    server = ServerState(Settings())
    with TestClient(create_app(server)) as client:
        response = client.request(method, path, json=body)
    error = openai_error(response, 503, code="loading")
    assert error["type"] == "server_error"


def test_api_reports_a_failed_load_as_503() -> None:
    server = ServerState(Settings(), load_error="no such file: missing.gguf")
    with TestClient(create_app(server)) as client:
        error = openai_error(client.post(CHAT, json=chat_body()), 503)
    assert "missing.gguf" in error["message"]


# ------------------------------------------------------------------------------- auth


@pytest.fixture
def guarded(serve: Callable[..., Client]) -> Client:
    return serve(Settings(api_keys=["k1", "k2"]))


GUARDED_ROUTES = [
    ("GET", "/v1/models", None),
    ("POST", CHAT, chat_body()),
    ("GET", "/metrics", None),
]


@pytest.mark.parametrize(("method", "path", "body"), GUARDED_ROUTES)
def test_missing_api_key_is_401(
    guarded: Client, method: str, path: str, body: dict[str, Any] | None
) -> None:
    response = guarded.request(method, path, json=body)
    error = openai_error(response, 401, code="invalid_api_key")
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "authorization", ["Bearer k3", "Bearer k1k2", "Bearer ", "Basic k1", "k1", "Bearer k"]
)
def test_wrong_api_key_is_401(guarded: Client, authorization: str) -> None:
    response = guarded.get("/v1/models", headers={"Authorization": authorization})
    openai_error(response, 401, code="invalid_api_key")


@pytest.mark.parametrize("key", ["k1", "k2"])
@pytest.mark.parametrize(("method", "path", "body"), GUARDED_ROUTES)
def test_any_configured_api_key_is_accepted(
    guarded: Client, key: str, method: str, path: str, body: dict[str, Any] | None
) -> None:
    response = guarded.request(method, path, json=body, headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200, response.text


def test_health_needs_no_api_key(guarded: Client) -> None:
    assert guarded.get("/health").status_code == 200


def test_openapi_schema_needs_an_api_key(guarded: Client) -> None:
    openai_error(guarded.get("/schema/openapi.json"), 401, code="invalid_api_key")


def test_api_keys_are_read_from_the_key_file(serve: Callable[..., Client], tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text("# deploy keys\n\nfile-key-1\n  file-key-2  \n")
    client = serve(Settings(api_key_file=key_file))
    assert client.get("/v1/models", headers={"Authorization": "Bearer file-key-2"}).is_success
    openai_error(client.get("/v1/models"), 401, code="invalid_api_key")
    openai_error(client.get("/v1/models", headers={"Authorization": "Bearer # deploy keys"}), 401)


def test_api_keys_are_read_from_the_environment(
    serve: Callable[..., Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REAME_API_KEYS", "a, b")
    settings = Settings()
    assert settings.api_keys == ["a", "b"]
    client = serve(settings)
    assert client.get("/v1/models", headers={"Authorization": "Bearer b"}).is_success
    openai_error(client.get("/v1/models"), 401, code="invalid_api_key")
