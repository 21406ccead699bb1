"""The HTTP API fuzzed from its own OpenAPI description (schemathesis): bodies that follow
the published schema ("positive") and bodies that break it ("negative"), on every route,
over real uvicorn and the fake backend. Every answer is served or refused in OpenAI's
shape; none is a 5xx, none hangs, every stream ends with [DONE], and every request gives
its place in the queue back.

A short run by default (CI); REAME_FUZZ_EXAMPLES sets the examples per route and mode for
a long one: `REAME_FUZZ_EXAMPLES=500 pytest tests/unit/test_server_fuzz.py -s`. The run's
figures (cases by route, mode and status) are printed at the end.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from api_errors import openai_error
from hypothesis import HealthCheck, given, settings
from litestar.testing import TestClient
from loopback import serve_on_loopback
from schemathesis import Case, GenerationMode

from reame_core.server.app import create_app
from reame_core.server.service import ServerState
from reame_core.settings import Settings

EXAMPLES = int(os.environ.get("REAME_FUZZ_EXAMPLES", "40"))
ANSWER_WITHIN = 30.0  # seconds: a case that takes longer has hung


def published_schema() -> dict[str, Any]:
    """The OpenAPI document the app serves at /schema/openapi.json (no model needed)."""
    with TestClient(create_app(ServerState(Settings()))) as client:
        document: dict[str, Any] = client.get("/schema/openapi.json").json()
    return document


DOCUMENT = published_schema()
SCHEMA = schemathesis.openapi.from_dict(DOCUMENT)
# Bodies that follow the schema are sent as text a client would send: no NUL characters,
# which the API refuses wherever they are (tests/unit/test_server_hostile_input.py), and
# which would otherwise end most of them before any other check.
SCHEMA.config.generation.update(allow_x00=False)
BROKEN = schemathesis.openapi.from_dict(DOCUMENT)  # bodies that break it: anything goes
for loaded in (SCHEMA, BROKEN):
    loaded.config.max_stream_events = 1 << 20  # read every stream to its end (default: 20)
RUNS = [
    (path, method.upper(), mode)
    for path in SCHEMA
    for method in SCHEMA[path]
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    # A route that takes nothing cannot be sent anything that breaks its schema.
    if mode is GenerationMode.POSITIVE or method.upper() == "POST"
]

# Every case run, by route, mode and status: the run's figures.
tally: Counter[tuple[str, str, int]] = Counter()


@pytest.fixture(scope="module")
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, ServerState]]:
    with serve_on_loopback(Settings(max_queue=8)) as served:
        yield served
    terminal = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if terminal is None or capture is None or not tally:
        return
    with capture.global_and_fixture_disabled():
        terminal.write_line(f"\nfuzz: {sum(tally.values())} cases, {EXAMPLES} examples a mode")
        for (label, mode, status), count in sorted(tally.items()):
            terminal.write_line(f"  {label:30} {mode:9} {status}: {count}")


def test_the_schema_describes_the_completion_bodies() -> None:
    """What a fuzzer, a client generator or a reader learns from /schema/openapi.json."""
    for path, required, fields in [
        ("/v1/chat/completions", ["messages"], {"temperature", "tools", "response_format"}),
        ("/v1/completions", ["prompt"], {"temperature", "suffix", "logprobs"}),
    ]:
        operation = DOCUMENT["paths"][path]["post"]
        body = operation["requestBody"]["content"]["application/json"]["schema"]
        assert body["required"] == required
        assert fields <= set(body["properties"])
        assert body["additionalProperties"] is False
        assert "$ref" not in json.dumps(body)  # stands alone: no dangling $defs
        error = operation["responses"]["400"]["content"]["application/json"]["schema"]
        assert error["properties"]["error"]["required"] == ["message", "type", "param", "code"]


@pytest.mark.parametrize(("path", "method", "mode"), RUNS)
def test_every_answer_is_served_or_refused_in_openai_shape(
    path: str, method: str, mode: GenerationMode, server: tuple[str, ServerState]
) -> None:
    url, state = server
    schema = SCHEMA if mode is GenerationMode.POSITIVE else BROKEN
    operation = schema[path][method]

    @given(case=operation.as_strategy(mode))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def answer(case: Case) -> None:
        response = case.call(base_url=url, timeout=ANSWER_WITHIN)
        tally[(operation.label, mode.value, response.status_code)] += 1
        assert response.status_code < 500, response.text
        if response.status_code >= 400:
            openai_error(response, response.status_code)  # type: ignore[arg-type]
        elif response.headers.get("content-type", [""])[0].startswith("text/event-stream"):
            assert_stream_ends(response.text)
        assert queue_empties(state), "a finished request kept its place in the queue"

    answer()


def assert_stream_ends(text: str) -> None:
    events = [block.removeprefix("data: ") for block in text.split("\n\n") if block]
    assert events and events[-1] == "[DONE]", events[-3:]
    for event in events[:-1]:
        assert "error" not in json.loads(event), event


def queue_empties(state: ServerState, within: float = 2.0) -> bool:
    deadline = time.monotonic() + within
    while state.in_flight and time.monotonic() < deadline:
        time.sleep(0.005)
    return state.in_flight == 0
