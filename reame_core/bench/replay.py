"""Sending the trace (`trace.py`) to an OpenAI-compatible server, on the trace's clock.

Requests leave at their trace times stretched by `pace` (arrivals are open-loop: a slow
server gets the next request all the same); a chat turn leaves its think time after the
previous answer, with the conversation so far and ``X-Session-ID``; the night's reruns
leave once every answer of the day is in. Every request is a streamed chat completion,
over a new connection (llama-server at times drops a kept-alive one). The client is plain
blocking sockets, one thread per request, as in `against.py`: it shares the host's cores
with the server, so it does as little as it can.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from reame_core.bench.against import Server
from reame_core.bench.runner import Measure
from reame_core.bench.trace import BENCH_PACE, Count, Request, check, summary, trace_for
from reame_core.bench.trial import Sample
from reame_core.bench.workloads import Arm, Workload
from reame_core.fleet.forwarding import REPLICA_HEADER

SESSION_HEADER = "X-Session-ID"


@dataclass
class Outcome:
    """One request's fate in one replay; times in seconds after the replay started."""

    id: str
    kind: str
    sent: float
    ttft: float = 0.0
    latency: float = 0.0
    content: str = ""
    finish_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, Any] = field(default_factory=dict)  # the server's own, if it sends them
    valid: bool | None = None  # structured answers only (`trace.check`)
    error: str | None = None
    replica: str = ""  # a fleet's replica that answered (`X-Reame-Replica`), if named


def send(server: Server, request: Request, messages: Sequence[Any], started: float) -> Outcome:
    """Stream one chat completion; what arrived, and when."""
    body = {**request["body"], "messages": list(messages), "stream": True}
    body["stream_options"] = {"include_usage": True}
    if server.model and "model" not in body:
        body["model"] = server.model
    headers = server.headers()
    if "session" in request:
        headers[SESSION_HEADER] = request["session"]
    outcome = Outcome(request["id"], request["kind"], time.perf_counter() - started)
    connection = server.connection()
    try:
        connection.request(
            "POST", f"{server.prefix}/v1/chat/completions", json.dumps(body), headers
        )
        response = connection.getresponse()
        outcome.replica = response.getheader(REPLICA_HEADER) or ""
        if response.status == 200:
            _read(response, outcome, started)
        else:
            outcome.error = f"{response.status}: {response.read()[:200]!r}"
    except (OSError, ValueError, http.client.HTTPException) as error:
        outcome.error = repr(error)
    finally:
        connection.close()
    outcome.latency = time.perf_counter() - started - outcome.sent
    return outcome


def _read(response: http.client.HTTPResponse, outcome: Outcome, started: float) -> None:
    """The answer's server-sent events into `outcome`: its text, the moment of its first
    piece, its finish reason, usage and timings."""
    pieces: list[str] = []
    for line in response:
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        for choice in chunk.get("choices") or ():
            text = (choice.get("delta") or {}).get("content") or ""
            if text and not outcome.ttft:
                outcome.ttft = time.perf_counter() - started - outcome.sent
            pieces.append(text)
            outcome.finish_reason = choice.get("finish_reason") or outcome.finish_reason
        if chunk.get("usage"):
            outcome.usage = chunk["usage"]
        if chunk.get("timings"):
            outcome.timings = chunk["timings"]
    outcome.content = "".join(pieces)


def replay(server: Server, trace: Sequence[Request], pace: float) -> list[Outcome]:
    """Every request of `trace` against `server`, on the trace's clock stretched by `pace`:
    the day's requests, then, once all of them are answered, the night's reruns. The
    outcomes come back in the trace's order."""
    started = time.perf_counter()
    done: list[Outcome] = []
    lock = threading.Lock()

    def keep(outcome: Outcome) -> None:
        with lock:
            done.append(outcome)

    def single(request: Request, since: float) -> None:
        _until(since + request["at"] * pace)
        keep(send(server, request, request["body"]["messages"], started))

    def conversation(turns: Sequence[Request]) -> None:
        _until(started + turns[0]["at"] * pace)
        messages = [{"role": "system", "content": turns[0]["system"]}]
        for turn in turns:
            time.sleep(turn["think"] * pace)
            messages.append({"role": "user", "content": turn["user"]})
            outcome = send(server, turn, messages, started)
            keep(outcome)
            messages.append({"role": "assistant", "content": outcome.content})

    sessions: dict[str, list[Request]] = {}
    for request in trace:
        if request["kind"] == "chat":
            sessions.setdefault(request["session"], []).append(request)
    day: list[tuple[Callable[..., None], tuple[Any, ...]]] = [
        (single, (r, started)) for r in trace if r["kind"] not in ("chat", "rerun")
    ]
    day += [(conversation, (turns,)) for turns in sessions.values()]
    _all_at_once(day)
    night = time.perf_counter()
    _all_at_once([(single, (r, night)) for r in trace if r["kind"] == "rerun"])
    order = {request["id"]: i for i, request in enumerate(trace)}
    return sorted(done, key=lambda outcome: order[outcome.id])


def _until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.perf_counter()))


def _all_at_once(calls: Sequence[tuple[Callable[..., None], tuple[Any, ...]]]) -> None:
    """Each call on a thread of its own; back when all have returned."""
    workers = [threading.Thread(target=call, args=args) for call, args in calls]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def replay_sample(
    server: Server, trace: Sequence[Request], pace: float, count: Count, *, compare: bool
) -> Sample:
    """One measured replay: a warm-up request first (outside the figures), then `trace`.
    The figure is useful output per second (`trace.summary`); `compare`: digest the answers,
    so that two greedy, deterministic servers can be checked for the same ones."""
    warm_up = {"id": "warm-up", "kind": "warm-up", "body": {"temperature": 0, "max_tokens": 4}}
    send(server, warm_up, [{"role": "user", "content": "Hello"}], time.perf_counter())
    outcomes = replay(server, trace, pace)
    failed = [outcome.error for outcome in outcomes if outcome.error is not None]
    if len(failed) == len(outcomes):
        raise RuntimeError(f"every request of the trace failed, the first with {failed[0]}")
    check(outcomes, trace)
    figures = summary(outcomes, count)
    answers = json.dumps([outcome.content for outcome in outcomes])
    errors = figures.pop("errors")
    figures["valid"] = f"{figures['valid']} of {figures.pop('structured')}"
    return Sample(
        value=figures["useful_tok_s"],
        tokens=figures["useful_tokens"],
        seconds=figures["completion_s"],
        outputs=hashlib.sha256(answers.encode()).hexdigest()[:16] if compare else None,
        detail={**figures, "errors": len(errors), "first_errors": errors[:3]},
    )


def against_measure(
    feature: Measure, trace: Workload, other: Server, *, quick: bool, count: Count
) -> Measure:
    """The trace over HTTP (`reame bench --against`): arm A is `feature`, the `trace`
    row's own (a fresh `reame serve` with its defaults for each replay); arm B replays the
    same requests against `other`, a server already running, as it is."""

    def measure(workload: Workload, arm: Arm, rep: int, scratch: str) -> Sample:
        if arm == "A":
            return feature(trace, arm, rep, scratch)
        size = trace.size(quick)
        requests = trace_for(size.requests, size.tokens)
        return replay_sample(other, requests, BENCH_PACE, count, compare=False)

    return measure
