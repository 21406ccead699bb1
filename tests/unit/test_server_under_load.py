"""The server under load through real uvicorn on loopback, over a fake backend that takes
time per step: clients that stream, cancel, hang up mid-response and retry after 429s lose
nothing and leave no slot or queue place behind; a full queue refuses at once.

The same client mix drives a real model for minutes in `benchmarks/soak.py`."""

from __future__ import annotations

import asyncio
import re
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from api_errors import openai_error
from loopback import serve_on_loopback

from reame_core.backend.fake import FakeBackend
from reame_core.plugins import PluginHost
from reame_core.settings import Settings

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import soak

SLOTS = 4
QUEUE = 2
STEP_S = 0.004  # a decode step of the fake model: streams last long enough to cut


@contextmanager
def served(plugins: PluginHost, step_s: float = STEP_S) -> Iterator[str]:
    """The app over a slow fake backend, served by uvicorn on a loopback port."""
    backend = FakeBackend(n_seq_max=SLOTS, step_cost_s=step_s)
    with serve_on_loopback(Settings(max_queue=QUEUE), backend=backend, plugins=plugins) as (
        url,
        _,
    ):
        yield url


def completion_statuses(url: str) -> dict[str, float]:
    """How many /v1/completions requests ended with each status (not the /metrics reads
    themselves, which count too)."""
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    pattern = r'^reame_requests_total\{route="/v1/completions",status="(\d+)"\} (\S+)$'
    return {status: float(n) for status, n in re.findall(pattern, metrics, re.M)}


def active_sequences(url: str) -> float:
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    return float(re.search(r"^reame_active_sequences (\S+)$", metrics, re.M).group(1))  # type: ignore[union-attr]


def test_clients_that_cancel_and_hang_up_lose_nothing_and_leave_no_slot(
    plugins: PluginHost,
) -> None:
    with served(plugins) as url:
        tally = asyncio.run(soak.drive(url, clients=2 * (SLOTS + QUEUE), seconds=6))
        held = soak.server_accounting(url, settle_s=10)

    assert tally.failures == [] and tally.wrong_answers == 0
    assert tally.completed["stream"] and tally.completed["body"], tally.completed
    assert tally.cancelled_by_client > 10 and tally.refused_429 > 0
    assert held["reame_requests_in_flight"] == held["reame_queue_depth"] == 0
    assert held["reame_active_sequences"] == 0 and held["http_5xx"] == 0, held


def test_a_full_queue_refuses_at_once(plugins: PluginHost) -> None:
    with served(plugins) as url, httpx.Client(timeout=30) as client:
        body = {"prompt": "Once upon a time", "max_tokens": 1000, "stream": True}
        streams = [client.stream("POST", f"{url}/v1/completions", json=body) for _ in range(6)]
        for stream in streams:
            assert stream.__enter__().status_code == 200
        started = time.perf_counter()
        refused = client.post(f"{url}/v1/completions", json={**body, "stream": False})
        waited = time.perf_counter() - started
        for stream in streams:
            stream.__exit__(None, None, None)

    openai_error(refused, 429, code="queue_full")
    assert waited < 1.0  # not after the running requests: at once


def test_a_client_hanging_up_on_a_non_streamed_request_frees_its_slot(
    plugins: PluginHost,
) -> None:
    with served(plugins) as url:
        body = {"prompt": "Once upon a time", "max_tokens": 1500, "ignore_eos": True}

        async def hang_up() -> None:
            async with httpx.AsyncClient() as client:
                request = client.post(f"{url}/v1/completions", json=body)
                try:
                    await asyncio.wait_for(request, timeout=0.5)
                except asyncio.TimeoutError:
                    return
                raise AssertionError("answered before the client hung up")

        asyncio.run(hang_up())
        deadline = time.monotonic() + 2  # the whole generation would take 6 s
        while active_sequences(url) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert active_sequences(url) == 0


def test_a_client_hanging_up_before_its_body_is_sent_is_no_server_error(
    plugins: PluginHost,
) -> None:
    with served(plugins) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                b'{"prompt": '
            )
            time.sleep(0.2)  # the server is reading the body when the client leaves
        deadline = time.monotonic() + 5
        while not (statuses := completion_statuses(url)) and time.monotonic() < deadline:
            time.sleep(0.05)

    assert statuses == {"499": 1.0}
