"""Hostile input on the HTTP API: each case gets an OpenAI-shaped 4xx that says what is
wrong (and where, when the body can tell), never a 500 or a hang, and the server serves the
next request as before.

Bodies are sent as raw bytes where a JSON library would not write them (NaN, lone
surrogates, 100,000 levels of nesting). What only the HTTP server sees, a chunked body that
does not end, goes to the app on uvicorn over a loopback socket.
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_errors import openai_error
from litestar import Litestar
from litestar.testing import TestClient
from loopback import serve_on_loopback

from reame_core.backend.fake import FakeBackend
from reame_core.cli import main as cli_main
from reame_core.plugins import PluginHost
from reame_core.request import MAX_LOGIT_BIAS, MAX_STOP_CHARS, MAX_STOPS
from reame_core.server.app import OPEN_PATHS
from reame_core.server.json_body import MAX_DEPTH
from reame_core.settings import Settings

Client = TestClient[Litestar]
CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"


def post_raw(client: Client, route: str, raw: bytes | str) -> httpx.Response:
    content = raw.encode() if isinstance(raw, str) else raw
    return client.post(route, content=content, headers={"content-type": "application/json"})


def post_json(client: Client, route: str, body: Any) -> httpx.Response:
    """POST `body` as Python's json writes it: lone surrogates as \\ud800 escapes, which
    httpx's own encoder (UTF-8, not ASCII) cannot write."""
    return post_raw(client, route, json.dumps(body))


def serves_the_next_request(client: Client) -> None:
    response = client.post(TEXT, json={"prompt": "The sea", "max_tokens": 2})
    assert response.status_code == 200, response.text


def chat(content: Any = "Tell me about the sea.", **fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 2, **fields}


def text(prompt: Any = "Once upon a time", **fields: Any) -> dict[str, Any]:
    return {"prompt": prompt, "max_tokens": 2, **fields}


def tool(**function: Any) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": "lookup", **function}}]


# ----------------------------------------------------------- NaN, Infinity, 1e999


TOOL_WITH_INFINITY = json.dumps(
    chat(
        tools=tool(parameters={"type": "object", "properties": {"n": {"maximum": 0}}}),
        tool_choice="none",
    )
).replace('"maximum": 0', '"maximum": Infinity')


@pytest.mark.parametrize(
    ("route", "raw", "param"),
    [
        (TEXT, '{"prompt": "The sea", "temperature": NaN}', "temperature"),
        (TEXT, '{"prompt": "The sea", "temperature": Infinity}', "temperature"),
        (TEXT, '{"prompt": "The sea", "presence_penalty": -Infinity}', "presence_penalty"),
        (TEXT, '{"prompt": "The sea", "top_p": 1e999}', "top_p"),
        (TEXT, '{"prompt": "The sea", "seed": -1e999}', "seed"),
        (TEXT, '{"prompt": [256, 120, NaN]}', "prompt[2]"),
        (
            CHAT,
            json.dumps(chat()).replace("}]", '}], "logit_bias": {"120": NaN}'),
            "logit_bias.120",
        ),
        (CHAT, TOOL_WITH_INFINITY, "tools[0].function.parameters.properties.n.maximum"),
    ],
)
def test_non_finite_number_is_refused_naming_its_field(
    client: Client, route: str, raw: str, param: str
) -> None:
    error = openai_error(post_raw(client, route, raw), 400, param=param)
    assert "not a JSON number" in error["message"]
    serves_the_next_request(client)


def test_non_finite_body_is_refused(client: Client) -> None:
    error = openai_error(post_raw(client, TEXT, "NaN"), 400)
    assert error["param"] is None and "NaN" in error["message"]


@pytest.mark.parametrize(
    "raw",
    [
        '{"prompt": "The sea", "temperature": 1' + "0" * 400 + "}",
        '{"prompt": "The sea", "logit_bias": {"120": -1' + "0" * 400 + "}}",
        '{"prompt": "The sea", "max_tokens": 1' + "0" * 5000 + "}",
        '{"prompt": [256, 1' + "0" * 5000 + "]}",
    ],
    ids=["float field", "bias", "5000 digits", "5000-digit token"],
)
def test_integer_too_large_for_its_field_is_refused(client: Client, raw: str) -> None:
    openai_error(post_raw(client, TEXT, raw), 400)
    serves_the_next_request(client)


# ------------------------------------------------- lone surrogates and NUL characters


BAD_CHARACTERS = {
    "NUL": "\x00",
    "lone high surrogate": "\ud800",
    "lone low surrogate": "\udc00",
    "surrogates in the wrong order": "\udc00\ud800",
}

# Where text goes in a request, as (route, body holding `s`, the param that names it).
TEXT_FIELDS: list[tuple[str, Callable[[str], dict[str, Any]], str]] = [
    (TEXT, lambda s: text(f"The {s} sea"), "prompt"),
    (TEXT, lambda s: text(["The sea", s]), "prompt[1]"),
    (TEXT, lambda s: text("def f(x):", suffix=f"return {s}"), "suffix"),
    (CHAT, lambda s: chat(f"Hello {s}"), "messages[0].content"),
    (CHAT, lambda s: chat([{"type": "text", "text": s}]), "messages[0].content[0].text"),
    (
        CHAT,
        lambda s: {**chat(), "messages": [{"role": "system", "content": s}]},
        "messages[0].content",
    ),
    (TEXT, lambda s: text(stop=s), "stop"),
    (CHAT, lambda s: chat(stop=["\n", f"end{s}"]), "stop[1]"),
    (CHAT, lambda s: chat(model=f"fake{s}"), "model"),
    (
        CHAT,
        lambda s: chat(tools=tool(description=s), tool_choice="none"),
        "tools[0].function.description",
    ),
    (CHAT, lambda s: chat(tools=tool(name=f"f{s}"), tool_choice="none"), "tools[0].function.name"),
    (
        CHAT,
        lambda s: chat(
            tools=tool(parameters={"type": "object", "properties": {s: {"type": "string"}}}),
            tool_choice="none",
        ),
        "tools[0].function.parameters.properties",  # a key: its object is named
    ),
    (TEXT, lambda s: text(logit_bias={f"12{s}": 1}), "logit_bias"),
    (TEXT, lambda s: text(user=s), "user"),
    (TEXT, lambda s: text(session_id=s), "session_id"),
]


@pytest.mark.parametrize("character", BAD_CHARACTERS.values(), ids=BAD_CHARACTERS.keys())
@pytest.mark.parametrize(
    ("route", "body", "param"), TEXT_FIELDS, ids=[param for _, _, param in TEXT_FIELDS]
)
def test_text_with_a_nul_or_a_lone_surrogate_is_refused_naming_its_field(
    client: Client,
    route: str,
    body: Callable[[str], dict[str, Any]],
    param: str,
    character: str,
) -> None:
    error = openai_error(post_json(client, route, body(character)), 400, param=param)
    assert ("NUL" if character == "\x00" else "surrogate") in error["message"]
    serves_the_next_request(client)


def test_a_surrogate_pair_escaped_in_the_body_is_the_character_it_encodes(client: Client) -> None:
    # Python's json.dumps writes 🌊 as "\ud83c\udf0a": a valid pair is text like any other.
    response = post_json(client, TEXT, text("The sea 🌊", temperature=0))
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens"] == 1 + len("The sea 🌊".encode())


def test_a_surrogate_written_as_utf8_bytes_is_refused_as_not_utf8(client: Client) -> None:
    error = openai_error(post_raw(client, TEXT, b'{"prompt": "The \xed\xa0\x80 sea"}'), 400)
    assert "UTF-8" in error["message"]
    serves_the_next_request(client)


def test_an_unescaped_nul_in_a_string_is_refused_as_invalid_json(client: Client) -> None:
    error = openai_error(post_raw(client, TEXT, b'{"prompt": "The \x00 sea"}'), 400)
    assert "not valid JSON" in error["message"]


# ------------------------------------------------------------------------- nesting


def nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


@pytest.mark.parametrize(
    "raw",
    [
        "[" * 100_000,
        nested(100_000),
        '{"a":' * 100_000 + "1" + "}" * 100_000,
        '{"prompt": "The sea", "metadata": ' + nested(100_000) + "}",
        '{"prompt": ' + nested(900) + "}",  # within Python's recursion: refused by the check
        '{"prompt": ' + nested(MAX_DEPTH) + "}",  # one level over, with the body's object
    ],
    ids=["100k unclosed", "100k arrays", "100k objects", "100k in a field", "900", "limit+1"],
)
def test_deeply_nested_body_is_refused(client: Client, raw: str) -> None:
    error = openai_error(post_raw(client, TEXT, raw), 400)
    assert f"deeper than {MAX_DEPTH} levels" in error["message"]
    serves_the_next_request(client)


def test_nesting_at_the_limit_reaches_the_fields_own_checks(client: Client) -> None:
    body = '{"prompt": ' + nested(MAX_DEPTH - 1, "256") + "}"  # the limit, with the body
    error = openai_error(post_raw(client, TEXT, body), 400, param="prompt")
    assert "deeper than" not in error["message"]


def test_tool_parameters_past_their_own_depth_limit_get_its_message(client: Client) -> None:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(64):  # each level is two: properties, then the property's schema
        schema = {"type": "object", "properties": {"x": schema}}
    body = chat(tools=tool(parameters=schema), tool_choice="none")
    error = openai_error(client.post(CHAT, json=body), 400, param="tools[0].function.parameters")
    assert "deeper than 128 levels" in error["message"]


# -------------------------------------------------------------------- request size


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length body, read off a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        received = sock.recv(65536)
        assert received, f"closed before the headers: {data!r}"
        data += received
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (h.partition(":") for h in lines)}
    while len(body) < int(headers["content-length"]):
        received = sock.recv(65536)
        assert received, "closed before the body"
        body += received
    return int(status_line.split()[1]), headers, body


LIMIT = 64 << 10


def test_chunked_body_past_the_limit_is_413_before_the_stream_ends(plugins: PluginHost) -> None:
    chunk_size = 16 << 10
    chunk = b"%x\r\n%s\r\n" % (chunk_size, b" " * chunk_size)
    with serve_on_loopback(Settings(max_body_bytes=LIMIT), plugins=plugins) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
                b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            started = time.monotonic()
            sent = 0
            # The stream would go on for 1 GB: the answer must come long before.
            while sent < 1 << 30 and not select.select([sock], [], [], 0)[0]:
                try:
                    sock.sendall(chunk)
                except OSError:  # the server stopped reading: its answer is there
                    break
                sent += chunk_size
            status, _, body = read_response(sock)
            elapsed = time.monotonic() - started
        assert status == 413
        error = openai_error(httpx.Response(413, content=body), 413, code="request_too_large")
        assert error["type"] == "invalid_request_error"
        assert sent < 64 * LIMIT, f"the server read {sent} bytes past a {LIMIT}-byte limit"
        assert elapsed < 5
        response = httpx.post(f"{url}/v1/completions", json=text(), timeout=10)
        assert response.status_code == 200, response.text


def test_announced_length_past_the_limit_is_413_before_any_body(plugins: PluginHost) -> None:
    with serve_on_loopback(Settings(max_body_bytes=LIMIT), plugins=plugins) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
                b"Content-Type: application/json\r\nContent-Length: 1000000000000\r\n\r\n"
            )
            status, _, body = read_response(sock)
        openai_error(httpx.Response(status, content=body), 413, code="request_too_large")
        response = httpx.post(f"{url}/v1/chat/completions", json=chat(), timeout=10)
        assert response.status_code == 200, response.text


# ------------------------------------------------------------ stop strings, logit_bias


@pytest.mark.parametrize(
    "stop",
    [
        [f"s{i}" for i in range(MAX_STOPS + 1)],
        [f"s{i}" for i in range(5000)],
        "x" * (MAX_STOP_CHARS + 1),
        ["\n", "y" * 100_000],
        ["\n", ""],
    ],
    ids=["17", "5000", "257 characters", "100k characters", "empty"],
)
@pytest.mark.parametrize("route", [CHAT, TEXT])
def test_too_many_or_too_long_stop_strings_are_refused(
    client: Client, route: str, stop: Any
) -> None:
    body = chat(stop=stop) if route == CHAT else text(stop=stop)
    error = openai_error(client.post(route, json=body), 400, param="stop")
    assert f"at most {MAX_STOPS} strings of 1 to {MAX_STOP_CHARS} characters" in error["message"]
    serves_the_next_request(client)


def test_the_most_and_the_longest_stop_strings_allowed_are_served(client: Client) -> None:
    stops = ["z" * MAX_STOP_CHARS] + [f"stop {i}" for i in range(MAX_STOPS - 1)]
    response = client.post(TEXT, json=text(stop=stops))
    assert response.status_code == 200, response.text


def test_enormous_logit_bias_is_refused_naming_the_limit(serve: Callable[..., Client]) -> None:
    client = serve(Settings(max_body_bytes=64 << 20))
    bias = {str(token): 1 for token in range(1_000_000)}
    error = openai_error(client.post(TEXT, json=text(logit_bias=bias)), 400, param="logit_bias")
    assert f"at most {MAX_LOGIT_BIAS} token ids" in error["message"]
    serves_the_next_request(client)


def test_one_entry_over_the_logit_bias_limit_is_refused(client: Client) -> None:
    bias = {str(token % 256): 1 for token in range(MAX_LOGIT_BIAS)}  # 256 distinct keys
    bias |= {str(1000 + token): 1 for token in range(MAX_LOGIT_BIAS + 1 - len(bias))}
    openai_error(client.post(TEXT, json=text(logit_bias=bias)), 400, param="logit_bias")


def test_a_bias_on_every_token_of_the_vocabulary_is_served(client: Client) -> None:
    bias = {str(token): -1 for token in range(272)}
    response = client.post(TEXT, json=text(logit_bias=bias))
    assert response.status_code == 200, response.text


NOT_TOKEN_IDS = {
    "5000 digits": "9" * 5000,
    "exponent": "1e2",
    "hex": "0x10",
    "leading space": " 12",
    "trailing space": "12 ",
    "empty": "",
    "plus": "+12",
    "arabic-indic digits": "\u0661\u0662",
    "fullwidth digits": "\uff11\uff12",
    "underscore": "1_000",
    "past the vocabulary": "272",
    "negative": "-1",
}


@pytest.mark.parametrize("key", NOT_TOKEN_IDS.values(), ids=NOT_TOKEN_IDS.keys())
def test_logit_bias_key_that_is_not_a_token_id_is_refused(client: Client, key: str) -> None:
    openai_error(client.post(TEXT, json=text(logit_bias={key: 1})), 400, param="logit_bias")
    serves_the_next_request(client)


@pytest.mark.parametrize("value", ["a lot", None, [1], {"v": 1}, 101, -1e308])
def test_logit_bias_value_that_is_not_a_bias_is_refused(client: Client, value: Any) -> None:
    response = client.post(TEXT, json=text(logit_bias={"120": value}))
    error = openai_error(response, 400)
    assert (error["param"] or "").startswith("logit_bias")


# ------------------------------------------------------------------------ model names


@pytest.fixture
def gguf_outside_the_store(tmp_path: Path) -> Path:
    path = tmp_path / "planted.gguf"
    path.write_bytes(b"GGUF" + bytes(64))
    return path


@pytest.mark.parametrize(
    "name",
    [
        "../../../../etc/passwd",
        "/etc/passwd",
        "~/.cache/reame/models/model.gguf",
        "..\\..\\windows\\system32",
        "fake/../fake",
        "smollm2-135m",  # an alias Reame could download, but not the model served here
        "hf:owner/repo:Q4_K_M",
        "x" * 100_000,
        "PLANTED",
    ],
    ids=["relative", "absolute", "home", "backslashes", "dot-dot", "alias", "hub", "100k", "file"],
)
@pytest.mark.parametrize("route", [CHAT, TEXT])
def test_model_name_that_is_not_the_served_model_is_404_whatever_it_looks_like(
    client: Client, route: str, name: str, gguf_outside_the_store: Path
) -> None:
    name = str(gguf_outside_the_store) if name == "PLANTED" else name
    body = chat(model=name) if route == CHAT else text(model=name)
    error = openai_error(client.post(route, json=body), 404, param="model", code="model_not_found")
    assert len(error["message"]) < 300  # a long name is cut short, not echoed whole
    serves_the_next_request(client)


# ------------------------------------------------------------------- context limits


@pytest.fixture
def small(serve: Callable[..., Client]) -> Client:
    """A server whose sequences hold 64 tokens."""
    return serve(backend=FakeBackend(n_ctx_seq=64))


def token_ids(count: int) -> list[int]:
    return [120] * count


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "served"),
    [
        (token_ids(63), None, True),  # room for exactly one token
        (token_ids(63), 1, True),
        (token_ids(63), 2, False),
        (token_ids(64), None, False),  # the prompt alone fills the context
        (token_ids(64), 1, False),
        (token_ids(10), 54, True),
        (token_ids(10), 55, False),
        ("x" * 62, None, True),  # BOS + 62 bytes
        ("x" * 63, None, False),
        ([token_ids(10), token_ids(63)], None, True),
        ([token_ids(10), token_ids(64)], None, False),  # one prompt of a batch is over
        ([token_ids(10), token_ids(10)], 55, False),
    ],
)
def test_prompt_at_the_context_limit_is_served_and_one_over_is_refused(
    small: Client, prompt: Any, max_tokens: int | None, served: bool
) -> None:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    response = small.post(TEXT, json=body)
    if served:
        assert response.status_code == 200, response.text
        usage = response.json()["usage"]
        n_prompts = len(prompt) if isinstance(prompt[0], list) else 1
        assert usage["completion_tokens"] <= n_prompts * (max_tokens or 64)
    else:
        openai_error(response, 400, param="prompt", code="context_length_exceeded")
    serves_the_next_request(small)


def test_a_refused_batch_leaves_no_request_behind(serve: Callable[..., Client]) -> None:
    settings = Settings(max_queue=0)  # 4 slots: a request left behind would hold one
    client = serve(settings, backend=FakeBackend(n_ctx_seq=64))
    for _ in range(8):
        body = {"prompt": [token_ids(10), token_ids(10), token_ids(64)]}
        openai_error(client.post(TEXT, json=body), 400, code="context_length_exceeded")
    response = client.post(TEXT, json={"prompt": [token_ids(5)] * 4, "max_tokens": 2})
    assert response.status_code == 200, response.text


# --------------------------------------------------------------- images and audio


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
        {"type": "file", "file": {"file_id": "file-1"}},
        {"type": "image", "image": "https://a.example/cat.png"},
    ],
    ids=lambda part: part["type"],
)
def test_image_or_audio_content_is_refused_saying_the_server_takes_text(
    client: Client, part: dict[str, Any]
) -> None:
    content = [{"type": "text", "text": "What is this?"}, part]
    error = openai_error(client.post(CHAT, json=chat(content)), 400, param="messages[0].content")
    assert part["type"] in error["message"] and "text only" in error["message"]
    serves_the_next_request(client)


@pytest.mark.parametrize("part", [{"type": "text"}, {"type": "text", "text": 5}])
def test_text_part_without_text_is_refused(client: Client, part: dict[str, Any]) -> None:
    openai_error(client.post(CHAT, json=chat([part])), 400, param="messages[0].content")


# ---------------------------------------------------------------------- API keys


KEY = "k-0123456789"
BAD_AUTHORIZATION = {
    "missing": {},
    "wrong": {"Authorization": "Bearer k-9876543210"},
    "empty": {"Authorization": "Bearer "},
    "scheme only": {"Authorization": "Bearer"},
    "key without scheme": {"Authorization": KEY},
    "other scheme": {"Authorization": f"Basic {KEY}"},
    "prefix of the key": {"Authorization": f"Bearer {KEY[:-1]}"},
}


@pytest.fixture
def guarded(serve: Callable[..., Client]) -> Client:
    return serve(Settings(api_keys=[KEY]))


def every_route(client: Client) -> list[tuple[str, str]]:
    """(method, path) of every route the app registers, OPTIONS included, path parameters
    filled in."""
    routes = []
    for route in client.app.routes:
        path = route.path_format.replace("{", "").replace("}", "") or "/"
        routes += [(method, path) for method in sorted(getattr(route, "methods", ()))]
    return routes


def test_every_route_but_health_refuses_a_request_without_the_key(guarded: Client) -> None:
    routes = every_route(guarded)
    assert {("POST", CHAT), ("POST", TEXT), ("GET", "/v1/models"), ("GET", "/metrics")} <= set(
        routes
    )
    assert {("GET", "/speculation"), ("GET", "/schema/openapi.json"), ("OPTIONS", TEXT)} <= set(
        routes
    )
    for method, path in routes:
        for headers in BAD_AUTHORIZATION.values():
            response = guarded.request(method, path, headers=headers, json=chat())
            if path in OPEN_PATHS:  # /health and the web page's files
                assert response.is_success, (method, response.status_code)
            else:
                openai_error(response, 401, code="invalid_api_key")


def test_the_key_opens_every_route(guarded: Client) -> None:
    for method, path in every_route(guarded):
        response = guarded.request(
            method, path, headers={"Authorization": f"Bearer {KEY}"}, json=chat()
        )
        assert response.status_code != 401, (method, path)


def test_a_hostile_body_without_the_key_is_refused_before_it_is_read(guarded: Client) -> None:
    openai_error(post_raw(guarded, TEXT, "[" * 100_000), 401, code="invalid_api_key")


@pytest.fixture
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """`reame serve` must stop before checking the build or opening a port."""
    monkeypatch.setattr(
        "reame_core.server.app.ensure_build_runs", lambda *_: pytest.fail("went on to start")
    )
    monkeypatch.setattr("uvicorn.run", lambda *_args, **_kwargs: pytest.fail("port opened"))


@pytest.mark.parametrize(
    ("argv", "environment"),
    [
        (["--api-key", ""], {}),
        (["--api-key", "   "], {}),
        (["--api-key", KEY, "--api-key", ""], {}),
        ([], {"REAME_API_KEY": ""}),
        ([], {"REAME_API_KEYS": ""}),
        ([], {"REAME_API_KEYS": " , "}),
        ([], {"REAME_API_KEYS": f'["{KEY}", ""]'}),
        (["--api-key", "clé"], {}),
    ],
    ids=[
        "--api-key ''", "--api-key blank", "one key empty", "REAME_API_KEY=''",
        "REAME_API_KEYS=''", "REAME_API_KEYS=' , '", "empty in a JSON list", "not ASCII",
    ],
)  # fmt: skip
@pytest.mark.usefixtures("nothing_starts")
def test_serve_refuses_an_empty_api_key(
    argv: list[str],
    environment: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in environment.items():
        monkeypatch.setenv(name, value)

    code = cli_main.main(["serve", *argv])

    assert code == 2
    said = capsys.readouterr().err
    assert "api_key" in said
    assert KEY not in said  # the error names the setting, never the keys


@pytest.mark.parametrize(
    "content",
    ["\n", "   \n\n", "# deploy keys\n# none yet\n", None],
    ids=["empty line", "blanks", "comments", "missing"],
)
@pytest.mark.usefixtures("nothing_starts")
def test_serve_refuses_a_key_file_without_a_key(
    content: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key_file = tmp_path / "keys"
    if content is not None:
        key_file.write_text(content)

    code = cli_main.main(["serve", "--api-key-file", str(key_file)])

    assert code == 1
    assert str(key_file) in capsys.readouterr().err


def test_reame_api_key_in_the_environment_guards_the_api(
    serve: Callable[..., Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REAME_API_KEY", KEY)
    client = serve(Settings())
    openai_error(client.get("/v1/models"), 401, code="invalid_api_key")
    assert client.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).is_success


def test_keys_are_read_without_their_surrounding_blanks(serve: Callable[..., Client]) -> None:
    client = serve(Settings(api_keys=[f"  {KEY}\t"]))
    assert client.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).is_success


def test_more_prompts_than_the_queue_could_ever_hold_are_refused_before_tokenizing(
    client: Client,
) -> None:
    response = client.post("/v1/completions", json={"prompt": ["a"] * 200_000, "max_tokens": 1})

    assert response.status_code == 400
    assert response.json()["error"]["param"] == "prompt"
    assert "200000 prompts" in response.json()["error"]["message"]


def test_a_session_header_longer_than_the_body_field_allows_is_refused(client: Client) -> None:
    body = {"prompt": "Hi", "max_tokens": 1}

    response = client.post("/v1/completions", json=body, headers={"X-Session-ID": "s" * 201})

    assert response.status_code == 400
    assert response.json()["error"]["param"] == "X-Session-ID"
    assert client.post("/v1/completions", json=body, headers={"X-Session-ID": "s" * 200}).is_success
