"""Where one stream's time goes: `reame serve` against llama-server, one request at a time.

Both servers run side by side (`http_load.py`'s settings: 8 slots, speculation off,
remembered answers off; llama-server `-np 8 -c 8192`, its defaults otherwise) and take
turns, each request on a prompt neither has seen, greedy, `ignore_eos`. Per request:
  - the client's rate: tokens over the wall time of the request, read by a plain blocking
    socket (the client does as little as it can on the servers' cores);
  - the server's own decode rate, from its `timings` (`predicted_per_second`);
  - the CPU each server process used, split into its main thread (Reame's event loop,
    which writes the HTTP response) and the rest (the decoding threads), from
    /proc/PID/task/*/stat.
Twice: streamed (a chunk per token) and whole (one JSON body at the end). The ratios are
medians of per-repetition ratios.

    .venv/bin/python benchmarks/one_stream.py --llama-server PATH [--serve MODEL]
        [--reps 7] [--tokens 256]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from common import free_port, llama_server_argv, median_ratio, wait_healthy, write_report
from http_load import reame_argv

PROMPT = "Story: once upon a time, in a small village by the sea, there lived"
TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds used so far by the process's main thread and by all its other threads."""
    main, rest = 0.0, 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except FileNotFoundError:  # the thread ended
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        seconds = (int(fields[11]) + int(fields[12])) / TICK
        if int(tid) == pid:
            main += seconds
        else:
            rest += seconds
    return main, rest


def request(port: int, tokens: int, stream: bool) -> tuple[float, dict[str, Any]]:
    """One completion; returns its wall seconds and the server's timings."""
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
    if not stream:
        return seconds, json.loads(data)["timings"]
    timings: dict[str, Any] = {}
    for line in data.decode().splitlines():  # the last chunk that carries timings
        if line.startswith("data: {") and '"timings"' in line:
            timings = json.loads(line[6:])["timings"]
    return seconds, timings


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--llama-server", required=True, help="llama.cpp's llama-server binary")
    parser.add_argument("--serve", help="model both servers run (default the embedded one)")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default="one_stream")
    args = parser.parse_args()

    from reame_core.models import resolve_model

    ports = {"reame": free_port(), "llama-server": free_port()}
    argvs = {
        "reame": reame_argv(args.threads, False, args.serve, ports["reame"]),
        "llama-server": llama_server_argv(
            args.llama_server, resolve_model(args.serve).path, args.threads,
            ports["llama-server"], slots=8, ctx=8192,
        ),
    }  # fmt: skip
    processes = {
        name: subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for name, argv in argvs.items()
    }
    samples: dict[str, dict[str, list[dict[str, float]]]] = {
        mode: {name: [] for name in processes} for mode in ("streamed", "whole")
    }
    try:
        for port in ports.values():
            if not wait_healthy(f"http://127.0.0.1:{port}", seconds=120):
                raise RuntimeError(f"no server became healthy on port {port}")
            request(port, 8, stream=True)  # the first request pays for warming up
        for rep in range(args.reps):
            for mode, runs in samples.items():
                order = list(processes) if rep % 2 == 0 else list(processes)[::-1]
                for name in order:
                    pid = processes[name].pid
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
            print(json.dumps({m: {n: round(r[-1]["client_tok_s"], 1) for n, r in v.items()}
                              for m, v in samples.items()}), flush=True)  # fmt: skip
    finally:
        for process in processes.values():
            process.terminate()
        for process in processes.values():
            process.wait(timeout=30)

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
        report["modes"][mode] = row
        print(json.dumps({mode: row}), flush=True)
    report.update(
        model=args.serve or "smollm2-135m (embedded, Q4_1)",
        threads=args.threads,
        tokens=args.tokens,
        reps=args.reps,
        command=" ".join(["python", "benchmarks/one_stream.py", *sys.argv[1:]]),
    )
    print(f"\nwritten to {write_report(args.name, report)}")


if __name__ == "__main__":
    main()
