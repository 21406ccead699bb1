"""A short fuzz run (schemathesis) of the completion routes on the embedded model, through
a real `reame serve`: what the fake backend cannot show (a real tokenizer and chat
template, llama.cpp's limits) answers in OpenAI's shape too, never with a 5xx.

Answers are kept short (`max_tokens` at most 8, `n` at most 2) so that the run takes
seconds; the bodies are otherwise as generated. REAME_FUZZ_EXAMPLES sets the examples per
route and mode (default 10).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import Case, GenerationMode
from served import reame_serve

EXAMPLES = int(os.environ.get("REAME_FUZZ_EXAMPLES", "10"))
ROUTES = ["/v1/chat/completions", "/v1/completions"]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with reame_serve(
        "--parallel", "2", "--ctx", "512", "--threads", "2", "--max-queue", "4",
    ) as served:  # fmt: skip
        yield served


def short(body: Any) -> Any:
    """The body with a short answer asked for, where it asks for one at all."""
    if isinstance(body, dict):
        for field in ("max_tokens", "max_completion_tokens"):
            if isinstance(body.get(field), int) and body[field] > 8:
                body[field] = 8
        if body.get("max_tokens") is None and "prompt" in body:
            body["max_tokens"] = 8
        if isinstance(body.get("n"), int) and body["n"] > 2:
            body["n"] = 2
    return body


@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
@pytest.mark.parametrize("route", ROUTES)
def test_fuzzed_requests_on_the_model_are_served_or_refused_in_openai_shape(
    url: str, route: str, mode: GenerationMode
) -> None:
    schema = schemathesis.openapi.from_url(f"{url}/schema/openapi.json")
    if mode is GenerationMode.POSITIVE:
        schema.config.generation.update(allow_x00=False)
    schema.config.max_stream_events = 1 << 20

    @given(case=schema[route]["POST"].as_strategy(mode))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def answer(case: Case) -> None:
        case.body = short(case.body)
        response = case.call(base_url=url, timeout=120)
        assert response.status_code < 500, response.text
        if response.status_code >= 400:
            error = response.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert isinstance(error["message"], str) and error["message"]
        elif response.headers.get("content-type", [""])[0].startswith("text/event-stream"):
            events = [b.removeprefix("data: ") for b in response.text.split("\n\n") if b]
            assert events[-1] == "[DONE]"
            assert all("error" not in json.loads(event) for event in events[:-1])

    answer()
