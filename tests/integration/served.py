"""A real `reame serve` process for the tests that drive the HTTP API from outside."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

REAME = os.path.join(os.path.dirname(sys.executable), "reame")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def reame_serve(*flags: str, ready_within: float = 90) -> Iterator[str]:
    """Start `reame serve FLAGS` on a free port; yields its URL once /health says 200.
    A clean stop at the end, so whatever the server queued (disk snapshots) is written."""
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
