"""Where one stream's time goes: `reame serve` against llama-server, one request at a time.

Both servers run side by side (`http_load.py`'s settings: 8 slots, speculation off,
remembered answers off; llama-server `-np 8 -c 8192`, its defaults otherwise) and take
turns, each request on a prompt neither has seen, greedy, `ignore_eos`. Per request:
  - the client's rate: tokens over the wall time of the request, read by a plain blocking
    socket (the client does as little as it can on the servers' cores);
  - the server's own decode rate, from its `timings` (`predicted_per_second`);
  - the CPU each server process used, split into its main thread (Reame's event loop,
    which writes the HTTP response) and the rest (the decoding threads), from
    /proc/PID/task/*/schedstat (`common.thread_cpu_seconds`).
Twice: streamed (a chunk per token) and whole (one JSON body at the end). The ratios are
medians of per-repetition ratios.

Two servers that stay up all run long compare two processes, and a process's speed here
depends on where its buffers landed in memory: one `reame serve` measured 0.90-0.96x of
another with the same settings, consistently over an hour. `--fresh` therefore starts both
servers anew for every repetition (in turns, which goes first alternating) so that the
ratio is over many processes. `--raw` adds the ceiling under both: llama.cpp's own decode
loop (batch, `llama_decode`, argmax, through ctypes; no server, no engine) on a context built
from Reame's settings, in a fresh process each repetition, compared by decode rate.

    .venv/bin/python benchmarks/one_stream.py --llama-server PATH [--serve MODEL]
        [--reps 7] [--tokens 256] [--fresh] [--raw]
"""

from __future__ import annotations

import argparse
import http.client
import json
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from common import (
    free_port,
    llama_server_argv,
    median_ratio,
    raw_decode,
    stock_environment,
    thread_cpu_seconds,
    wait_healthy,
    write_report,
)
from http_load import reame_argv

PROMPT = "Story: once upon a time, in a small village by the sea, there lived"


def thread_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds used so far by the process's main thread and by all its other threads."""
    seconds = thread_cpu_seconds(pid)
    main = seconds.pop(pid, 0.0)
    return main, sum(seconds.values())


def completion(port: int, tokens: int, stream: bool) -> tuple[float, bytes]:
    """One greedy completion of `tokens` on a prompt nothing has seen; returns its wall
    seconds and the response body as sent (SSE lines when streamed)."""
    body = {
        "prompt": f"[{secrets.token_hex(4)}] {PROMPT}",
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
        **({"stream_options": {"include_usage": True}} if stream else {}),
    }
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    started = time.perf_counter()
    connection.request(
        "POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"}
    )
    response = connection.getresponse()
    assert response.status == 200, response.status
    data = b""
    while chunk := response.read1(65536):
        data += chunk
    seconds = time.perf_counter() - started
    connection.close()
    return seconds, data


def request(port: int, tokens: int, stream: bool) -> tuple[float, dict[str, Any]]:
    """One completion; returns its wall seconds and the server's timings."""
    seconds, data = completion(port, tokens, stream)
    if not stream:
        return seconds, json.loads(data)["timings"]
    timings: dict[str, Any] = {}
    for line in data.decode().splitlines():  # the last chunk that carries timings
        if line.startswith("data: {") and '"timings"' in line:
            timings = json.loads(line[6:])["timings"]
    return seconds, timings


def raw_child(tokens: int, threads: int, model: str | None) -> None:
    """llama.cpp's decode loop (`common.raw_decode`) on a context built as `reame serve`
    builds it with `http_load.py`'s settings: one sequence; prints its decode rate as JSON."""
    from reame_core.runtime import planned_backend
    from reame_core.settings import Settings

    settings = Settings(
        parallel=8, ctx=1024, threads=threads, speculate="off", log_level="warning",
        **({"model": model} if model else {}),
    )  # fmt: skip
    backend = planned_backend(settings)

    def rate(n: int) -> float:
        text = f"[{secrets.token_hex(4)}] {PROMPT}"
        prompt = backend.tokenize(text, add_special=True, parse_special=False)
        return n / raw_decode(backend, [prompt], n)[1]

    rate(8)  # as the servers' first request pays for warming up
    print(json.dumps({"server_tok_s": rate(tokens)}))


def raw_rate(tokens: int, threads: int, model: str | None) -> dict[str, float]:
    argv = [sys.executable, __file__, "--child-raw", str(tokens), str(threads), model or ""]
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


class Servers:
    """Both servers, started together; `--fresh` starts them anew for every repetition."""

    def __init__(self, argvs: dict[str, list[str]], ports: dict[str, int]) -> None:
        self.argvs, self.ports = argvs, ports
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, order: list[str]) -> None:
        for name in order:
            self.processes[name] = subprocess.Popen(
                self.argvs[name],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=stock_environment() if name == "llama-server" else None,
            )
        for name in order:
            port = self.ports[name]
            if not wait_healthy(f"http://127.0.0.1:{port}", seconds=120):
                raise RuntimeError(f"{name} did not become healthy on port {port}")
            request(port, 8, stream=True)  # the first request pays for warming up

    def stop(self) -> None:
        for process in self.processes.values():
            process.terminate()
        for process in self.processes.values():
            process.wait(timeout=30)
        self.processes = {}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--llama-server", help="llama.cpp's llama-server binary")
    parser.add_argument("--serve", help="model both servers run (default the embedded one)")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--fresh", action="store_true", help="new server processes every rep")
    parser.add_argument("--raw", action="store_true", help="also llama.cpp's raw decode loop")
    parser.add_argument("--name", default="one_stream")
    parser.add_argument("--child-raw", nargs=3, metavar=("TOKENS", "THREADS", "MODEL"))
    args = parser.parse_args()
    if args.child_raw:
        tokens, threads, model = args.child_raw
        raw_child(int(tokens), int(threads), model or None)
        return
    if not args.llama_server:
        parser.error("--llama-server is required")

    from reame_core.models import resolve_model

    ports = {"reame": free_port(), "llama-server": free_port()}
    argvs = {
        "reame": reame_argv(args.threads, False, args.serve, ports["reame"]),
        "llama-server": llama_server_argv(
            args.llama_server, resolve_model(args.serve).path, args.threads,
            ports["llama-server"], slots=8, ctx=8192,
        ),
    }  # fmt: skip
    servers = Servers(argvs, ports)
    names = list(argvs)
    samples: dict[str, dict[str, list[dict[str, float]]]] = {
        mode: {name: [] for name in names} for mode in ("streamed", "whole")
    }
    raw: list[float] = []
    try:
        if not args.fresh:
            servers.start(names)
        for rep in range(args.reps):
            order = names if rep % 2 == 0 else names[::-1]
            if args.fresh:
                servers.start(order)
            for mode, runs in samples.items():
                for name in order:
                    pid = servers.processes[name].pid
                    main_before, rest_before = thread_cpu(pid)
                    seconds, timings = request(ports[name], args.tokens, mode == "streamed")
                    main_after, rest_after = thread_cpu(pid)
                    runs[name].append({
                        "client_tok_s": args.tokens / seconds,
                        "server_tok_s": float(timings["predicted_per_second"]),
                        "main_thread_us_per_token":
                            1e6 * (main_after - main_before) / args.tokens,
                        "other_threads_cpu_per_wall": (rest_after - rest_before) / seconds,
                    })  # fmt: skip
            if args.fresh:
                servers.stop()
            if args.raw:  # with the servers stopped where they are fresh, idle otherwise
                raw.append(raw_rate(args.tokens, args.threads, args.serve)["server_tok_s"])
            print(json.dumps({m: {n: round(r[-1]["client_tok_s"], 1) for n, r in v.items()}
                              for m, v in samples.items()} | ({"raw": round(raw[-1], 1)}
                              if raw else {})), flush=True)  # fmt: skip
    finally:
        servers.stop()

    report: dict[str, Any] = {"modes": {}}
    for mode, runs in samples.items():
        row: dict[str, Any] = {
            name: {key: round(statistics.median(r[key] for r in rs), 2) for key in rs[0]}
            for name, rs in runs.items()
        }
        for key in ("client_tok_s", "server_tok_s"):
            ours = [r[key] for r in runs["reame"]]
            theirs = [r[key] for r in runs["llama-server"]]
            row[f"reame_vs_llama_server_{key}"] = round(median_ratio(ours, theirs), 3)
            row[f"reame_vs_llama_server_{key}_by_rep"] = [
                round(a / b, 3) for a, b in zip(ours, theirs, strict=True)
            ]
        if raw:
            for name, rs in runs.items():
                own = [r["server_tok_s"] for r in rs]
                row[f"{name}_vs_raw_server_tok_s"] = round(median_ratio(own, raw), 3)
        report["modes"][mode] = row
        print(json.dumps({mode: row}), flush=True)
    if raw:
        report["raw"] = {"server_tok_s": round(statistics.median(raw), 2), "by_rep": raw}
    report.update(
        model=args.serve or "smollm2-135m (embedded, Q4_1)",
        threads=args.threads,
        tokens=args.tokens,
        reps=args.reps,
        fresh_processes=args.fresh,
        command=" ".join(["python", "benchmarks/one_stream.py", *sys.argv[1:]]),
    )
    print(f"\nwritten to {write_report(args.name, report)}")


if __name__ == "__main__":
    main()
