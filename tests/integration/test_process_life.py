"""A `reame serve` process's life on the embedded model: killed with SIGKILL while its disk
caches write, it comes back on the same directories healthy, with the same answers and
nothing half-written used; SIGTERM lets the requests in flight finish and refuses new
ones, within the drain time; Ctrl-C in `reame run`'s REPL stops the answer, not the REPL.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from served import REAME, free_port

# Answers are compared bit for bit: speculation off, and the thread count fixed (fewer
# threads while the host is busy would change the floating-point sums, so the tokens).
BASE = ("--parallel", "2", "--ctx", "1024", "--threads", "2", "--speculate", "off")
FIXED = ("--no-adapt-threads",)
SYSTEM = (
    "You are the dispatcher of Ferrovie Alpine, a small mountain railway with four lines. "
    "Line A runs from Tirano to Bormio every hour from six in the morning to nine at night. "
    "Line B runs from Bormio to Livigno every two hours and stops at Valdidentro. Tickets "
    "are sold at every station and on board; on board they cost one euro more. Bicycles "
    "travel free on lines A and B. Children under six travel free, and children under "
    "fourteen pay half. Answer travellers briefly and politely, quoting only these rules."
) * 2  # long enough for the disk cache to store (it skips prefixes under 128 tokens)
# Prefixes the first server stores, then two it is storing when it is killed.
STORED = [(f"{SYSTEM} This is timetable {i}.", "How much does my child pay?") for i in range(3)]
KILLED_WHILE_STORING = [
    (f"{SYSTEM} Today line {line} is closed by snow.", "Can I take my bicycle?") for line in "CD"
]


@contextmanager
def server(*flags: str, ready_within: float = 90) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`reame serve FLAGS` on a free port, once healthy; killed at the end if still alive."""
    port = free_port()
    process = subprocess.Popen(
        [REAME, "serve", "--port", str(port), "--log-level", "warning", *BASE, *FIXED, *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_within
        while True:
            assert process.poll() is None, f"reame serve exited: {process.stderr.read()}"  # type: ignore[union-attr]
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"not healthy within {ready_within} s"
            time.sleep(0.2)
        yield process, url
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=60)


def chat(system: str, question: str, **fields: Any) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ],
        "max_tokens": 24,
        "temperature": 0,
        **fields,
    }


def ask(url: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return dict(response.json())


def diskkv_metrics(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    found = re.findall(r"^reame_diskkv_(\w+) ([0-9.e+-]+)$", text, re.MULTILINE)
    return {name: float(value) for name, value in found}


# ------------------------------------------------------------------- SIGKILL


@pytest.mark.timeout(600)
def test_a_killed_server_restarts_on_its_directories_with_the_same_answers(
    tmp_path: Path,
) -> None:
    questions = [*STORED, *KILLED_WHILE_STORING]
    with server("--disable-plugin", "diskkv", "--disable-plugin", "palimpsest") as (_, url):
        cold = [ask(url, chat(*q))["choices"][0]["message"]["content"] for q in questions]

    # Computed again after the restart, not recalled: the disk cache's entries are tested.
    dirs = (
        "--kv-cache-dir", str(tmp_path / "kv"), "--palimpsest-dir", str(tmp_path / "arc"),
        "--palimpsest-no-recall",
    )  # fmt: skip
    with server(*dirs) as (process, url):
        for q in STORED:
            ask(url, chat(*q))
        time.sleep(2)  # the writer thread finishes these snapshots
        written = diskkv_metrics(url)["entries_written"]
        assert written >= 1
        # Two new prefixes: their snapshots are queued as their prompts are computed.
        # SIGKILL as soon as the first token streams, while the writer writes.
        first_token = threading.Event()
        streams = [
            threading.Thread(
                target=stream_until_cut, args=(url, chat(*q, max_tokens=200), first_token)
            )
            for q in KILLED_WHILE_STORING
        ]
        for thread in streams:
            thread.start()
        first_token.wait(timeout=120)
        killed = process.pid
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        for thread in streams:
            thread.join(timeout=30)

    with server(*dirs) as (_, url):
        warm = [ask(url, chat(*q)) for q in questions]
        stats = diskkv_metrics(url)
        # What the killed writer left (its pid in the name: `.<key>.<pid>.<random>.tmp`) is
        # gone; this server's own writes may be under way here, and are cut when it is.
        left = [p for p in (tmp_path / "kv").rglob("*.tmp") if f".{killed}." in p.name]
    assert [reply["choices"][0]["message"]["content"] for reply in warm] == cold
    # The first question's prefix comes from disk; the next ones share most of it with
    # what the slots hold by then, so the disk is not worth reading for them.
    assert warm[0]["timings"]["restored_n"] > 0
    assert stats["corrupt"] == 0 and stats["read_errors"] == 0
    assert not left


def stream_until_cut(url: str, body: dict[str, Any], first_token: threading.Event) -> None:
    """Stream until the server dies; set `first_token` when the first content arrives."""
    try:
        with httpx.stream(
            "POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=120
        ) as response:
            for line in response.iter_lines():
                if '"content":"' in line and '"content":""' not in line:
                    first_token.set()
    except httpx.HTTPError:
        pass  # the server was killed mid-stream: expected


# ------------------------------------------------------------------- SIGTERM


# uvicorn ends a drained server by raising the signal it caught again: the status of a
# process ended by SIGTERM, as a service manager expects (systemd counts it a clean stop).
CLEAN_EXIT = (0, -signal.SIGTERM)


def story(max_tokens: int) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": "Tell me a long story about a lighthouse."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


@pytest.mark.timeout(300)
def test_sigterm_lets_a_stream_finish_refuses_new_requests_and_exits() -> None:
    with server() as (process, url):
        events: list[str] = []
        refused: list[str] = []
        with httpx.stream(
            "POST", f"{url}/v1/chat/completions", json=story(120), timeout=120
        ) as response:
            for line in response.iter_lines():
                if not line:
                    continue
                events.append(line.removeprefix("data: "))
                if len(events) == 3:
                    signaled = time.monotonic()
                    process.send_signal(signal.SIGTERM)
                    time.sleep(0.5)  # uvicorn closes its listening socket first
                    refused.append(try_new_request(url))
        code = process.wait(timeout=30)
        exited = time.monotonic() - signaled

    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["usage"]["completion_tokens"] == 120
    assert refused == ["refused"]
    assert code in CLEAN_EXIT
    assert exited < 30


@pytest.mark.timeout(300)
def test_sigterm_cuts_what_outlasts_the_drain_time_and_exits() -> None:
    with server("--drain-seconds", "1") as (process, url):
        cut = False
        try:
            with httpx.stream(
                "POST", f"{url}/v1/chat/completions", json=story(900), timeout=120
            ) as response:
                for index, _line in enumerate(response.iter_lines()):
                    if index == 3:
                        signaled = time.monotonic()
                        process.send_signal(signal.SIGTERM)
        except httpx.HTTPError:
            cut = True
        code = process.wait(timeout=30)
        exited = time.monotonic() - signaled
    assert cut
    assert code in CLEAN_EXIT
    assert exited < 10


def try_new_request(url: str) -> str:
    """What a new client gets from a draining server."""
    try:
        response = httpx.post(
            f"{url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
            timeout=10,
        )
    except httpx.ConnectError:
        return "refused"
    if response.status_code == 503 and set(response.json()) == {"error"}:
        return "refused"
    return f"served {response.status_code}"


# ----------------------------------------------------------------------- REPL


class Terminal:
    """`reame run` in a pseudo-terminal, as a user at a keyboard runs it, started with SIGINT
    ignored, as a job a script puts in the background inherits it."""

    def __init__(self, *args: str) -> None:
        self.master, slave = pty.openpty()
        self.process = subprocess.Popen(
            ["sh", "-c", 'trap "" INT; exec "$0" "$@"', REAME, "run", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            close_fds=True,
            env={**os.environ, "TERM": "dumb"},
        )
        os.close(slave)
        self.seen = ""

    def expect(self, pattern: str, within: float = 120) -> str:
        """Read until `pattern` appears in what was printed since the last match."""
        deadline = time.monotonic() + within
        while (match := re.search(pattern, self.seen)) is None:
            left = deadline - time.monotonic()
            assert left > 0, f"{pattern!r} not seen in {self.seen[-500:]!r}"
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    self.seen += os.read(self.master, 4096).decode(errors="replace")
                except OSError:  # the process closed the terminal
                    break
        assert match is not None, f"{pattern!r} not seen in {self.seen[-500:]!r}"
        before, self.seen = self.seen[: match.end()], self.seen[match.end() :]
        return before

    def type(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\n")


@pytest.mark.timeout(300)
def test_ctrl_c_in_the_repl_stops_the_answer_and_the_next_question_works() -> None:
    # Room for a long answer: SIGINT must land while it streams, even on a busy host. The
    # REPL starts with SIGINT ignored (`Terminal`) and must still answer Ctrl-C.
    terminal = Terminal(*BASE[2:], *FIXED, "--max-tokens", "600")
    question = "What is the capital of France?"
    try:
        terminal.expect(r">>> ")
        terminal.type(question)
        first = terminal.expect(r"\n>>> ")
        terminal.type("/clear")
        terminal.expect(r"cleared\.\r?\n>>> ")
        terminal.type("Tell me a very long story about a lighthouse keeper.")
        terminal.expect(r"lighthouse keeper\.\r?\n\S")  # the echo, then the answer streams
        time.sleep(1)  # well inside the answer, past the line editor
        terminal.process.send_signal(signal.SIGINT)
        terminal.expect(r"\(interrupted\)\r?\n>>> ")
        terminal.type(question)
        again = terminal.expect(r"\n>>> ")
        # The interrupted turn left the conversation: the same question, the same answer
        # (greedy), and nothing of the story shown after it.
        assert again == first
        terminal.type("/bye")
        assert terminal.process.wait(timeout=30) == 0
    finally:
        if terminal.process.poll() is None:
            terminal.process.kill()
        os.close(terminal.master)
