"""The OpenAI-compatible HTTP API on the fake backend: what each request field does, the
shapes of the answers, prefix reuse and sessions, health, models, metrics, CORS, OpenAPI.

Errors live in `test_server_errors.py`, Server-Sent Events in `test_server_streaming.py`.
The fake tokenizer maps byte b to token b, so a logit bias on token 120 means "x".
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from litestar import Litestar
from litestar.testing import TestClient
from prometheus_client.parser import text_string_to_metric_families

from reame_core.backend.fake import BOS, FakeBackend
from reame_core.hookspecs import hookimpl
from reame_core.plugins import PluginHost
from reame_core.runtime import Runtime, start_runtime
from reame_core.server import app as app_module
from reame_core.server.app import create_app, load_in_background
from reame_core.server.service import ServerState
from reame_core.settings import Settings

Client = TestClient[Litestar]
QUESTION = "Tell me about the sea."
STORY = "Once upon a time"


def chat(client: Client, headers: dict[str, str] | None = None, **fields: Any) -> httpx.Response:
    """POST a greedy chat request of 12 tokens; `fields` override or add to the body."""
    body = {
        "messages": [{"role": "user", "content": QUESTION}],
        "temperature": 0,
        "max_tokens": 12,
        **fields,
    }
    return client.post("/v1/chat/completions", json=body, headers=headers or {})


def complete(client: Client, prompt: Any = STORY, **fields: Any) -> httpx.Response:
    """POST a greedy text completion of 12 tokens; `fields` override or add to the body."""
    body = {"prompt": prompt, "temperature": 0, "max_tokens": 12, **fields}
    return client.post("/v1/completions", json=body)


def ok(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def reply(response: httpx.Response) -> str:
    content: str = ok(response)["choices"][0]["message"]["content"]
    return content


def text(response: httpx.Response) -> str:
    completion: str = ok(response)["choices"][0]["text"]
    return completion


# ------------------------------------------------------------------ health and loading


def test_health_answers_loading_until_the_model_is_ready(plugins: PluginHost) -> None:
    settings = Settings()
    server = ServerState(settings)
    with TestClient(create_app(server)) as client:
        loading = client.get("/health")
        server.runtime = start_runtime(settings, backend=FakeBackend(), plugins=plugins)
        try:
            ready = client.get("/health")
        finally:
            server.runtime.close()
    assert loading.status_code == 503
    assert loading.json()["status"] == "loading"
    assert ready.status_code == 200
    assert ready.json() == {"status": "ok", "model": "fake", "slots": 4}


def test_background_load_failure_is_reported_by_health() -> None:
    def broken(_: Settings) -> Any:
        raise RuntimeError("no such file: missing.gguf")

    server = ServerState(Settings())
    with TestClient(create_app(server)) as client:
        load_in_background(server, broken).join()
        health = client.get("/health")
    assert health.status_code == 503
    assert health.json() == {"status": "error", "error": "no such file: missing.gguf"}


# ------------------------------------------------------------------------------- models


def test_a_forced_exit_still_stops_the_engine_so_plugins_flush_once(
    plugins: PluginHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    flushes: list[str] = []

    class Flusher:
        @hookimpl
        def reame_shutdown(self) -> None:
            flushes.append("flushed")

    plugins.register(Flusher(), "flusher")
    started: list[Runtime] = []

    def load(server: ServerState, start: Any) -> None:
        server.runtime = start_runtime(Settings(), backend=FakeBackend(), plugins=plugins)
        started.append(server.runtime)

    def second_ctrl_c(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt  # uvicorn returns so, its own shutdown skipped

    monkeypatch.setattr(app_module, "ensure_build_runs", lambda settings: None)
    monkeypatch.setattr(app_module, "load_in_background", load)
    monkeypatch.setattr(app_module.uvicorn, "run", second_ctrl_c)

    with pytest.raises(KeyboardInterrupt):
        app_module.serve(Settings())
    after_exit = list(flushes)
    started[0].close()  # as the graceful path's shutdown would: nothing runs twice

    assert after_exit == ["flushed"]
    assert flushes == ["flushed"]


def test_models_lists_the_one_served_model(client: Client) -> None:
    body = ok(client.get("/v1/models"))
    assert body["object"] == "list"
    [model] = body["data"]
    assert model["id"] == "fake"
    assert model["object"] == "model"
    assert model["meta"]["fim"] is True


@pytest.mark.parametrize("route", ["chat", "text"])
def test_model_field_naming_the_served_model_is_accepted(client: Client, route: str) -> None:
    response = chat(client, model="fake") if route == "chat" else complete(client, model="fake")
    assert ok(response)["model"] == "fake"


# ----------------------------------------------------------------------- response shapes


def test_chat_completion_has_openai_shape(client: Client) -> None:
    before = int(time.time())
    body = ok(chat(client))
    assert body["id"].startswith("chatcmpl-")
    assert body["object"] == "chat.completion"
    assert isinstance(body["created"], int) and before <= body["created"] <= time.time() + 1
    assert body["model"] == "fake"
    [choice] = body["choices"]
    assert set(choice) == {"index", "message", "logprobs", "finish_reason"}
    assert choice["index"] == 0
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str) and choice["message"]["content"]
    assert choice["logprobs"] is None
    assert choice["finish_reason"] == "length"


def test_text_completion_has_openai_shape(client: Client) -> None:
    body = ok(complete(client))
    assert body["id"].startswith("cmpl-")
    assert body["object"] == "text_completion"
    assert isinstance(body["created"], int)
    assert body["model"] == "fake"
    [choice] = body["choices"]
    assert set(choice) == {"index", "text", "logprobs", "finish_reason"}
    assert choice["index"] == 0 and choice["text"] and choice["finish_reason"] == "length"


def test_usage_and_timings_count_prompt_and_completion(client: Client) -> None:
    body = ok(complete(client, max_tokens=7))
    prompt_tokens = 1 + len(STORY)  # BOS, then one token per byte
    assert body["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 7,
        "total_tokens": prompt_tokens + 7,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    timings = body["timings"]
    assert timings["prompt_n"] == prompt_tokens
    assert timings["cached_n"] == 0
    assert timings["predicted_n"] == 7
    assert timings["prompt_ms"] >= 0 and timings["predicted_ms"] >= 0


def test_identical_request_reuses_the_cached_prefix(client: Client) -> None:
    first = ok(chat(client))
    second = ok(chat(client))
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert (
        second["timings"]["cached_n"] == second["usage"]["prompt_tokens_details"]["cached_tokens"]
    )
    assert second["timings"]["prompt_n"] < first["timings"]["prompt_n"]
    assert second["choices"][0]["message"] == first["choices"][0]["message"]


# ----------------------------------------------------------------------------- messages


def test_text_parts_are_read_like_string_content(client: Client) -> None:
    parts = [{"type": "text", "text": "Tell me "}, {"type": "text", "text": "about the sea."}]
    as_parts = ok(chat(client, messages=[{"role": "user", "content": parts}]))
    as_string = ok(chat(client, messages=[{"role": "user", "content": QUESTION}]))
    assert as_parts["usage"]["prompt_tokens"] == as_string["usage"]["prompt_tokens"]
    assert as_parts["choices"][0]["message"] == as_string["choices"][0]["message"]


def test_developer_role_is_read_as_system(serve: Callable[..., Client]) -> None:
    backend = FakeBackend(context=64)  # the reply depends on the whole short prompt
    client = serve(backend=backend)
    user = {"role": "user", "content": QUESTION}
    as_developer = reply(
        chat(client, messages=[{"role": "developer", "content": "Be brief."}, user])
    )
    as_system = reply(chat(client, messages=[{"role": "system", "content": "Be brief."}, user]))
    plain = reply(chat(client, messages=[user]))
    assert as_developer == as_system != plain


# -------------------------------------------------------------------------------- prompt


def test_token_id_prompt_equals_its_text(client: Client) -> None:
    ids = [BOS, *STORY.encode()]
    assert text(complete(client, prompt=ids)) == text(complete(client, prompt=STORY))


def test_prompt_list_gives_n_choices_per_prompt_in_order(client: Client) -> None:
    prompts = ["The sea", "A mountain"]
    body = ok(complete(client, prompt=prompts, n=2))
    singles = [text(complete(client, prompt=p)) for p in prompts]
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    # choice index = prompt_index * n + candidate; greedy candidates are identical.
    assert [c["text"] for c in body["choices"]] == [singles[0]] * 2 + [singles[1]] * 2
    assert body["usage"]["completion_tokens"] == 4 * 12


def test_list_of_token_id_lists_gives_one_choice_each(client: Client) -> None:
    prompts = [[BOS, *b"The sea"], [BOS, *b"A mountain"]]
    body = ok(complete(client, prompt=prompts))
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["choices"][0]["text"] == text(complete(client, prompt="The sea"))
    assert body["choices"][1]["text"] == text(complete(client, prompt="A mountain"))


# ------------------------------------------------------------------------ length limits


def test_max_tokens_ends_with_finish_reason_length(client: Client) -> None:
    body = ok(complete(client, max_tokens=5))
    assert body["usage"]["completion_tokens"] == 5
    assert body["choices"][0]["finish_reason"] == "length"


def test_text_completion_defaults_to_16_tokens(client: Client) -> None:
    body = ok(client.post("/v1/completions", json={"prompt": STORY, "temperature": 0}))
    assert body["usage"]["completion_tokens"] == 16


def test_max_completion_tokens_wins_over_max_tokens(client: Client) -> None:
    body = ok(chat(client, max_tokens=10, max_completion_tokens=4))
    assert body["usage"]["completion_tokens"] == 4
    assert body["choices"][0]["finish_reason"] == "length"


# ---------------------------------------------------------------------------- sampling


def test_temperature_zero_is_repeatable(client: Client) -> None:
    assert reply(chat(client, max_tokens=30)) == reply(chat(client, max_tokens=30))


def test_same_seed_samples_the_same_text(client: Client) -> None:
    first = text(complete(client, temperature=1, seed=7, max_tokens=30))
    again = text(complete(client, temperature=1, seed=7, max_tokens=30))
    other = text(complete(client, temperature=1, seed=8, max_tokens=30))
    assert first == again != other


@pytest.mark.parametrize("cut", [{"top_k": 1}, {"top_p": 0.01}, {"min_p": 0.99}])
def test_tight_cut_samples_the_greedy_text(client: Client, cut: dict[str, float]) -> None:
    greedy = text(complete(client, max_tokens=30))
    hot = text(complete(client, temperature=1.5, seed=3, max_tokens=30))
    cut_hot = text(complete(client, temperature=1.5, seed=3, max_tokens=30, **cut))
    assert cut_hot == greedy != hot


@pytest.mark.parametrize(
    "penalty", [{"presence_penalty": 2.0}, {"frequency_penalty": 2.0}, {"repeat_penalty": 1.5}]
)
def test_penalty_changes_the_greedy_text(client: Client, penalty: dict[str, float]) -> None:
    plain = text(complete(client, max_tokens=40))
    penalized = text(complete(client, max_tokens=40, **penalty))
    assert penalized != plain


def test_strong_logit_bias_forces_a_token(client: Client) -> None:
    assert text(complete(client, logit_bias={"120": 100})) == "x" * 12


def test_n_returns_that_many_choices(client: Client) -> None:
    body = ok(chat(client, n=2))
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["choices"][0]["message"] == body["choices"][1]["message"]
    assert body["usage"]["completion_tokens"] == 2 * 12


# --------------------------------------------------------------------------- stopping


def test_stop_string_cuts_the_text(client: Client) -> None:
    full = text(complete(client, max_tokens=30))
    stop = full[10:13]
    body = ok(complete(client, max_tokens=30, stop=stop))
    assert body["choices"][0]["text"] == full[: full.index(stop)]
    assert body["choices"][0]["finish_reason"] == "stop"


def test_earliest_of_several_stop_strings_wins(client: Client) -> None:
    full = text(complete(client, max_tokens=30))
    stops = [full[20:23], full[8:11]]
    cut = min(full.index(s) for s in stops)
    assert text(complete(client, max_tokens=30, stop=stops)) == full[:cut]


def test_ignore_eos_generates_past_the_end_of_text(serve: Callable[..., Client]) -> None:
    client = serve(backend=FakeBackend(eos_every=2))  # the model ends right after "abc"
    ending = ok(complete(client, prompt="abc", max_tokens=10))
    forced = ok(complete(client, prompt="abc", max_tokens=10, ignore_eos=True))
    assert ending["choices"][0]["finish_reason"] == "stop"
    assert ending["usage"]["completion_tokens"] < 10
    assert forced["choices"][0]["finish_reason"] == "length"
    assert forced["usage"]["completion_tokens"] == 10


# --------------------------------------------------------------------------- logprobs


def test_chat_logprobs_describe_each_token(client: Client) -> None:
    body = ok(chat(client, max_tokens=4, logprobs=True, top_logprobs=2))
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == 4
    for item in content:
        assert set(item) == {"token", "logprob", "bytes", "top_logprobs"}
        assert bytes(item["bytes"]).decode() == item["token"]
        assert item["logprob"] <= 0
        assert len(item["top_logprobs"]) == 2
        assert set(item["top_logprobs"][0]) == {"token", "logprob", "bytes"}
        # Greedy: the chosen token is the most likely one.
        assert item["top_logprobs"][0]["token"] == item["token"]
    assert "".join(i["token"] for i in content) == body["choices"][0]["message"]["content"]


def test_chat_logprobs_without_top_logprobs_list_no_alternatives(client: Client) -> None:
    content = ok(chat(client, max_tokens=3, logprobs=True))["choices"][0]["logprobs"]["content"]
    assert [item["top_logprobs"] for item in content] == [[], [], []]


def test_completion_logprobs_have_tokens_offsets_and_alternatives(client: Client) -> None:
    choice = ok(complete(client, max_tokens=5, logprobs=2))["choices"][0]
    logprobs = choice["logprobs"]
    assert set(logprobs) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert "".join(logprobs["tokens"]) == choice["text"]
    assert len(logprobs["token_logprobs"]) == 5
    assert all(lp <= 0 for lp in logprobs["token_logprobs"])
    assert [len(top) for top in logprobs["top_logprobs"]] == [2] * 5
    assert logprobs["text_offset"] == [
        sum(len(t) for t in logprobs["tokens"][:i]) for i in range(5)
    ]


# -------------------------------------------------- fields that cannot change the output


def test_user_and_metadata_are_accepted_without_effect(client: Client) -> None:
    tagged = reply(chat(client, user="user-42", metadata={"team": "search"}))
    assert tagged == reply(chat(client))


def test_response_format_text_is_accepted(client: Client) -> None:
    assert reply(chat(client, response_format={"type": "text"})) == reply(chat(client))


# ------------------------------------------------------------------- fill in the middle


def test_suffix_builds_a_fill_in_the_middle_prompt(client: Client) -> None:
    prefix, suffix = "def add(a, b):\n", "\n    return total\n"
    body = ok(complete(client, prompt=prefix, suffix=suffix, max_tokens=4))
    # BOS, FIM_PRE, prefix bytes, FIM_SUF, suffix bytes, FIM_MID.
    assert body["usage"]["prompt_tokens"] == 1 + 3 + len(prefix) + len(suffix)
    assert text(complete(client, prompt=prefix, suffix=suffix)) != text(
        complete(client, prompt=prefix)
    )


def test_suffix_on_a_model_without_fim_tokens_is_refused(serve: Callable[..., Client]) -> None:
    backend = FakeBackend()
    backend._info = dataclasses.replace(backend.info, fim=None)
    client = serve(backend=backend)
    response = complete(client, prompt="def f(", suffix="return x")
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "suffix"


# ------------------------------------------------------------------------------ sessions

CONVERSATION = ("Tell me about the sea.", "And the mountains?", "Which one is older?")
# ChatML around one more user turn, plus the previous reply's last token (never decoded).
TURN_FRAMING = 24


def run_conversation(client: Client, session: str, via: str = "header") -> list[Any]:
    """Ask CONVERSATION turn by turn in `session`, feeding each reply back; returns the
    bodies. The session goes in the X-Session-ID header or, with `via="body"`, the body."""
    messages: list[dict[str, str]] = []
    bodies = []
    for question in CONVERSATION:
        messages.append({"role": "user", "content": question})
        if via == "header":
            response = chat(client, messages=messages, headers={"X-Session-ID": session})
        else:
            response = chat(client, messages=messages, session_id=session)
        body = ok(response)
        bodies.append(body)
        messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
    return bodies


@pytest.mark.parametrize("via", ["header", "body"])
def test_session_turn_computes_only_the_new_message(serve: Callable[..., Client], via: str) -> None:
    client = serve(backend=FakeBackend(context=48))
    bodies = run_conversation(client, "conversation-1", via)
    for turn in (1, 2):
        usage, timings = bodies[turn]["usage"], bodies[turn]["timings"]
        previous_prompt = bodies[turn - 1]["usage"]["prompt_tokens"]
        assert usage["prompt_tokens_details"]["cached_tokens"] >= previous_prompt
        assert timings["prompt_n"] <= len(CONVERSATION[turn].encode()) + TURN_FRAMING
        assert timings["prompt_n"] < usage["prompt_tokens"] / 2


def test_session_replies_equal_cold_replies(serve: Callable[..., Client]) -> None:
    # With a long model context the reply depends on the KV the session reused.
    warm = run_conversation(serve(backend=FakeBackend(context=48)), "conversation-1")
    messages: list[dict[str, str]] = []
    for question, body in zip(CONVERSATION, warm, strict=True):
        messages.append({"role": "user", "content": question})
        cold_client = serve(backend=FakeBackend(context=48))
        cold = ok(chat(cold_client, messages=list(messages)))
        assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert cold["choices"][0]["message"] == body["choices"][0]["message"]
        messages.append(body["choices"][0]["message"])


def test_session_keeps_its_kv_through_other_traffic(serve: Callable[..., Client]) -> None:
    client = serve(backend=FakeBackend(n_seq_max=2))
    session = {"X-Session-ID": "conversation-1"}
    first = ok(chat(client, headers=session))
    for other in ("Something else entirely.", "Another topic here.", "A third question."):
        ok(chat(client, messages=[{"role": "user", "content": other}]))
    messages = [
        {"role": "user", "content": QUESTION},
        first["choices"][0]["message"],
        {"role": "user", "content": "More?"},
    ]
    second = ok(chat(client, messages=messages, headers=session))
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= first["usage"]["prompt_tokens"]


# ------------------------------------------------------------------------------- metrics

SERIES = (
    "reame_requests_total",
    "reame_time_to_first_token_seconds_count",
    "reame_inter_token_latency_seconds_count",
    "reame_prompt_tokens_total",
    "reame_completion_tokens_total",
    "reame_recalled_requests_total",
    "reame_queue_depth",
    "reame_active_sequences",
    "reame_decode_steps_total",
    "reame_batch_tokens_total",
    "reame_filler_rows_total",
)


def scrape(client: Client) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_metrics_expose_every_documented_series(client: Client) -> None:
    ok(complete(client))
    samples = scrape(client)
    assert set(SERIES) <= {name for name, _ in samples}
    assert value(samples, "reame_prompt_tokens_total", kind="computed") > 0
    assert ("reame_prompt_tokens_total", frozenset({("kind", "reused")})) in samples


def test_metrics_move_after_a_request(client: Client) -> None:
    before = scrape(client)
    body = ok(complete(client, max_tokens=5))
    after = scrape(client)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("reame_requests_total", route="/v1/completions", status="200") == 1
    assert delta("reame_completion_tokens_total") == 5
    assert delta("reame_prompt_tokens_total", kind="computed") == body["timings"]["prompt_n"]
    assert delta("reame_time_to_first_token_seconds_count") == 1
    assert delta("reame_inter_token_latency_seconds_count") > 0
    assert delta("reame_decode_steps_total") > 0
    assert delta("reame_batch_tokens_total") >= body["usage"]["prompt_tokens"]


def test_metrics_count_reused_prompt_tokens(client: Client) -> None:
    ok(chat(client))
    before = scrape(client)
    cached = ok(chat(client))["usage"]["prompt_tokens_details"]["cached_tokens"]
    after = scrape(client)
    reused = value(after, "reame_prompt_tokens_total", kind="reused") - value(
        before, "reame_prompt_tokens_total", kind="reused"
    )
    assert cached > 0
    assert reused == cached


def test_idle_server_reports_no_active_sequences(client: Client) -> None:
    ok(complete(client))
    samples = scrape(client)
    assert value(samples, "reame_active_sequences") == 0
    assert value(samples, "reame_queue_depth") == 0


def test_unknown_paths_share_one_metrics_label(client: Client) -> None:
    # A scanner must not be able to create one time series per URL it tries.
    for path in ("/scan-1", "/scan-2", "/wp-admin/setup.php"):
        client.get(path)
    routes = {dict(labels).get("route") for _, labels in scrape(client)}
    assert not routes & {"/scan-1", "/scan-2", "/wp-admin/setup.php"}


# ---------------------------------------------------------------------- CORS and OpenAPI


def test_cors_preflight_allows_a_configured_origin(serve: Callable[..., Client]) -> None:
    client = serve(Settings(cors_origins=["https://a.example"], api_keys=["k1"]))
    response = client.options(
        "/v1/chat/completions",
        headers={
            "Origin": "https://a.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )
    assert response.status_code in (200, 204)
    assert response.headers["access-control-allow-origin"] == "https://a.example"


def test_cors_is_off_without_configured_origins(client: Client) -> None:
    response = client.get("/v1/models", headers={"Origin": "https://a.example"})
    assert response.status_code == 200
    assert "access-control-allow-origin" not in response.headers


def test_openapi_schema_describes_the_api(serve: Callable[..., Client]) -> None:
    client = serve(Settings(api_keys=["k1"]))
    response = client.get("/schema/openapi.json", headers={"Authorization": "Bearer k1"})
    schema = ok(response)
    assert schema["openapi"].startswith("3.")
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models"} <= set(schema["paths"])


# --------------------------------------------------------------------------- speculation


ECHO = {
    "text": "The cat sat on",  # greedy: " c prljtrt c prljtrt c prljtrt..."
    "chat": [{"role": "user", "content": "The cat sat on"}],
}


def generate(client: Client, route: str, **fields: Any) -> httpx.Response:
    return chat(client, **fields) if route == "chat" else complete(client, **fields)


def prompt_lookup_report(client: Client) -> dict[str, Any]:
    sources = ok(client.get("/speculation"))["sources"]
    found: dict[str, Any] = next(s for s in sources if s["source"] == "prompt_lookup")
    return found


@pytest.mark.parametrize("route", ["chat", "text"])
def test_speculate_on_verifies_prompt_lookup_drafts(
    serve: Callable[..., TestClient[Litestar]], route: str
) -> None:
    # The fake model's tokens are single bytes: short matches are let through.
    client = serve(Settings(plugins={"prompt_lookup": {"match_bytes_min": 0}}))
    answer = reply if route == "chat" else text
    # The fake model soon repeats itself, so prompt lookup always has a guess.
    fields = {"max_tokens": 40, "prompt" if route == "text" else "messages": ECHO[route]}

    speculating = generate(client, route, speculate="on", **fields)

    drafts = ok(speculating)["timings"]["drafts"]["prompt_lookup"]
    assert drafts["proposed"] > 0
    report = prompt_lookup_report(client)
    assert report["drafts"] > 0
    assert report["probes"] == 0  # every draft is verified: nothing is left to probe
    plain = generate(client, route, speculate="off", **fields)
    assert answer(speculating) == answer(plain)  # greedy: drafts change nothing


@pytest.mark.parametrize("route", ["chat", "text"])
def test_speculate_off_never_asks_for_drafts(client: Client, route: str) -> None:
    fields = {"max_tokens": 40, "prompt" if route == "text" else "messages": ECHO[route]}

    body = ok(generate(client, route, speculate="off", **fields))

    assert "drafts" not in body["timings"] and "draft_n" not in body["timings"]
    report = prompt_lookup_report(client)
    assert (report["proposed"], report["probes"], report["drafts"]) == (0, 0, 0)


@pytest.mark.parametrize("route", ["chat", "text"])
def test_speculate_auto_lets_the_governor_probe(client: Client, route: str) -> None:
    answer = reply if route == "chat" else text
    fields = {"max_tokens": 40, "prompt" if route == "text" else "messages": ECHO[route]}

    governed = generate(client, route, speculate="auto", **fields)

    # A request's first steps probe every source; on the cost-free fake model drafting
    # never pays, so the governor verifies little or nothing after that.
    assert prompt_lookup_report(client)["probes"] > 0
    assert answer(governed) == answer(generate(client, route, speculate="off", **fields))


@pytest.mark.parametrize("value", ["sometimes", True])
@pytest.mark.parametrize("route", ["chat", "text"])
def test_speculate_field_refuses_other_values_naming_the_field(
    client: Client, route: str, value: Any
) -> None:
    response = generate(client, route, speculate=value)

    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == "speculate"
    assert "speculate" in error["message"]
