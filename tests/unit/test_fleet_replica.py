"""A fleet replica answers forwarded requests with the `reame serve` application itself:
same bodies, same streams, same errors, plus the replica's name (fake backend, no Ray)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import TestClient

from reame_core.backend.fake import FakeBackend
from reame_core.fleet.affinity import CHUNK_CHARS, prefix_chain
from reame_core.fleet.forwarding import (
    REPLICA_HEADER,
    ForwardedRequest,
    ReplyStart,
    exchange,
    forwarded,
)
from reame_core.fleet.replica import REPORTED_FINISHED, ReameReplica, ServedPrefixes
from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import ModelInfo
from reame_core.plugins import PluginHost
from reame_core.runtime import start_runtime

CHAT = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8, "temperature": 0}


@pytest.fixture
def replica() -> Iterator[ReameReplica]:
    start = partial(start_runtime, backend=FakeBackend(), plugins=PluginHost(discover=False))
    replica = ReameReplica({}, name="replica-a", start=start)
    yield replica
    replica.__del__()


def ask(
    replica: ReameReplica, path: str, body: dict[str, Any] | None = None, **headers: str
) -> tuple[ReplyStart, bytes]:
    raw = json.dumps(body).encode() if body is not None else b""
    header_list = [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
    request = forwarded("POST" if body is not None else "GET", path, b"", header_list, raw)

    async def collect() -> tuple[ReplyStart, bytes]:
        parts = [part async for part in replica(request)]
        start = parts[0]
        assert isinstance(start, ReplyStart)
        return start, b"".join(p for p in parts[1:] if isinstance(p, bytes))

    return asyncio.run(collect())


def test_a_forwarded_completion_gets_the_single_servers_answer(
    replica: ReameReplica, client: TestClient[Litestar]
) -> None:
    start, body = ask(replica, "/v1/chat/completions", CHAT)
    direct = client.post("/v1/chat/completions", json=CHAT).json()
    answer = json.loads(body)
    assert start.status == 200
    assert answer["choices"] == direct["choices"]
    assert (REPLICA_HEADER.encode(), b"replica-a") in start.headers


def test_a_forwarded_stream_arrives_as_the_same_events(
    replica: ReameReplica, client: TestClient[Litestar]
) -> None:
    body = {**CHAT, "stream": True}
    start, raw = ask(replica, "/v1/chat/completions", body)
    direct = client.post("/v1/chat/completions", json=body).content
    assert start.status == 200
    assert dict(start.headers)[b"content-type"].startswith(b"text/event-stream")

    def texts(stream: bytes) -> list[str]:
        events = [line[6:] for line in stream.split(b"\n") if line.startswith(b"data: ")]
        chunks = [json.loads(e) for e in events if e != b"[DONE]"]
        return [c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]]

    assert texts(raw) == texts(direct) and raw.endswith(b"data: [DONE]\n\n")


def test_a_bad_request_gets_the_apis_own_error(replica: ReameReplica) -> None:
    start, body = ask(replica, "/v1/chat/completions", {"messages": "not a list"})
    assert start.status == 400
    assert json.loads(body)["error"]["param"] == "messages"


def test_health_and_metrics_are_the_replicas(replica: ReameReplica) -> None:
    start, body = ask(replica, "/health")
    assert start.status == 200 and json.loads(body)["status"] == "ok"
    start, body = ask(replica, "/metrics")
    assert start.status == 200 and b"reame_prompt_tokens" in body


def test_served_prompts_show_in_the_routing_report(replica: ReameReplica) -> None:
    long_chat = {
        "messages": [{"role": "system", "content": "Extract fields. " * 40}, CHAT["messages"][0]],
        "max_tokens": 4,
    }
    ask(replica, "/v1/chat/completions", long_chat)
    report = replica.record_routing_stats()
    assert report["resident"] and report["queued"] == 0 and report["running"] == 0
    assert report["stored"] == []  # no shared disk cache in this replica
    assert report["spills"]  # the engine keeps a pinned conversation whose slot is taken
    replica.check_health()


def test_a_report_names_the_requests_finished_before_it_served_or_not(
    replica: ReameReplica,
) -> None:
    chat = {**CHAT, "messages": [{"role": "user", "content": "Tell me of maps. " * 20}]}
    raw = json.dumps(chat).encode()
    served = forwarded("POST", "/v1/chat/completions", b"", [], raw)
    refused = forwarded("POST", "/v1/chat/completions", b"", [], b'{"messages": 1}')
    assert served.id != refused.id
    before = replica.record_routing_stats()

    async def run(request: ForwardedRequest) -> None:
        async for _ in replica(request):
            pass

    asyncio.run(run(served))
    asyncio.run(run(refused))
    after = replica.record_routing_stats()
    assert before["finished"] == [] and after["finished"] == [served.id, refused.id]
    assert after["resident"] == [[h.hex() for h in prefix_chain(served.routed_text)]]


def test_a_report_names_only_the_most_recent_requests_finished() -> None:
    served = ServedPrefixes(slots=2, shared_cache=False)
    for n in range(REPORTED_FINISHED + 5):
        served.finished(f"request-{n}")
    finished = served.report(0, 0).finished
    assert len(finished) == REPORTED_FINISHED and finished[-1] == f"request-{REPORTED_FINISHED + 4}"


class _SharedStore:
    """A prefix store that never has a prefix: enough for a replica to count its disk
    cache as shared."""

    @hookimpl
    def reame_prefix_lookup(self, tokens: Sequence[int], reused: int, model: ModelInfo) -> None:
        return None


@pytest.mark.parametrize(
    ("conversations", "session", "whole"),
    [(False, "chat-1", False), (True, "chat-1", True), (True, None, False)],
    ids=["first turns only", "a session's conversation", "no session"],
)
def test_a_replica_reports_as_stored_what_its_disk_cache_keeps(
    conversations: bool, session: str | None, whole: bool
) -> None:
    plugins = PluginHost(discover=False)
    plugins.register(_SharedStore(), "shared-store")
    start = partial(start_runtime, backend=FakeBackend(), plugins=plugins)
    replica = ReameReplica(
        {}, shared_cache=True, conversations=conversations, name="replica-b", start=start
    )
    try:
        system = {"role": "system", "content": "Extract fields. " * 40}
        later_turn = [
            system,
            {"role": "user", "content": "The first question, and at some length. " * 8},
            {"role": "assistant", "content": "The first answer, and at some length too. " * 8},
            {"role": "user", "content": "The second question."},
        ]
        headers = {"x_session_id": session} if session else {}
        ask(replica, "/v1/chat/completions", {"messages": later_turn, "max_tokens": 2}, **headers)
        report = replica.record_routing_stats()
        chain = prefix_chain(forwarded_text(later_turn))
        first_turn = len(f"system\n{system['content']}\n") // CHUNK_CHARS
        expected = chain if whole else chain[:first_turn]
        assert report["stored"] == [h.hex() for h in expected]
    finally:
        replica.__del__()


def forwarded_text(messages: list[dict[str, str]]) -> str:
    body = json.dumps({"messages": messages}).encode()
    return forwarded("POST", "/v1/chat/completions", b"", [], body).routed_text


def test_closing_the_reply_early_tells_the_application_the_client_left(
    replica: ReameReplica,
) -> None:
    body = json.dumps({**CHAT, "stream": True, "max_tokens": 200}).encode()
    request = forwarded("POST", "/v1/chat/completions", b"", [], body)

    async def first_part_then_leave() -> None:
        parts = exchange(replica.app, request)
        assert isinstance(await parts.__anext__(), ReplyStart)
        await parts.aclose()

    asyncio.run(first_part_then_leave())

    async def settle(check: Callable[[], bool]) -> None:
        for _ in range(200):
            if check():
                return
            await asyncio.sleep(0.01)

    asyncio.run(settle(lambda: replica.server.in_flight == 0))
    assert replica.server.in_flight == 0
