"""A real `reame serve` process on the embedded model, driven by the official openai client."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import pytest
from served import reame_serve

API_KEY = "test-key-123"


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    # Speculation off: several tests compare answers bit for bit, which every build
    # guarantees without it (with it, only where the server's check finds verifying drafts
    # exact: runtime.determinism_note); requests may turn it on.
    with reame_serve(
        "--parallel", "8", "--ctx", "1024", "--threads", "2", "--api-key", API_KEY,
        "--speculate", "off",
    ) as url:  # fmt: skip
        yield url


@pytest.fixture
def client(server_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server_url}/v1", api_key=API_KEY, max_retries=0)


def _chat(client: openai.OpenAI, question: str, **options: object) -> str:
    reply = client.chat.completions.create(
        model="smollm2-135m",
        messages=[{"role": "user", "content": question}],
        **options,  # type: ignore[arg-type]
    )
    return reply.choices[0].message.content or ""


@dataclass
class Streamed:
    """The content pieces of one stream, and when its first and last arrived."""

    pieces: list[str] = field(default_factory=list)
    first: float = 0.0
    last: float = 0.0

    def add(self, piece: str) -> None:
        self.last = time.monotonic()
        self.first = self.first or self.last
        self.pieces.append(piece)

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    assert [model.id for model in client.models.list()] == ["smollm2-135m"]


def test_chat_completion_answers_with_usage_and_timings(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="smollm2-135m",
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=16,
        temperature=0,
    )
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage is not None and reply.usage.completion_tokens > 0
    timings = reply.model_extra["timings"]  # type: ignore[index]
    assert timings["predicted_n"] == reply.usage.completion_tokens


def test_streamed_chat_equals_the_unstreamed_answer(client: openai.OpenAI) -> None:
    plain = _chat(client, "Describe a cat.", max_tokens=32, temperature=0)
    chunks = client.chat.completions.create(
        model="smollm2-135m",
        messages=[{"role": "user", "content": "Describe a cat."}],
        max_tokens=32,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"palimpsest": False},  # computed, not recalled from the answer above
    )
    text, usage = "", None
    for chunk in chunks:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage is not None:
            usage = chunk.usage
    assert text == plain
    assert usage is not None and usage.completion_tokens > 0


def test_text_completion_and_two_candidates(client: openai.OpenAI) -> None:
    reply = client.completions.create(
        model="smollm2-135m",
        prompt="Once upon a time",
        max_tokens=16,
        n=2,
        temperature=1.2,
        seed=7,
    )
    assert [choice.index for choice in reply.choices] == [0, 1]
    first, second = (choice.text for choice in reply.choices)
    assert first and second
    assert first != second  # candidate i samples with seed + i


def test_seed_makes_sampling_reproducible(client: openai.OpenAI) -> None:
    computed = {"extra_body": {"palimpsest": False}}  # sampled each time, not recalled
    first = _chat(client, "Tell me a word.", max_tokens=12, temperature=1.0, seed=1234, **computed)
    second = _chat(client, "Tell me a word.", max_tokens=12, temperature=1.0, seed=1234, **computed)
    other = _chat(client, "Tell me a word.", max_tokens=12, temperature=1.0, seed=4321, **computed)
    assert first == second
    assert other != first


def test_stop_string_cuts_the_answer(client: openai.OpenAI) -> None:
    plain = _chat(client, "Count from one to ten in words.", max_tokens=40, temperature=0)
    words = plain.split()
    assert len(words) > 2, plain
    stop = words[2]
    cut = _chat(
        client, "Count from one to ten in words.", max_tokens=40, temperature=0, stop=[stop]
    )
    assert cut == plain[: plain.index(stop)]


def test_logprobs_come_back_for_each_token(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="smollm2-135m",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = reply.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content and len(content) == reply.usage.completion_tokens  # type: ignore[union-attr]
    for item in content:
        assert item.logprob <= 0.0
        assert len(item.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert item.logprob == pytest.approx(max(t.logprob for t in item.top_logprobs))


def test_eight_concurrent_streams_equal_serial_answers(
    questions: tuple[str, ...], client: openai.OpenAI
) -> None:
    # Computed both times: the streams would otherwise be recalled from the serial answers.
    computed = {"palimpsest": False}
    serial = [
        _chat(client, question, max_tokens=32, temperature=0, extra_body=computed)
        for question in questions
    ]
    together = threading.Barrier(len(questions))

    def stream(question: str) -> Streamed:
        together.wait()
        chunks = client.chat.completions.create(
            model="smollm2-135m",
            messages=[{"role": "user", "content": question}],
            max_tokens=32,
            temperature=0,
            stream=True,
            extra_body=computed,
        )
        streamed = Streamed()
        for chunk in chunks:
            if chunk.choices and chunk.choices[0].delta.content:
                streamed.add(chunk.choices[0].delta.content)
        return streamed

    with ThreadPoolExecutor(max_workers=len(questions)) as pool:
        streams = list(pool.map(stream, questions))

    assert [stream.text for stream in streams] == serial
    assert all(len(stream.pieces) > 1 for stream in streams)  # piece by piece, not at once
    # They ran together: when the last stream's first piece came, most others were still on.
    last_start = max(stream.first for stream in streams)
    running = sum(stream.first <= last_start <= stream.last for stream in streams)
    assert running >= len(questions) // 2


REPETITIVE = "The cat sat on the mat. The dog sat on the log. The bird sat on the branch."


def _repeat(client: openai.OpenAI, **options: object) -> tuple[str, dict[str, Any]]:
    reply = client.chat.completions.create(
        model="smollm2-135m",
        messages=[{"role": "user", "content": f"Repeat exactly: {REPETITIVE}"}],
        max_tokens=40,
        temperature=0,
        **options,  # type: ignore[arg-type]
    )
    timings: dict[str, Any] = reply.model_extra["timings"]  # type: ignore[index]
    return reply.choices[0].message.content or "", timings


def test_a_request_can_turn_speculation_on(client: openai.OpenAI) -> None:
    _, on = _repeat(client, extra_body={"speculate": "on"})
    _, off = _repeat(client)  # the server's setting: off

    drafts = on["drafts"]["prompt_lookup"]
    assert drafts["proposed"] > 0
    assert drafts["accepted"] > 0
    assert "drafts" not in off


def test_the_default_governor_weighs_prompt_lookup_where_text_repeats() -> None:
    """Whether `auto` verifies drafts depends on the decode costs it measures, which a busy
    host changes (a quiet one verified 21 and accepted 18 here); that it asked prompt
    lookup, judged its drafts and accounted for what it verified does not. Speculation on,
    the server checked at start whether verifying drafts is exact for the model here, and
    says which."""
    with reame_serve("--parallel", "2", "--ctx", "1024", "--threads", "2") as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        _, timings = _repeat(client)
        report = httpx.get(f"{url}/speculation").json()
        guarantees = httpx.get(f"{url}/status").json()["guarantees"]

    assert report["mode"] == "auto"
    lookup = next(source for source in report["sources"] if source["source"] == "prompt_lookup")
    assert lookup["drafts"] + lookup["shadow_drafts"] > 0, lookup
    verified = timings.get("drafts", {}).get("prompt_lookup", {"proposed": 0, "accepted": 0})
    assert (lookup["proposed"], lookup["accepted"]) == (verified["proposed"], verified["accepted"])
    assert "checked for this model, build and CPU" in guarantees


def test_requests_without_the_key_are_refused(server_url: str) -> None:
    anonymous = openai.OpenAI(base_url=f"{server_url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as refused:
        anonymous.models.list()
    assert refused.value.status_code == 401
    assert httpx.get(f"{server_url}/health").status_code == 200


def test_bad_request_is_an_openai_error_and_the_server_keeps_serving(
    client: openai.OpenAI,
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="smollm2-135m", messages=[{"role": "user", "content": "x"}], max_tokens=10**6
        )
    assert refused.value.code == "context_length_exceeded"
    assert _chat(client, "Hi", max_tokens=4, temperature=0)
