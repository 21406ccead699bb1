"""A real `reame serve` process on the embedded model, driven by the official openai client."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from served import reame_serve

API_KEY = "test-key-123"


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    # Speculation off: several tests compare answers bit for bit, which this build
    # guarantees without it (see runtime.determinism_note); requests may turn it on.
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
        prompt="The capital of France is",
        max_tokens=8,
        n=2,
        temperature=0.9,
        seed=7,
    )
    assert [choice.index for choice in reply.choices] == [0, 1]
    assert all(choice.text for choice in reply.choices)


def test_seed_makes_sampling_reproducible(client: openai.OpenAI) -> None:
    first = _chat(client, "Tell me a word.", max_tokens=12, temperature=1.0, seed=1234)
    second = _chat(client, "Tell me a word.", max_tokens=12, temperature=1.0, seed=1234)
    assert first == second


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
    def ask(question: str) -> str:
        return _chat(client, question, max_tokens=32, temperature=0)

    serial = [ask(question) for question in questions]
    with ThreadPoolExecutor(max_workers=8) as pool:
        concurrent = list(pool.map(ask, questions))
    assert concurrent == serial


def test_a_request_can_turn_speculation_on(client: openai.OpenAI) -> None:
    text = "The cat sat on the mat. The dog sat on the log. The bird sat on the branch."
    reply = client.chat.completions.create(
        model="smollm2-135m",
        messages=[{"role": "user", "content": f"Repeat exactly: {text}"}],
        max_tokens=40,
        temperature=0,
        extra_body={"speculate": "on"},
    )

    drafts = reply.model_extra["timings"]["drafts"]  # type: ignore[index]
    assert drafts["prompt_lookup"]["proposed"] > 0
    assert drafts["prompt_lookup"]["accepted"] > 0


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
