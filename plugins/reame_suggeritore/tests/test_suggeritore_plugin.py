from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from litestar.testing import TestClient
from pydantic import ValidationError

from reame_core.backend.fake import FakeBackend
from reame_core.cli import main as cli_main
from reame_core.cli import run as cli_run
from reame_core.plugins import PluginHost
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


def test_suggeritore_says_what_it_does() -> None:
    record = next(r for r in PluginHost().records() if r.name == "suggeritore")
    assert "structured output" in record.description
    assert "drafts" in record.description


def test_suggeritore_can_be_disabled_per_deployment() -> None:
    record = next(r for r in PluginHost(["suggeritore"]).records() if r.name == "suggeritore")
    assert not record.enabled
    assert record.hooks == ()


def test_suggeritore_refuses_unknown_settings() -> None:
    host = PluginHost()
    settings = Settings(plugins={"suggeritore": {"no_such_option": 1}})
    with pytest.raises(ValidationError):
        host.hook.reame_configure(settings=settings, model=FakeBackend().info, hook=host.hook)


# ------------------------------------------------------------------ requests


def test_suggeritore_claims_its_request_fields_only() -> None:
    claimed: dict[str, str] = {}
    for fields in PluginHost().hook.reame_request_extensions():
        claimed.update(fields)

    assert {"grammar", "json_schema", "regex", "response_format", "tools"} <= set(claimed)
    # The core reads tool_choice and parallel_tool_calls; claiming `tools` says the plugin
    # constrains the calls.
    assert not {"tool_choice", "parallel_tool_calls"} & set(suggeritore_plugin.REQUEST_FIELDS)


def serve(host: PluginHost) -> Iterator[TestClient[Any]]:
    server = ServerState(Settings())
    with TestClient(create_app(server)) as client:
        server.runtime = start_runtime(Settings(), backend=FakeBackend(), plugins=host)
        try:
            yield client
        finally:
            server.runtime.close()


@pytest.fixture
def client() -> Iterator[TestClient[Any]]:
    host = PluginHost(discover=False)
    host.register(suggeritore_plugin.Suggeritore(), "suggeritore")
    yield from serve(host)


CHAT = {"messages": [{"role": "user", "content": "Answer."}], "max_tokens": 60}
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}, "why": {"type": "string", "maxLength": 20}},
    "required": ["answer", "why"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/v1/completions", {"prompt": "Answer.", "regex": "(a"}),
        ("/v1/completions", {"prompt": "Answer.", "grammar": "root ::= ("}),
        ("/v1/completions", {"prompt": "Answer.", "json_schema": {"type": "nosuch"}}),
        ("/v1/chat/completions", {**CHAT, "response_format": {"type": "xml"}}),
        ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema"}}),
        ("/v1/chat/completions", {**CHAT, "json_schema": SCHEMA, "regex": "[a-z]+"}),
    ],
)
def test_the_api_answers_a_bad_constraint_with_a_400_naming_the_field(
    client: TestClient[Any], route: str, body: dict[str, Any]
) -> None:
    response = client.post(route, json={"max_tokens": 4, **body})

    assert response.status_code == 400
    error = response.json()["error"]
    asked = [key for key in body if key in suggeritore_plugin.REQUEST_FIELDS]
    assert error["param"] == asked[-1]
    assert f"'{error['param']}" in error["message"]


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_the_api_answers_with_json_that_follows_the_schema(
    client: TestClient[Any], route: str
) -> None:
    asked = {"prompt": "Answer."} if route == "/v1/completions" else CHAT
    body = {
        **asked,
        # Room for the longest answer the schema allows: sampled, each of the 20 characters
        # of "why" may be an escape such as \u00e9, six bytes, and the fake model writes a
        # byte a token.
        "max_tokens": 200,
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}},
    }

    response = client.post(route, json=body)

    assert response.status_code == 200
    choice = response.json()["choices"][0]
    content = choice["message"]["content"] if "message" in choice else choice["text"]
    jsonschema.validate(json.loads(content), SCHEMA)


def test_the_api_reports_grammar_drafts_in_timings(client: TestClient[Any]) -> None:
    body = {**CHAT, "json_schema": SCHEMA, "speculate": "on"}

    response = client.post("/v1/chat/completions", json=body)

    drafts = response.json()["timings"]["drafts"]["suggeritore"]
    assert drafts["accepted"] == drafts["proposed"] > 0


def test_a_plain_text_response_format_passes(client: TestClient[Any]) -> None:
    response = client.post(
        "/v1/chat/completions", json={**CHAT, "response_format": {"type": "text"}}
    )

    assert response.status_code == 200


# -------------------------------------------------------------- command line


def follows_schema(output: str) -> bool:
    jsonschema.validate(json.loads(output), SCHEMA)
    return True


def is_a_colour(output: str) -> bool:
    return output in ("colour: red", "colour: blue")


def is_a_code(output: str) -> bool:
    return re.fullmatch("[a-c]{3}-[0-9]{2}", output) is not None


@pytest.fixture
def fake_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """`reame run` on the fake backend, with Il Suggeritore alone and nothing piped in."""
    host = PluginHost(discover=False)
    host.register(suggeritore_plugin.Suggeritore(), "suggeritore")
    monkeypatch.setattr(cli_main, "PluginHost", lambda: host)
    monkeypatch.setattr(
        cli_run,
        "start_runtime",
        lambda settings: start_runtime(settings, backend=FakeBackend(), plugins=host),
    )
    monkeypatch.setattr("sys.stdin", io.StringIO(""))


@pytest.mark.parametrize(
    ("flag", "content", "valid"),
    [
        ("--json-schema", json.dumps(SCHEMA), follows_schema),
        ("--grammar", 'root ::= "colour: " ("red" | "blue")', is_a_colour),
        ("--regex", None, is_a_code),
    ],
)
def test_reame_run_answers_with_the_structure_its_flag_names(
    flag: str,
    content: str | None,
    valid: Callable[[str], bool],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    fake_run: None,
) -> None:
    value = "[a-c]{3}-[0-9]{2}"
    if content is not None:
        value = str(tmp_path / "structure")
        Path(value).write_text(content)

    status = cli_main.main(["run", flag, value, "--max-tokens", "120", "Answer."])

    assert status == 0
    assert valid(capsys.readouterr().out.strip())


def test_reame_run_refuses_a_bad_schema_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fake_run: None
) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "nosuch"}')

    status = cli_main.main(["run", "--json-schema", str(schema), "Answer."])

    assert status == 1
    assert "'json_schema'" in capsys.readouterr().err
