"""`reame bench --against URL`: the HTTP workloads sent to Reame's server and to another
OpenAI-compatible one, alternating. Reame here is the real app on the fake backend, served
on a socket; the other server is a stub that streams as llama-server does."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from openai_stub import StubOpenAI

from reame_core.backend.fake import FakeBackend
from reame_core.bench.against import Server, normalized, stream_completion, with_model
from reame_core.bench.trace import trace_for
from reame_core.bench.trial import Sample
from reame_core.bench.workloads import BY_NAME, Arm, Workload
from reame_core.cli.bench import against_rows
from reame_core.plugins import PluginHost
from reame_core.runtime import start_runtime
from reame_core.server.app import create_app
from reame_core.server.service import ServerState
from reame_core.settings import Settings


@contextmanager
def reame_on_fake_backend() -> Iterator[str]:
    """Reame's HTTP app over a fake backend, on a free port; yields its base URL."""
    settings = Settings()
    state = ServerState(settings)
    state.runtime = start_runtime(
        settings, backend=FakeBackend(n_seq_max=4), plugins=PluginHost(discover=False)
    )
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    server = uvicorn.Server(
        uvicorn.Config(create_app(state), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the app did not start"
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_a_url_is_taken_with_or_without_v1() -> None:
    assert normalized("http://host:8081/v1/") == "http://host:8081"
    assert normalized("http://host:8081") == "http://host:8081"
    assert normalized("https://host/api/v1") == "https://host/api"


def test_the_model_id_comes_from_the_servers_model_list() -> None:
    with StubOpenAI(model="qwen2.5-1.5b").serving() as url:
        assert with_model(Server(normalized(url))).model == "qwen2.5-1.5b"


def test_a_server_without_a_model_list_is_sent_no_model() -> None:
    stub = StubOpenAI(model=None)
    with stub.serving() as url:
        server = with_model(Server(normalized(url)))
        stream_completion(server, "Hello", 3)
    assert server.model is None
    assert "model" not in stub.bodies[0]


def test_tokens_are_counted_from_usage_or_else_from_chunks() -> None:
    for usage in (True, False):
        with StubOpenAI(usage=usage).serving() as url:
            streamed = stream_completion(Server(normalized(url)), "Hello", 7)
        assert streamed.tokens == 7
        assert streamed.text.startswith("w0 w1 ")
        assert 0 < streamed.first_token_s <= streamed.seconds


def test_every_request_asks_for_the_same_greedy_tokens_as_reames() -> None:
    stub = StubOpenAI()
    with stub.serving() as url:
        stream_completion(with_model(Server(normalized(url))), "Hello", 5)
    body = stub.bodies[0]
    assert body["model"] == "stub-model"
    assert (body["max_tokens"], body["temperature"], body["ignore_eos"], body["stream"]) == (
        5, 0, True, True
    )  # fmt: skip


def test_against_rows_compare_reame_with_the_other_server_in_both_http_workloads() -> None:
    stub = StubOpenAI()
    workloads = [BY_NAME["decode"], BY_NAME["streams"]]
    with stub.serving() as other_url, reame_on_fake_backend() as reame_url:
        other = with_model(Server(normalized(other_url)))
        reame = with_model(Server(reame_url))
        rows = against_rows(reame, other, workloads, 2, quick=True)
    assert [row.workload for row in rows] == ["decode@http", "streams@http"]
    for row in rows:
        assert row.failed is None, row.failed
        assert row.server == other.url
        assert row.reps == 2 and row.ratio is not None and len(row.ratio_by_rep) == 2
        assert row.baseline_value is not None and row.baseline_value > 0
        assert other.url in row.baseline
    decode, streams = BY_NAME["decode"].quick, BY_NAME["streams"].quick
    # one warm-up, then each rep: one stream for decode, all of streams' at once
    assert len(stub.bodies) == 1 + 2 * decode.requests + 2 * streams.requests
    assert sorted(b["max_tokens"] for b in stub.bodies[1:]) == sorted(
        [decode.tokens] * 2 * decode.requests + [streams.tokens] * 2 * streams.requests
    )


def test_the_trace_over_http_replays_on_a_fresh_reame_and_on_the_other_server() -> None:
    trace = BY_NAME["trace"]
    stub = StubOpenAI(answer=lambda body: "one two three")
    features: list[tuple[str, Arm, int]] = []

    def fresh_reame(workload: Workload, arm: Arm, rep: int, scratch: str) -> Sample:
        features.append((workload.name, arm, rep))
        return Sample(10.0, 30, 3.0, "digest")

    with stub.serving() as other_url, reame_on_fake_backend() as reame_url:
        other = with_model(Server(normalized(other_url)))
        (row,) = against_rows(
            Server(reame_url),
            other,
            [trace],
            2,
            quick=True,
            trace_feature=fresh_reame,
            count=lambda text: len(text.split()),
        )
    assert row.failed is None, row.failed
    assert row.workload == "trace@http" and row.server == other.url
    assert features == [("trace", "A", 0), ("trace", "A", 1)]
    replayed = len(trace_for(trace.quick.requests, trace.quick.tokens))
    chats = [body for body in stub.bodies if "messages" in body]
    assert len(chats) == 2 * (1 + replayed)  # a warm-up, then the trace, each repetition
    assert row.baseline_value is not None and row.baseline_value > 0
    assert row.identical is None  # another server's answers are not Reame's
