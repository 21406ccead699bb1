"""A real `reame serve` process for the tests that drive the HTTP API from outside, or the
app on uvicorn in the test's own process, for a runtime the test assembles itself."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn

from reame_core.runtime import Runtime
from reame_core.server.app import create_app
from reame_core.server.service import ServerState

REAME = os.path.join(os.path.dirname(sys.executable), "reame")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def reame_serve(*flags: str, ready_within: float = 90) -> Iterator[str]:
    """Start `reame serve FLAGS` on a free port; yields its URL once /health says 200.
    A clean stop at the end, so whatever the server queued (disk snapshots) is written.

    Each server gets an empty generation archive of its own unless FLAGS name one: what
    earlier tests generated would otherwise be drafted from, and decide which source a test
    that watches another one sees drafting."""
    if "--palimpsest-dir" not in flags:
        with (
            tempfile.TemporaryDirectory(prefix="palimpsest-") as archive,
            reame_serve(*flags, "--palimpsest-dir", archive, ready_within=ready_within) as url,
        ):
            yield url
        return
    port = free_port()
    process = subprocess.Popen(
        [REAME, "serve", "--port", str(port), "--log-level", "warning", *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_within
        while True:
            if process.poll() is not None:
                assert process.stderr is not None
                raise RuntimeError(f"reame serve exited:\n{process.stderr.read()}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"reame serve did not become ready in {ready_within} s")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=60)


@contextmanager
def serve_in_process(runtime: Runtime) -> Iterator[str]:
    """Serve `runtime` over HTTP from a thread of this process; yields the API's base URL
    (``.../v1``). At the end the server stops, and its shutdown closes the runtime."""
    state = ServerState(runtime.settings)
    state.runtime = runtime
    port = free_port()
    config = uvicorn.Config(create_app(state), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the in-process server did not start")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=60)
