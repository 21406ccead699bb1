"""Tool calls and structured answers from the embedded SmolLM2-135M through the HTTP API,
driven by the clients people use: instructor (TOOLS and JSON_SCHEMA modes) and the official
openai client (tool calls, streamed too, and `chat.completions.parse`).

A 135M model left to itself seldom writes a well-formed call; Il Suggeritore's grammar is what
makes these answers valid, so the server runs with it. Qwen2.5-Coder-0.5B, when its file is
in Reame's model cache, shows the other path: a chat template that renders tools itself, and
call markers that are tokens of its vocabulary.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import instructor
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field, field_validator
from served import serve_in_process

from reame_core.backend.llama import LlamaBackend
from reame_core.plugins import PluginHost
from reame_core.runtime import Runtime, start_runtime
from reame_core.settings import Settings
from reame_suggeritore.plugin import Suggeritore

INVOICE_TEXT = "Invoice 2024-17 from ACME Corp: 3 hours of consulting, total 450 EUR."
WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The forecast for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 30},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "unit", "days"],
            "additionalProperties": False,
        },
    },
}


class Invoice(BaseModel):
    number: str = Field(max_length=20)
    customer: str = Field(max_length=40)
    total: int = Field(ge=0, le=1_000_000)
    currency: Literal["EUR", "USD", "GBP"]


def constrained(backend: LlamaBackend) -> Runtime:
    """A runtime over `backend` with Il Suggeritore registered and speculation on (its
    forced-token drafts are verified along the way)."""
    plugins = PluginHost(discover=False)
    plugins.register(Suggeritore(), "suggeritore")
    return start_runtime(Settings(speculate="on"), backend=backend, plugins=plugins)


@pytest.fixture(scope="module")
def server_url(smollm2_path: Path, use_extra_bufts: bool) -> Iterator[str]:
    backend = LlamaBackend(
        smollm2_path,
        n_ctx_seq=2048,
        n_seq_max=4,
        n_batch=512,
        n_threads=2,
        deterministic=True,
        use_extra_bufts=use_extra_bufts,
    )
    with serve_in_process(constrained(backend)) as url:
        yield url


@pytest.fixture
def client(server_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server_url, api_key="-", max_retries=0, timeout=120)


@pytest.fixture
def model(client: openai.OpenAI) -> str:
    """The served model's id (a model loaded from a path is named after its file)."""
    return client.models.list().data[0].id


def ask_invoice(
    mode: instructor.Mode, client: openai.OpenAI, model: str, **options: Any
) -> Invoice:
    extract = instructor.from_openai(client, mode=mode)
    invoice: Invoice = extract.chat.completions.create(
        model=model,
        response_model=Invoice,
        messages=[{"role": "user", "content": f"Extract the invoice: {INVOICE_TEXT}"}],
        max_tokens=200,
        **options,
    )
    return invoice


@pytest.mark.parametrize("mode", [instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA])
@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.8, "seed": 7}])
def test_instructor_extracts_a_valid_model(
    client: openai.OpenAI, model: str, mode: instructor.Mode, sampling: dict[str, Any]
) -> None:
    invoice = ask_invoice(mode, client, model, max_retries=0, **sampling)
    assert isinstance(invoice, Invoice)


def test_instructor_retries_after_a_validation_error(client: openai.OpenAI, model: str) -> None:
    """A retry sends the failed call back with a tool message: the conversation renders."""
    seen: list[str] = []

    class Picky(Invoice):
        @field_validator("customer")
        @classmethod
        def not_the_first(cls, value: str) -> str:
            seen.append(value)
            if len(seen) == 1:
                raise ValueError("name the customer as the invoice writes it")
            return value

    extract = instructor.from_openai(client, mode=instructor.Mode.TOOLS)
    invoice = extract.chat.completions.create(
        model=model,
        response_model=Picky,
        messages=[{"role": "user", "content": f"Extract the invoice: {INVOICE_TEXT}"}],
        max_tokens=200,
        max_retries=2,
        temperature=0,
    )
    assert isinstance(invoice, Picky) and len(seen) == 2


def test_openai_parse_returns_the_pydantic_model(client: openai.OpenAI, model: str) -> None:
    completion = client.chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": f"Extract the invoice: {INVOICE_TEXT}"}],
        response_format=Invoice,
        max_tokens=200,
        temperature=0,
    )
    assert isinstance(completion.choices[0].message.parsed, Invoice)


def weather_calls(message: Any) -> list[dict[str, Any]]:
    """The arguments of each weather call, checked against the function's schema."""
    arguments = []
    for call in message.tool_calls or []:
        assert call.function.name == "weather"
        value = json.loads(call.function.arguments)
        jsonschema.validate(value, WEATHER["function"]["parameters"])  # type: ignore[index]
        arguments.append(value)
    return arguments


@pytest.mark.parametrize("seed", range(4))
def test_required_calls_are_valid_whole_and_streamed(
    client: openai.OpenAI, model: str, seed: int
) -> None:
    options: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": "What is the weather in Oslo this week?"}],
        "tools": [WEATHER],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_tokens": 120,
        **({"temperature": 0} if seed == 0 else {"temperature": 1.0, "seed": seed}),
    }
    whole = client.chat.completions.create(**options)
    assert whole.choices[0].finish_reason == "tool_calls"
    assert len(weather_calls(whole.choices[0].message)) == 1
    with client.chat.completions.stream(**options) as stream:
        streamed = stream.get_final_completion()
    assert streamed.choices[0].finish_reason == "tool_calls"
    assert len(weather_calls(streamed.choices[0].message)) == 1


def test_auto_answers_in_text_or_valid_calls(client: openai.OpenAI, model: str) -> None:
    for question in ("Say hello.", "What is the weather in Rome?"):
        reply = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": question}],
            tools=[WEATHER],
            max_tokens=60,
            temperature=0,
        )
        message = reply.choices[0].message
        assert message.content or weather_calls(message)


# ------------------------------------------------------------------ Qwen2.5-Coder-0.5B

QWEN = Path.home() / ".cache/reame/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


@pytest.fixture(scope="module")
def qwen(use_extra_bufts: bool) -> Iterator[openai.OpenAI]:
    if not QWEN.exists():
        pytest.skip(f"Qwen2.5-Coder-0.5B is not at {QWEN}")
    backend = LlamaBackend(
        QWEN,
        n_ctx_seq=2048,
        n_seq_max=2,
        n_batch=512,
        n_threads=2,
        deterministic=True,
        use_extra_bufts=use_extra_bufts,
    )
    with serve_in_process(constrained(backend)) as url:
        yield openai.OpenAI(base_url=url, api_key="-", max_retries=0, timeout=300)


def test_qwen_calls_through_its_own_template_and_marker_tokens(qwen: openai.OpenAI) -> None:
    reply = qwen.chat.completions.create(
        model=qwen.models.list().data[0].id,
        messages=[{"role": "user", "content": "What is the weather in Oslo for 3 days?"}],
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,  # greedy, the 0.5B model calls again and again
        max_tokens=80,
        temperature=0,
        logprobs=True,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert len(weather_calls(choice.message)) == 1
    assert choice.logprobs is not None and choice.logprobs.content is not None
    # The call opened with the vocabulary's <tool_call> token, not its spelling in pieces.
    assert choice.logprobs.content[0].token == "<tool_call>"
