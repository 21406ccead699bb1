"""The HTTP workloads: the same streams sent to `reame serve` and to another OpenAI-compatible
server (`reame bench --against URL`), alternating between them.

Only what any such server can be asked is asked: streamed `/v1/completions`, greedy, with
``ignore_eos`` (llama-server and vLLM honour it) so both generate the same number of
tokens. Tokens are counted from the final usage chunk when the server sends one
(``stream_options.include_usage``), else one per streamed text chunk. The client is plain
blocking sockets, one thread per stream: it shares the host's cores with the servers, so
it does as little as it can.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

from reame_core.bench import texts
from reame_core.bench.runner import Measure
from reame_core.bench.trial import Sample
from reame_core.bench.workloads import Arm, Workload


@dataclass(frozen=True)
class Server:
    """An OpenAI-compatible server: its base URL (without /v1), the model id to send (None:
    send none) and a bearer key if it wants one."""

    url: str
    model: str | None = None
    api_key: str | None = None

    def connection(self) -> http.client.HTTPConnection:
        parts = urlsplit(self.url)
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        return cls(parts.hostname or "127.0.0.1", parts.port, timeout=600)

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    @property
    def prefix(self) -> str:
        return urlsplit(self.url).path.rstrip("/")


def normalized(url: str) -> str:
    """The base URL: a trailing slash or /v1 dropped (both are how people write it)."""
    url = url.rstrip("/")
    return url.removesuffix("/v1")


def with_model(server: Server) -> Server:
    """`server` with the first model id its `/v1/models` lists (the id some servers require
    in each request); unchanged if it lists none or does not answer."""
    connection = server.connection()
    try:
        connection.request("GET", f"{server.prefix}/v1/models", headers=server.headers())
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            return server
        models = json.loads(body).get("data") or []
    except (OSError, ValueError, http.client.HTTPException):
        return server
    finally:
        connection.close()
    return replace(server, model=models[0]["id"]) if models else server


@dataclass(frozen=True)
class Streamed:
    seconds: float
    first_token_s: float
    tokens: int
    text: str


def stream_completion(server: Server, prompt: str, max_tokens: int) -> Streamed:
    """One streamed completion of exactly `max_tokens` tokens (greedy, ignore_eos)."""
    body: dict[str, object] = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if server.model:
        body["model"] = server.model
    connection = server.connection()
    started = time.perf_counter()
    first: float | None = None
    chunks, usage_tokens, text = 0, None, []
    try:
        connection.request(
            "POST", f"{server.prefix}/v1/completions", json.dumps(body), server.headers()
        )
        response = connection.getresponse()
        if response.status != 200:
            raise RuntimeError(
                f"{server.url} answered {response.status}: {response.read()[:200]!r}"
            )
        for line in response:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage_tokens = event["usage"].get("completion_tokens")
            for choice in event.get("choices") or ():
                if choice.get("text"):
                    chunks += 1
                    text.append(choice["text"])
                    if first is None:
                        first = time.perf_counter()
    finally:
        connection.close()
    seconds = time.perf_counter() - started
    tokens = usage_tokens if usage_tokens is not None else chunks
    return Streamed(seconds, (first or time.perf_counter()) - started, tokens, "".join(text))


def streams_at_once(server: Server, prompts: Sequence[str], max_tokens: int) -> list[Streamed]:
    """All `prompts` streamed concurrently, one thread each."""
    results: list[Streamed | BaseException | None] = [None] * len(prompts)

    def one(i: int) -> None:
        try:
            results[i] = stream_completion(server, prompts[i], max_tokens)
        except BaseException as error:  # re-raised on the calling thread
            results[i] = error

    workers = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    done = []
    for result in results:
        if not isinstance(result, Streamed):
            raise RuntimeError(f"a stream failed: {result}")
        done.append(result)
    return done


def http_sample(workload: Workload, server: Server, *, quick: bool) -> Sample:
    """One measurement of an HTTP workload on `server`: `decode` streams one request,
    `streams` its requests at once; aggregate tokens over wall time."""
    size = workload.size(quick)
    prompts = list(texts.STORIES[: size.requests])
    started = time.perf_counter()
    results = streams_at_once(server, prompts, size.tokens)
    seconds = time.perf_counter() - started
    tokens = sum(r.tokens for r in results)
    first = sorted(r.first_token_s for r in results)
    return Sample(
        tokens / seconds, tokens, seconds, detail={"first_token_s_median": first[len(first) // 2]}
    )


def http_workload(workload: Workload, other: str) -> Workload:
    """The HTTP version of `workload`: Reame's server (A) against `other` (B)."""
    if workload.name == "trace":  # HTTP already: only the baseline changes
        return replace(
            workload,
            name="trace@http",
            title=f"{workload.title}; Reame against another server",
            feature="reame serve defaults, a fresh process with empty caches each replay",
            baseline=f"{other}, the same replay",
            goal=1.0,
        )
    count = workload.full.requests
    streams = "one stream" if count == 1 else f"{count} streams"
    return replace(
        workload,
        name=f"{workload.name}@http",
        title=f"{streams} at once over HTTP, Reame against another server",
        feature="reame serve (speculation off), streamed /v1/completions",
        baseline=f"{other}, the same requests",
        goal=1.0,
        baseline_first=False,
    )


def warm_up(server: Server) -> None:
    stream_completion(server, "Warm up.", 4)


def http_measure(reame: Server, other: Server, *, quick: bool) -> Measure:
    """A `runner.Measure` over HTTP: arm A on Reame's server, arm B on the other."""

    def measure(workload: Workload, arm: Arm, rep: int, scratch: str) -> Sample:
        return http_sample(workload, reame if arm == "A" else other, quick=quick)

    return measure


# ------------------------------------------------------------ Reame's own server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def reame_server(
    model: str,
    *flags: str,
    env: Mapping[str, str] | None = None,
    ready_within: float = 300,
) -> Iterator[Server]:
    """`reame serve MODEL FLAGS` on a free port, with `env` added to this process's
    environment; stopped at the end."""
    port = free_port()
    argv = [sys.executable, "-m", "reame_core.cli.main", "serve", model, "--port", str(port),
            "--log-level", "warning", *flags]  # fmt: skip
    process = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    server = Server(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + ready_within
        while not _healthy(server):
            if process.poll() is not None:
                assert process.stderr is not None
                raise RuntimeError(f"reame serve exited: {process.stderr.read()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"reame serve was not ready after {ready_within} s")
            time.sleep(0.2)
        yield with_model(server)
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


def _healthy(server: Server) -> bool:
    connection = server.connection()
    try:
        connection.request("GET", "/health")
        return connection.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()
