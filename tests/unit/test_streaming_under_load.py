"""Many streams at once, over real uvicorn: each streams exactly its own text. Characters
of two, three and four UTF-8 bytes come one byte (one token) at a time and are never sent
broken; a stop string split over several tokens never reaches the content; usage counts
exactly the tokens generated; every stream ends with [DONE].

The fake model's tokens are bytes. A scripting plugin (through `reame_constrain_logits`,
the hook grammars use) makes each request generate the text its ``script`` field names,
so what every stream must hold is known to the byte.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import httpx
import numpy as np
import pytest
from loopback import serve_on_loopback

from reame_core.backend.fake import EOS, FakeBackend
from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import SequenceView
from reame_core.plugins import PluginHost
from reame_core.settings import Settings

STOP = "<END>"
SCRIPTS = [
    "héllo wörld, ça va? " + STOP + " never sent",
    "海は広い、船は小さい。" + STOP + "見えない",
    "🙂🚢🌊 emoji ahoy 🦀" + STOP,
    "mixed: ĳ ß ∑ 𝄞 한국어 <EN" + STOP + "🙂",  # a stop's start, held back, then sent
    "<END is not <END> either, " + STOP,
    "no stop at all: 日本語のテキスト🙂",
]
STREAMS = 48  # each script eight times over, on 4 slots and a queue of 64


class Scripted:
    """Each sequence generates the UTF-8 bytes of its request's ``script``, then EOS."""

    @hookimpl
    def reame_request_extensions(self) -> Mapping[str, str]:
        return {"script": "the text this request generates"}

    @hookimpl
    def reame_constrain_logits(
        self, seq: SequenceView, pending: Sequence[int], logits: np.ndarray
    ) -> None:
        script = str(seq.extensions["script"]).encode()
        position = len(seq.output_tokens) + len(pending)
        token = script[position] if position < len(script) else EOS
        logits[:] = -np.inf
        logits[token] = 0.0


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    plugins = PluginHost(discover=False)
    plugins.register(Scripted(), "scripted")
    backend = FakeBackend(step_cost_s=0.001)
    with serve_on_loopback(Settings(max_queue=64), backend=backend, plugins=plugins) as (
        served,
        _state,
    ):
        yield served


def expected(script: str, max_tokens: int = 1000) -> tuple[str, int, str]:
    """The content a stream of `script` must hold, the tokens it generates, and why it ends."""
    data = script.encode()[:max_tokens]
    text = data.decode(errors="ignore")  # a character cut by max_tokens is never sent
    if STOP in text:
        content = text[: text.index(STOP)]
        tokens = len((content + STOP).encode())  # generation stops as the stop completes
        return content, tokens, "stop"
    return text, len(data), "length" if len(data) < len(script.encode()) else "stop"


async def stream(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> list[Any]:
    events: list[Any] = []
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if line:
                payload = line.removeprefix("data: ")
                events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


async def run_all(url: str, bodies: list[dict[str, Any]]) -> list[list[Any]]:
    limits = httpx.Limits(max_connections=len(bodies))
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        return await asyncio.gather(*(stream(client, url, body) for body in bodies))


def completion(script: str, **fields: Any) -> dict[str, Any]:
    return {
        "prompt": "Write:",
        "script": script,
        "stop": [STOP],
        "max_tokens": 1000,
        "stream": True,
        "stream_options": {"include_usage": True},
        **fields,
    }


def check(events: list[Any], script: str, max_tokens: int = 1000) -> None:
    content, tokens, reason = expected(script, max_tokens)
    assert events[-1] == "[DONE]"
    chunks, usage = events[:-2], events[-2]
    assert all("error" not in chunk for chunk in chunks)
    pieces = [chunk["choices"][0]["text"] for chunk in chunks if chunk["choices"]]
    assert all("\ufffd" not in piece for piece in pieces)  # no character sent broken
    assert "".join(pieces) == content
    assert len(pieces) >= len(content) // 2  # streamed as generated, not in one piece
    assert STOP not in "".join(pieces)
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finish[-1] == reason and not any(finish[:-1])
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == tokens
    assert usage["usage"]["prompt_tokens"] == len(b"Write:") + 1  # and BOS


def test_concurrent_streams_each_carry_their_own_text_whole(url: str) -> None:
    scripts = [SCRIPTS[i % len(SCRIPTS)] for i in range(STREAMS)]
    results = asyncio.run(run_all(url, [completion(script) for script in scripts]))
    for events, script in zip(results, scripts, strict=True):
        check(events, script)


@pytest.mark.parametrize("cut", range(1, 9))
def test_a_character_cut_by_max_tokens_is_dropped_not_broken(url: str, cut: int) -> None:
    script = "🙂海ß🚢"  # 4 + 3 + 2 + 4 bytes: every cut below lands in a different place
    bodies = [completion(script, max_tokens=cut) for _ in range(4)]
    for events in asyncio.run(run_all(url, bodies)):
        check(events, script, max_tokens=cut)


def test_chat_streams_under_load_hold_back_the_stop_string_too(url: str) -> None:
    bodies = [
        {
            "messages": [{"role": "user", "content": "Write."}],
            "script": script,
            "stop": STOP,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        for script in SCRIPTS * 2
    ]

    async def chat_all() -> list[list[Any]]:
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(chat_stream(client, body) for body in bodies))

    async def chat_stream(client: httpx.AsyncClient, body: dict[str, Any]) -> list[Any]:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as reply:
            lines = [line async for line in reply.aiter_lines() if line]
        return [
            p if p == "[DONE]" else json.loads(p) for p in (x.removeprefix("data: ") for x in lines)
        ]

    for events, body in zip(asyncio.run(chat_all()), bodies, strict=True):
        content, tokens, _reason = expected(body["script"])
        assert events[-1] == "[DONE]"
        deltas = [c["choices"][0]["delta"].get("content", "") for c in events[:-2] if c["choices"]]
        assert "\ufffd" not in "".join(deltas)
        assert "".join(deltas) == content
        assert events[-2]["usage"]["completion_tokens"] == tokens
