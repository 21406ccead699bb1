"""Soak test: N clients hammer a real `reame serve` (uvicorn, loopback) for minutes, with
random cancellations and disconnects, and the server must lose nothing.

Each client loops until the time is up, picking at random:
  - a streamed completion or chat read to its end (it must end with `data: [DONE]`, carry
    usage, and equal every other answer to the same greedy prompt);
  - the same, abandoned after a few chunks (the client closes the connection mid-stream);
  - a non-streamed one read whole (checked the same way);
  - a non-streamed one abandoned after a random delay (the connection closed mid-response).
A 429 is the documented answer of a full queue: counted, timed, and retried after a short
pause. Anything else (a 5xx, a stream without [DONE], a transport error the client did not
cause, a wrong answer) is a failure.

Afterwards: the server's own accounting must show every queue place and slot returned
(`/metrics`: requests in flight, queue depth, active sequences all 0), its RSS is compared
at start, after warm-up and at the end, and its log is searched for errors.

    .venv/bin/python benchmarks/soak.py                          # 8 clients, 5 minutes
    .venv/bin/python benchmarks/soak.py --clients 4 --seconds 20 --label quick
    .venv/bin/python benchmarks/soak.py --url http://127.0.0.1:8080   # a running server

The server runs with the interpreter's own `reame_core` (PYTHONPATH applies), its disk
prefix cache and generation archive in a scratch directory, `--max-queue` small enough that
the clients fill the queue and see 429s, and speculation off (verifying drafts is exact only
up to near-ties on llama.cpp's default build, and the answers here are compared exactly).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

PROMPTS = [
    "The harbour master of Trieste wrote in his log that morning",
    "List three reasons why small boats stay in port during a storm:",
    "Il pescatore guardò il mare e disse",  # multi-byte text in the output too
    "Write a haiku about a lighthouse.",
    "The recipe for a simple tomato sauce begins with",
    "Q: What is the capital of France?\nA:",
]
MAX_TOKENS = (24, 40, 32, 48, 16, 8)  # one per prompt: each (kind, prompt) has one answer
ACTIONS = ("stream", "stream_cancel", "body", "body_abandon")
WEIGHTS = (0.4, 0.2, 0.25, 0.15)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class Tally:
    """What the clients saw. Only the event loop's tasks write it."""

    requests: int = 0
    completed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ACTIONS, 0))
    cancelled_by_client: int = 0  # stream_cancel and body_abandon that were cut short
    refused_429: int = 0
    failures: list[str] = field(default_factory=list)
    wrong_answers: int = 0
    ttft: list[float] = field(default_factory=list)
    refusal_seconds: list[float] = field(default_factory=list)
    answers: dict[tuple[str, int], tuple[str, int]] = field(default_factory=dict)

    def fail(self, what: str) -> None:
        self.failures.append(what)

    def check_answer(self, kind: str, prompt: int, text: str, completion_tokens: int) -> None:
        """Greedy answers to one prompt must all be equal, whatever else the server did."""
        reference = self.answers.setdefault((kind, prompt), (text, completion_tokens))
        if reference != (text, completion_tokens):
            self.wrong_answers += 1
            self.fail(f"{kind} prompt {prompt}: {text!r}/{completion_tokens} != {reference!r}")


def request_body(kind: str, prompt: int, stream: bool) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {"max_tokens": MAX_TOKENS[prompt], "temperature": 0, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": PROMPTS[prompt]}]
        return "/v1/chat/completions", body
    body["prompt"] = PROMPTS[prompt]
    return "/v1/completions", body


class Client:
    """One simulated user; see the module docstring."""

    def __init__(self, http: httpx.AsyncClient, url: str, tally: Tally, rng: random.Random) -> None:
        self.http, self.url, self.tally, self.rng = http, url, tally, rng

    async def run(self, until: float) -> None:
        while time.monotonic() < until:
            action = self.rng.choices(ACTIONS, WEIGHTS)[0]
            kind = self.rng.choice(("chat", "text"))
            prompt = self.rng.randrange(len(PROMPTS))
            started = time.perf_counter()
            self.tally.requests += 1
            try:
                if action.startswith("stream"):
                    refused = await self.stream(kind, prompt, action == "stream_cancel", started)
                else:
                    refused = await self.body(kind, prompt, action == "body_abandon")
            except httpx.HTTPError as error:
                self.tally.fail(f"{action}: {type(error).__name__}: {error}")
                refused = False
            if refused:
                self.tally.refused_429 += 1
                self.tally.refusal_seconds.append(time.perf_counter() - started)
                await asyncio.sleep(self.rng.uniform(0.05, 0.3))

    async def stream(self, kind: str, prompt: int, cancel: bool, started: float) -> bool:
        path, body = request_body(kind, prompt, stream=True)
        cut_after = self.rng.randint(1, 6) if cancel else None
        text, chunks, usage, done = [], 0, None, False
        async with self.http.stream("POST", self.url + path, json=body) as response:
            if response.status_code == 429:
                return True
            if response.status_code != 200:
                said = (await response.aread())[:200]
                self.tally.fail(f"stream {response.status_code}: {said!r}")
                return False
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                event = json.loads(line[6:])
                if "error" in event:
                    self.tally.fail(f"stream error event: {event['error']}")
                    return False
                if event.get("usage"):
                    usage = event["usage"]
                for choice in event.get("choices", ()):
                    piece = choice.get("text") if kind == "text" else choice["delta"].get("content")
                    if piece:
                        if not text:
                            self.tally.ttft.append(time.perf_counter() - started)
                        text.append(piece)
                        chunks += 1
                if cut_after is not None and chunks >= cut_after:
                    self.tally.cancelled_by_client += 1
                    return False  # leaving the block closes the connection mid-stream
        if not done:
            self.tally.fail("stream ended without [DONE]")
        elif usage is None:
            self.tally.fail("stream without usage")
        else:
            self.tally.completed["stream_cancel" if cancel else "stream"] += 1
            self.tally.check_answer(kind, prompt, "".join(text), usage["completion_tokens"])
        return False

    async def body(self, kind: str, prompt: int, abandon: bool) -> bool:
        path, body = request_body(kind, prompt, stream=False)
        post = self.http.post(self.url + path, json=body)
        if abandon:
            try:
                response = await asyncio.wait_for(post, self.rng.uniform(0.02, 0.8))
            except asyncio.TimeoutError:
                self.tally.cancelled_by_client += 1  # the connection closed mid-response
                return False
        else:
            response = await post
        if response.status_code == 429:
            return True
        if response.status_code != 200:
            self.tally.fail(f"body {response.status_code}: {response.text[:200]!r}")
            return False
        data = response.json()
        choice = data["choices"][0]
        text = choice["text"] if kind == "text" else choice["message"]["content"]
        self.tally.completed["body_abandon" if abandon else "body"] += 1
        self.tally.check_answer(kind, prompt, text, data["usage"]["completion_tokens"])
        return False


async def drive(url: str, clients: int, seconds: float, seed: int = 0) -> Tally:
    """Run `clients` clients against `url` for `seconds`; what they saw."""
    tally = Tally()
    # A new connection per request: a closed connection is then exactly one request's.
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        until = time.monotonic() + seconds
        await asyncio.gather(
            *(Client(http, url, tally, random.Random(seed + i)).run(until) for i in range(clients))
        )
    return tally


def server_accounting(url: str, settle_s: float = 30.0) -> dict[str, float]:
    """The server's own gauges once every request has ended (waiting up to `settle_s` for
    cancelled ones to leave the engine), and its 5xx count."""
    deadline = time.monotonic() + settle_s
    while True:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        gauges = {
            name: float(value)
            for name, value in re.findall(r"^(reame_\w+) ([0-9.e+-]+)$", text, re.M)
        }
        held = {
            name: gauges.get(name, 0.0)
            for name in ("reame_requests_in_flight", "reame_queue_depth", "reame_active_sequences")
        }
        if not any(held.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    statuses: dict[str, float] = {}
    pattern = r'^reame_requests_total\{route="([^"]*)",status="(\d+)"\} (\S+)$'
    for route, status, value in re.findall(pattern, text, re.M):
        if route != "/health":  # 503 while the model loads: the driver's own polling
            statuses[status] = statuses.get(status, 0.0) + float(value)
    held["http_5xx"] = sum(v for s, v in statuses.items() if s.startswith("5"))
    held["http_statuses"] = statuses  # type: ignore[assignment]
    return held


class RssSampler:
    """The server process's resident memory, every `period_s`, on a thread of its own."""

    def __init__(self, pid: int, period_s: float = 2.0) -> None:
        import psutil

        self.process = psutil.Process(pid)
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period_s,), daemon=True)
        self._started = time.monotonic()
        self._thread.start()

    def _run(self, period_s: float) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(period_s)

    def sample(self) -> int:
        rss = int(self.process.memory_info().rss)
        self.samples.append((time.monotonic() - self._started, rss))
        return rss

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def at(self, seconds: float) -> int:
        """The first sample taken at or after `seconds`."""
        return next((rss for t, rss in self.samples if t >= seconds), self.samples[-1][1])


@contextlib.contextmanager
def reame_serve(port: int, flags: list[str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`reame serve FLAGS` from this interpreter (its PYTHONPATH's reame_core), its log (JSON
    lines) in `log_path`, from the moment /health says 200 until the block ends (a clean stop)."""
    argv = [sys.executable, "-m", "reame_core.cli.main", "serve", "--port", str(port),
            "--log-level", "info", "--log-json", *flags]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log)
        try:
            deadline = time.monotonic() + 180
            while True:
                assert process.poll() is None, f"reame serve exited; see {log_path}"
                assert time.monotonic() < deadline, "reame serve did not become healthy"
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                        break
                time.sleep(0.3)
            yield process
        finally:
            process.terminate()
            process.wait(timeout=60)


def log_problems(log_path: Path) -> list[str]:
    """The server's log lines at level error or above, and any traceback."""
    lines = log_path.read_text(errors="replace").splitlines()
    return [line for line in lines if re.search(r'"level": ?"(error|critical)"|Traceback', line)]


def summarize(tally: Tally, seconds: float, clients: int) -> dict[str, Any]:
    def ms(value: float | None) -> float | None:
        return None if value is None else round(1000 * value, 1)

    return {
        "clients": clients,
        "seconds": round(seconds, 1),
        "requests": tally.requests,
        "completed": tally.completed,
        "disconnects_by_client": tally.cancelled_by_client,
        "refused_429": tally.refused_429,
        "failures": len(tally.failures),
        "failure_examples": tally.failures[:10],
        "wrong_answers": tally.wrong_answers,
        "distinct_answers_checked": len(tally.answers),
        "ttft_p50_ms": ms(percentile(tally.ttft, 0.5)),
        "ttft_p95_ms": ms(percentile(tally.ttft, 0.95)),
        "refusal_p50_ms": ms(percentile(tally.refusal_seconds, 0.5)),
        "refusal_p95_ms": ms(percentile(tally.refusal_seconds, 0.95)),
        "refusal_max_ms": ms(max(tally.refusal_seconds, default=None)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--warmup", type=float, default=30, help="seconds before the RSS baseline")
    parser.add_argument("--max-queue", type=int, default=2)
    parser.add_argument("--url", help="drive this running server instead of starting one")
    parser.add_argument("--label", default="smollm2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("serve_args", nargs="*", help="more `reame serve` flags (after --)")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from common import RESULTS, free_port, write_report

    if args.url:
        tally = asyncio.run(drive(args.url, args.clients, args.seconds, args.seed))
        report = {**summarize(tally, args.seconds, args.clients), **server_accounting(args.url)}
    else:
        port = free_port()
        log_path = RESULTS / f"soak_{args.label}.log"
        # Speculation off: on a build with LLAMAFILE kernels (the default) verifying drafts is
        # exact only up to near-ties, and every greedy answer here must equal every other.
        extra = ["--max-queue", str(args.max_queue), "--speculate", "off", *args.serve_args]
        scratch = tempfile.mkdtemp(prefix="reame-soak-")
        dirs = ["--kv-cache-dir", f"{scratch}/kv", "--palimpsest-dir", f"{scratch}/palimpsest"]
        with reame_serve(port, [*dirs, *extra], log_path) as process:
            url = f"http://127.0.0.1:{port}"
            rss = RssSampler(process.pid)
            started = time.monotonic()
            tally = asyncio.run(drive(url, args.clients, args.seconds, args.seed))
            elapsed = time.monotonic() - started
            accounting = server_accounting(url)
            rss.stop()
            exited_alive = process.poll() is None
        problems = log_problems(log_path)
        warmup = min(args.warmup, elapsed / 2)
        start_rss, warm_rss, end_rss = rss.samples[0][1], rss.at(warmup), rss.samples[-1][1]
        report = {
            **summarize(tally, elapsed, args.clients),
            **accounting,
            "server_alive_at_end": exited_alive,
            "rss_mib": {
                "start": round(start_rss / 2**20, 1),
                "after_warmup": round(warm_rss / 2**20, 1),
                "end": round(end_rss / 2**20, 1),
                "max": round(max(r for _, r in rss.samples) / 2**20, 1),
                "growth_after_warmup": round((end_rss - warm_rss) / 2**20, 1),
                "warmup_seconds": warmup,
            },
            "log_errors": len(problems),
            "log_error_examples": problems[:5],
            "server": "reame serve (embedded SmolLM2-135M) " + " ".join(extra),
        }
        log_path.unlink()  # kept only while the run needs it; its errors are in the report
    report["command"] = " ".join(["python", *sys.argv])
    path = write_report(f"soak_{args.label}", report)
    print(json.dumps(report, indent=2))
    print(f"\nwritten to {path}")
    lost = report["failures"] or report.get("http_5xx") or report.get("log_errors")
    leaked = any(report.get(k) for k in ("reame_requests_in_flight", "reame_queue_depth",
                                         "reame_active_sequences"))  # fmt: skip
    sys.exit(1 if lost or leaked else 0)


if __name__ == "__main__":
    main()
