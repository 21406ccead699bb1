"""Streams on the embedded model, many at once: each streams exactly the text its request
gets unstreamed (characters whole, a stop string never sent), with the same usage, and
ends with [DONE]."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from served import reame_serve

PROMPTS = [
    "Repeat exactly: 海は広い 🙂🚢 café",
    "Write three emoji that mean the sea, then the word sea in Japanese.",
    "Translate into Chinese: the ship sails at dawn.",
    "Repeat exactly: naïve façade, Ωmega, 한국어, 🦀🐍",
]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with reame_serve(
        "--parallel", "4", "--ctx", "512", "--threads", "2", "--speculate", "off",
    ) as served:  # fmt: skip
        yield served


def body(prompt: str, **fields: Any) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 40,
        "temperature": 0,
        **fields,
    }


async def streamed(client: httpx.AsyncClient, url: str, request: dict[str, Any]) -> list[Any]:
    request = {**request, "stream": True, "stream_options": {"include_usage": True}}
    async with client.stream("POST", f"{url}/v1/chat/completions", json=request) as response:
        assert response.status_code == 200
        lines = [line.removeprefix("data: ") async for line in response.aiter_lines() if line]
    return [line if line == "[DONE]" else json.loads(line) for line in lines]


async def both(url: str, requests: list[dict[str, Any]]) -> tuple[list[Any], list[Any]]:
    async with httpx.AsyncClient(timeout=300) as client:
        streams = [streamed(client, url, request) for request in requests]
        whole = [client.post(f"{url}/v1/chat/completions", json=r) for r in requests]
        results = await asyncio.gather(*streams, *whole)
    return list(results[: len(requests)]), [r.json() for r in results[len(requests) :]]


def content_of(events: list[Any]) -> str:
    deltas = [e["choices"][0]["delta"].get("content") or "" for e in events[:-2] if e["choices"]]
    assert all("\ufffd" not in delta for delta in deltas)
    return "".join(deltas)


@pytest.mark.timeout(600)
def test_concurrent_streams_on_the_model_are_whole_and_exact(url: str) -> None:
    requests = [body(prompt) for prompt in PROMPTS * 2]
    streams, replies = asyncio.run(both(url, requests))
    for events, reply in zip(streams, replies, strict=True):
        assert events[-1] == "[DONE]"
        assert content_of(events) == reply["choices"][0]["message"]["content"]
        assert events[-2]["usage"]["completion_tokens"] == reply["usage"]["completion_tokens"]
    assert any(not reply["choices"][0]["message"]["content"].isascii() for reply in replies)

    # A stop string from inside each answer, where the answer has one: never sent.
    stops = {}
    for prompt, reply in zip(PROMPTS, replies, strict=False):
        text = reply["choices"][0]["message"]["content"]
        if len(text) > 12:
            stops[prompt] = text[len(text) // 2 : len(text) // 2 + 3]
    requests = [body(prompt, stop=[stop]) for prompt, stop in stops.items()]
    streams, replies = asyncio.run(both(url, requests))
    for events, reply, stop in zip(streams, replies, stops.values(), strict=True):
        content = content_of(events)
        assert stop not in content
        assert content == reply["choices"][0]["message"]["content"]
        assert reply["choices"][0]["finish_reason"] == "stop"
        assert events[-1] == "[DONE]"
