"""Server-Sent Events from the HTTP API, framed as OpenAI frames them, on the fake backend;
and how a generation that fails on the way is reported, streamed or not.

The test client returns a stream's whole body once it ends, so these tests check what is
sent, byte for byte; `test_server_concurrency.py` checks what happens while it is sent.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from litestar import Litestar
from litestar.testing import TestClient

from reame_core.backend.base import Batch, DecodeError
from reame_core.backend.fake import FakeBackend

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

Client = TestClient[Litestar]
CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"
MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]
STORY = "Once upon a time"


def body_for(route: str, **fields: Any) -> dict[str, Any]:
    """A greedy request of 12 tokens for `route`; `fields` override or add."""
    start = {"messages": MESSAGES} if route == CHAT else {"prompt": STORY}
    return {**start, "temperature": 0, "max_tokens": 12, **fields}


def one_shot(client: Client, route: str, **fields: Any) -> str:
    """The text of the first choice of the same request, not streamed."""
    response = client.post(route, json=body_for(route, **fields))
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    text: str = choice["message"]["content"] if route == CHAT else choice["text"]
    return text


def stream(client: Client, route: str, **fields: Any) -> httpx.Response:
    return client.post(route, json=body_for(route, stream=True, **fields))


def frames(response: httpx.Response) -> list[bytes]:
    """Check that the body is exactly `data: <payload>\\n\\n` events; return the payloads."""
    assert response.status_code == 200, response.text
    parts = response.content.split(b"\n\n")
    assert parts.pop() == b"", "the body must end with a blank line"
    for part in parts:
        assert part.startswith(b"data: "), part
        assert b"\n" not in part, part
    return [part[len(b"data: ") :] for part in parts]


def events(response: httpx.Response) -> list[dict[str, Any]]:
    """The JSON events of a stream that ended with one `data: [DONE]`."""
    payloads = frames(response)
    assert payloads[-1] == b"[DONE]"
    assert payloads.count(b"[DONE]") == 1
    return [json.loads(payload) for payload in payloads[:-1]]


def pieces(chunks: list[dict[str, Any]], index: int = 0) -> list[str]:
    """The text that each chunk sent for choice `index`."""
    return [
        choice["delta"].get("content", "") if "delta" in choice else choice["text"]
        for chunk in chunks
        for choice in chunk["choices"]
        if choice["index"] == index
    ]


def streamed_text(chunks: list[dict[str, Any]], index: int = 0) -> str:
    return "".join(pieces(chunks, index))


# ------------------------------------------------------------------------------ framing


@pytest.mark.parametrize("route", [CHAT, TEXT])
def test_stream_is_served_as_an_event_stream(client: Client, route: str) -> None:
    response = stream(client, route)
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache"


@pytest.mark.parametrize("route", [CHAT, TEXT])
def test_every_event_is_one_data_line_and_the_last_is_done(client: Client, route: str) -> None:
    chunks = events(stream(client, route))
    assert len(chunks) >= 1 + 1  # at least some text and the finish


# --------------------------------------------------------------------------------- chat


def test_chat_chunks_share_one_id_and_name_their_object(client: Client) -> None:
    chunks = events(stream(client, CHAT))
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
    ids = {chunk["id"] for chunk in chunks}
    assert len(ids) == 1 and ids.pop().startswith("chatcmpl-")
    assert all(isinstance(c["created"], int) and c["model"] == "fake" for c in chunks)


def test_first_chat_delta_announces_the_assistant(client: Client) -> None:
    first = events(stream(client, CHAT))[0]
    assert first["choices"] == [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
    ]


def test_streamed_chat_text_equals_the_one_shot_text(client: Client) -> None:
    expected = one_shot(client, CHAT, max_tokens=30)
    assert streamed_text(events(stream(client, CHAT, max_tokens=30))) == expected


def test_chat_stream_ends_with_an_empty_delta_and_the_finish_reason(client: Client) -> None:
    chunks = events(stream(client, CHAT))
    assert chunks[-1]["choices"] == [
        {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
    ]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


def test_streamed_chat_candidates_keep_their_index(client: Client) -> None:
    expected = one_shot(client, CHAT)
    chunks = events(stream(client, CHAT, n=2))
    assert [c["index"] for c in chunks[0]["choices"]] == [0, 1]
    assert streamed_text(chunks, 0) == streamed_text(chunks, 1) == expected
    assert [c["finish_reason"] for c in chunks[-1]["choices"]] == ["length", "length"]


def test_streamed_chat_logprobs_cover_each_delta(client: Client) -> None:
    chunks = events(stream(client, CHAT, logprobs=True, top_logprobs=1))
    for chunk in chunks[1:-1]:
        [choice] = chunk["choices"]
        tokens = [item["token"] for item in choice["logprobs"]["content"]]
        assert "".join(tokens) == choice["delta"]["content"]


# ---------------------------------------------------------------------------------- usage


@pytest.mark.parametrize("route", [CHAT, TEXT])
def test_include_usage_adds_a_final_usage_chunk(client: Client, route: str) -> None:
    chunks = events(stream(client, route, stream_options={"include_usage": True}))
    *body, final = chunks
    assert all("usage" in chunk and chunk["usage"] is None for chunk in body)
    assert final["choices"] == []
    usage = final["usage"]
    assert usage["completion_tokens"] == 12
    assert usage["total_tokens"] == usage["prompt_tokens"] + 12
    assert set(usage["prompt_tokens_details"]) == {"cached_tokens"}
    assert final["timings"]["predicted_n"] == 12


def test_usage_chunk_counts_every_prompt_and_candidate(client: Client) -> None:
    chunks = events(
        stream(
            client,
            TEXT,
            prompt=["The sea", "A mountain"],
            n=2,
            stream_options={"include_usage": True},
        )
    )
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == 4 * 12
    assert usage["prompt_tokens"] == (1 + len("The sea")) + (1 + len("A mountain"))


def test_without_include_usage_chunks_carry_no_usage(client: Client) -> None:
    assert all("usage" not in chunk for chunk in events(stream(client, CHAT)))


# --------------------------------------------------------------------------- completions


def test_streamed_completion_text_equals_the_one_shot_text(client: Client) -> None:
    expected = one_shot(client, TEXT, max_tokens=30)
    chunks = events(stream(client, TEXT, max_tokens=30))
    assert {chunk["object"] for chunk in chunks} == {"text_completion"}
    assert {chunk["id"] for chunk in chunks} == {chunks[0]["id"]}
    assert chunks[0]["id"].startswith("cmpl-")
    assert streamed_text(chunks) == expected


def test_completion_stream_ends_with_the_finish_reason(client: Client) -> None:
    chunks = events(stream(client, TEXT))
    assert chunks[-1]["choices"] == [
        {"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}
    ]


def test_streamed_prompt_list_keeps_choice_indexes(client: Client) -> None:
    prompts = ["The sea", "A mountain"]
    expected = [one_shot(client, TEXT, prompt=p) for p in prompts]
    chunks = events(stream(client, TEXT, prompt=prompts, n=2))
    streamed = [streamed_text(chunks, index) for index in range(4)]
    assert streamed == [expected[0], expected[0], expected[1], expected[1]]


def test_streamed_completion_offsets_continue_across_chunks(client: Client) -> None:
    chunks = events(stream(client, TEXT, logprobs=1))
    offsets, text = [], ""
    for chunk in chunks[:-1]:
        [choice] = chunk["choices"]
        assert choice["logprobs"]["text_offset"][0] == len(text)
        offsets += choice["logprobs"]["text_offset"]
        text += choice["text"]
    assert offsets == list(range(len(offsets)))  # one ASCII character per token


# ------------------------------------------------------------------------ text integrity

# Biases that make the greedy model write one character byte by byte: the repeat penalty
# pushes each byte down once written, so the next most biased byte follows.
CHARACTERS = {
    "é": {"195": 100, "169": 90},
    "€": {"226": 100, "130": 90, "172": 80},
}


@pytest.mark.parametrize("route", [CHAT, TEXT])
@pytest.mark.parametrize("character", sorted(CHARACTERS))
def test_multibyte_character_is_never_split_across_chunks(
    client: Client, route: str, character: str
) -> None:
    fields = {
        "logit_bias": CHARACTERS[character],
        "repeat_penalty": 10,
        "max_tokens": len(character.encode()),
    }
    sent = pieces(events(stream(client, route, **fields)))
    assert all("\ufffd" not in piece for piece in sent)
    assert "".join(sent) == character
    assert one_shot(client, route, **fields) == character


@pytest.mark.parametrize("route", [CHAT, TEXT])
def test_stop_string_never_leaks_into_the_stream(client: Client, route: str) -> None:
    full = streamed_text(events(stream(client, route, max_tokens=30)))
    stop = full[10:14]
    expected = full[: full.index(stop)]
    chunks = events(stream(client, route, max_tokens=30, stop=[stop]))
    assert streamed_text(chunks) == expected
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert one_shot(client, route, max_tokens=30, stop=[stop]) == expected


def test_held_back_stop_prefix_is_released_when_the_stop_never_comes(client: Client) -> None:
    full = streamed_text(events(stream(client, TEXT, max_tokens=30)))
    almost = full[10:13] + "#"  # its start appears in the text, the whole never does
    chunks = events(stream(client, TEXT, max_tokens=30, stop=[almost]))
    assert streamed_text(chunks) == full
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


# ------------------------------------------------------------------------------- failure


class BreakingBackend(FakeBackend):
    """Decodes `healthy_steps` batches, then fails every decode."""

    def __init__(self, healthy_steps: int) -> None:
        super().__init__()
        self.healthy_steps = healthy_steps

    def decode(self, batch: Batch) -> np.ndarray:
        if self.decode_calls >= self.healthy_steps:
            raise DecodeError("the fake model broke")
        return super().decode(batch)


def test_generation_failure_mid_stream_ends_with_an_error_event(
    serve: Callable[..., Client],
) -> None:
    client = serve(backend=BreakingBackend(healthy_steps=4))
    *tokens, last = [json.loads(payload) for payload in frames(stream(client, TEXT, max_tokens=30))]
    assert streamed_text(tokens)
    assert set(last) == {"error"}
    assert set(last["error"]) == {"message", "type", "param", "code"}
    assert last["error"]["type"] == "server_error"


def test_generation_failure_is_a_500_in_openai_shape(serve: Callable[..., Client]) -> None:
    client = serve(backend=BreakingBackend(healthy_steps=4))
    response = client.post(TEXT, json=body_for(TEXT, max_tokens=30))
    assert response.status_code == 500
    assert response.json() == {
        "error": {
            "message": response.json()["error"]["message"],
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }
    assert "failed" in response.json()["error"]["message"]


def test_reame_depends_on_uvicorns_fast_event_loop_and_http_parser() -> None:
    # uvicorn serves with uvloop and httptools only when they are installed; without them a
    # streamed token costs the event loop about half as much CPU again (docs/BENCHMARKS.md,
    # "One stream, over fresh processes"). They must come with Reame, not with another extra.
    pyproject = Path(__file__).parents[2] / "pyproject.toml"
    requirements = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    names = {re.split(r"[\s;<>=!~\[]", requirement, maxsplit=1)[0] for requirement in requirements}

    assert {"uvloop", "httptools"} <= names
