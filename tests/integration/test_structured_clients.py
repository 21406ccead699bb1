"""The clients users bring for structured output, against the API serving SmolLM2: the
`openai` client's `chat.completions.parse` with a pydantic model, and `instructor` in its
JSON_SCHEMA mode. Each gets back an object of its model, unchanged client code."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import instructor
import openai
import pytest
from pydantic import BaseModel, Field
from served import serve_in_process

from reame_core.backend.llama import LlamaBackend
from reame_core.plugins import PluginHost
from reame_core.runtime import start_runtime
from reame_core.settings import Settings
from reame_suggeritore.plugin import Suggeritore


class Ticket(BaseModel):
    customer: str = Field(max_length=30)
    priority: Literal["low", "medium", "high"]
    category: Literal["billing", "bug", "account", "other"]
    summary: str = Field(max_length=60)


TEXT = (
    "From: Anna Bianchi. I was charged twice this month, please refund one payment as soon "
    "as possible!"
)


@pytest.fixture(scope="module")
def base_url(smollm2_path: Path, use_extra_bufts: bool) -> Iterator[str]:
    """The API in this process, on a free port, with Il Suggeritore registered directly (the
    entry point is the installed package's business, tested elsewhere)."""
    backend = LlamaBackend(
        smollm2_path,
        n_ctx_seq=1024,
        n_seq_max=2,
        n_threads=2,
        deterministic=True,
        use_extra_bufts=use_extra_bufts,
    )
    host = PluginHost(discover=False)
    host.register(Suggeritore(), "suggeritore")
    settings = Settings()
    with serve_in_process(start_runtime(settings, backend=backend, plugins=host)) as url:
        yield url


def test_openai_parse_returns_an_object_of_the_pydantic_model(base_url: str) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)

    completion = client.chat.completions.parse(
        model=client.models.list().data[0].id,
        messages=[{"role": "user", "content": f"Make a support ticket of this: {TEXT}"}],
        response_format=Ticket,
        temperature=0,
        max_tokens=300,
    )

    ticket = completion.choices[0].message.parsed
    assert isinstance(ticket, Ticket)
    assert completion.choices[0].finish_reason == "stop"


def test_instructor_json_schema_mode_returns_an_object_of_the_pydantic_model(
    base_url: str,
) -> None:
    plain = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    client = instructor.from_openai(plain, mode=instructor.Mode.JSON_SCHEMA)

    ticket = client.chat.completions.create(
        model=plain.models.list().data[0].id,
        response_model=Ticket,
        messages=[{"role": "user", "content": f"Make a support ticket of this: {TEXT}"}],
        temperature=0,
        max_tokens=300,
        max_retries=0,
    )

    assert isinstance(ticket, Ticket)
