"""What the server's log says about requests: their prompts and outputs only when the operator
asked for them (`--log-prompts`), never by default."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import structlog
from litestar import Litestar
from litestar.testing import TestClient

from reame_core.cli import main as cli_main
from reame_core.logs import configure_logging

Client = TestClient[Litestar]
QUESTION = "Tell me about the sea."
MESSAGES = [{"role": "user", "content": QUESTION}]


@pytest.fixture
def log_as_json() -> Iterator[Callable[[bool], None]]:
    """Configure JSON log lines, with or without prompts; back to defaults afterwards."""
    yield lambda prompts: configure_logging(json=True, prompts=prompts)
    configure_logging()
    structlog.reset_defaults()


def logged(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def chat(client: Client, **fields: Any) -> dict[str, Any]:
    body = {"messages": MESSAGES, "temperature": 0, "max_tokens": 12, **fields}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def test_with_log_prompts_each_request_logs_its_prompt_and_outputs(
    client: Client, log_as_json: Callable[[bool], None], capsys: pytest.CaptureFixture[str]
) -> None:
    log_as_json(True)
    answer = chat(client, n=2)

    exchanges = [line for line in logged(capsys.readouterr().err) if line["event"] == "exchange"]
    assert len(exchanges) == 1
    assert exchanges[0]["id"] == answer["id"]
    assert exchanges[0]["prompt"] == MESSAGES
    assert exchanges[0]["outputs"] == [c["message"]["content"] for c in answer["choices"]]


def test_with_log_prompts_a_streamed_completion_logs_its_prompt_and_output(
    client: Client, log_as_json: Callable[[bool], None], capsys: pytest.CaptureFixture[str]
) -> None:
    log_as_json(True)
    body = {"prompt": "Once upon a time", "temperature": 0, "max_tokens": 12}
    expected = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    capsys.readouterr()

    client.post("/v1/completions", json={**body, "stream": True})

    exchanges = [line for line in logged(capsys.readouterr().err) if line["event"] == "exchange"]
    assert [(e["prompt"], e["outputs"]) for e in exchanges] == [("Once upon a time", [expected])]


def test_by_default_no_prompt_or_output_reaches_the_log(
    client: Client, log_as_json: Callable[[bool], None], capsys: pytest.CaptureFixture[str]
) -> None:
    log_as_json(False)
    answer = chat(client)

    stderr = capsys.readouterr().err
    assert QUESTION not in stderr
    assert answer["choices"][0]["message"]["content"] not in stderr


def test_log_prompts_is_a_serve_flag() -> None:
    args = cli_main.build_parser().parse_args(["serve", "--log-prompts"])

    assert cli_main.settings_from(args).log_prompts
    assert not cli_main.settings_from(cli_main.build_parser().parse_args(["serve"])).log_prompts
