"""What serving costs per token, in CPU time, apart from the model.

On a 2-core host llama.cpp's two threads keep both cores busy while a token is decoded, so
every microsecond of CPU the server spends anywhere else comes out of decoding: the engine
thread's Python between decode calls (scheduling, sampling, committing, hooks) and the
event loop's work to send each token. Timed by the wall clock against a real model, these
costs hide in the host's noise (a few percent, where repetitions differ by ten). Timed as
CPU time they are steadier (the host's speed still moves them, by up to a third between
runs here: compare side by side, alternating). This script serves `reame serve`'s
app over HTTP with every installed plugin, on a fake model whose decode sleeps
`--step-ms` (releasing the GIL as llama.cpp's does), and reads from /proc the CPU time of
the server's event loop (its main thread) and of its engine thread per generated token.

Greedy, `ignore_eos`, a prompt nothing has seen; 1 and 8 concurrent streams; streamed
(a chunk per token) and one JSON body. The fake model's vocabulary is small (272 tokens), so
sampling costs little there. `--model` serves a real model instead: the engine thread's CPU
inside `llama_decode` (it computes too) is subtracted, and what is left is its Python, now
with a real vocabulary and with the caches a decode leaves cold; "other threads" then
include llama.cpp's worker.

    .venv/bin/python benchmarks/serving_cost.py [--tokens 256] [--reps 5] [--step-ms 10]
        [--model fake|NAME|PATH] [--uvicorn auto|asyncio+h11|...] [--name serving_cost]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from common import free_port, thread_cpu_seconds, wait_healthy, write_report
from one_stream import completion


def serve_child(port: int, step_ms: float, cache_dir: str, model: str, stack: str) -> None:
    """`reame serve`'s app and runtime with every installed plugin, on `model` (a name or
    path; "fake" for the fake model). The CPU the engine thread spends inside the model's
    decode is counted apart, in a file the parent reads: it is not serving."""
    import uvicorn

    from reame_core.backend.fake import FakeBackend
    from reame_core.backend.llama import LlamaBackend
    from reame_core.runtime import start_runtime
    from reame_core.server.app import create_app
    from reame_core.server.service import ServerState
    from reame_core.settings import Settings

    settings = Settings(
        parallel=8, ctx=1024, speculate="off", log_level="warning", cache_dir=Path(cache_dir),
        plugins={"palimpsest": {"recall": False}},
        **({"model": model} if model != "fake" else {}),
    )  # fmt: skip
    server = ServerState(settings, api_keys=settings.all_api_keys())
    app = create_app(server)
    counter_path = Path(cache_dir) / "model_cpu"
    counter_path.write_bytes(bytes(8))
    counter = mmap.mmap(os.open(counter_path, os.O_RDWR), 8)
    backend_class: Any = FakeBackend if model == "fake" else LlamaBackend
    model_decode = backend_class.decode

    def decode(self: Any, batch: Any) -> Any:
        started = time.thread_time()
        try:
            return model_decode(self, batch)
        finally:
            spent = struct.unpack_from("d", counter)[0] + time.thread_time() - started
            struct.pack_into("d", counter, 0, spent)

    backend_class.decode = decode
    if model == "fake":
        backend = FakeBackend(n_seq_max=8, n_ctx_seq=1024, step_cost_s=step_ms / 1000)
        server.runtime = start_runtime(settings, backend=backend)
    else:
        server.runtime = start_runtime(settings)
    engine_thread = server.runtime.engine._thread
    assert engine_thread is not None
    (Path(cache_dir) / "engine_tid").write_text(str(engine_thread.native_id))
    loop, http = stack.split("+") if stack != "auto" else ("auto", "auto")
    uvicorn.run(
        app, host="127.0.0.1", port=port, log_config=None, access_log=False, loop=loop, http=http
    )


def thread_seconds(pid: int, engine_tid: int, model_cpu: Path) -> dict[str, float]:
    """CPU seconds so far of the process's main thread (the event loop), of its engine
    thread outside the fake model, and of all the others, from the scheduler's
    nanosecond counts."""
    seconds = {"event_loop": 0.0, "engine": 0.0, "other_threads": 0.0}
    for tid, ran in thread_cpu_seconds(pid).items():
        seconds[{pid: "event_loop", engine_tid: "engine"}.get(tid, "other_threads")] += ran
    seconds["engine"] -= struct.unpack("d", model_cpu.read_bytes())[0]
    return seconds


def request(port: int, tokens: int, stream: bool) -> int:
    """One completion; returns the tokens generated."""
    _seconds, data = completion(port, tokens, stream)
    if not stream:
        return int(json.loads(data)["usage"]["completion_tokens"])
    for line in data.decode().splitlines():
        if line.startswith("data: {") and '"usage"' in line:
            usage = json.loads(line[6:]).get("usage")
            if usage:
                return int(usage["completion_tokens"])
    raise RuntimeError("the stream carried no usage")


def measure(
    pid: int, engine_tid: int, model_cpu: Path, port: int, streams: int, tokens: int, stream: bool
) -> dict[str, float]:
    """µs of CPU per generated token, per thread, over `streams` concurrent requests."""
    generated: list[int] = []
    workers = [
        threading.Thread(target=lambda: generated.append(request(port, tokens, stream)))
        for _ in range(streams)
    ]
    before = thread_seconds(pid, engine_tid, model_cpu)
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    time.sleep(0.3)  # the last chunk's bookkeeping
    after = thread_seconds(pid, engine_tid, model_cpu)
    total = sum(generated)
    return {name: 1e6 * (after[name] - before[name]) / total for name in before}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--step-ms", type=float, default=10.0)
    parser.add_argument("--name", default="serving_cost")
    parser.add_argument("--model", default="fake", help="a model name or path; default fake")
    parser.add_argument(
        "--uvicorn",
        default="auto",
        help="uvicorn's event loop and HTTP parser, e.g. asyncio+h11 (default: its own choice)",
    )
    parser.add_argument("--child-serve", nargs=5, metavar=("PORT", "STEP_MS", "DIR", "MODEL", "UV"))
    args = parser.parse_args()
    if args.child_serve:
        port, step_ms, cache_dir, model, stack = args.child_serve
        serve_child(int(port), float(step_ms), cache_dir, model, stack)
        return

    port = free_port()
    rows: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as cache_dir:
        argv = [
            sys.executable,
            __file__,
            "--child-serve",
            str(port),
            str(args.step_ms),
            cache_dir,
            args.model,
            args.uvicorn,
        ]
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            if not wait_healthy(f"http://127.0.0.1:{port}", seconds=120):
                raise RuntimeError("the server did not become healthy")
            engine_tid = int((Path(cache_dir) / "engine_tid").read_text())
            model_cpu = Path(cache_dir) / "model_cpu"
            request(port, 8, stream=True)  # the first request pays for warming up
            for _ in range(args.reps):
                for streams in (1, 8):
                    for stream in (True, False):
                        key = f"{streams} stream{'s' if streams > 1 else ''}, " + (
                            "streamed" if stream else "one body"
                        )
                        got = measure(
                            process.pid, engine_tid, model_cpu, port, streams, args.tokens, stream
                        )
                        rows.setdefault(key, []).append(got)
                print(json.dumps({k: {n: round(v, 1) for n, v in r[-1].items()}
                                  for k, r in rows.items()}), flush=True)  # fmt: skip
        finally:
            process.terminate()
            process.wait(timeout=30)

    report: dict[str, Any] = {
        "us_cpu_per_token": {
            key: {name: round(statistics.median(r[name] for r in runs), 1) for name in runs[0]}
            for key, runs in rows.items()
        },
        "by_rep": rows,
        "tokens": args.tokens,
        "reps": args.reps,
        "model": args.model,
        "uvicorn": args.uvicorn,
        "step_ms": args.step_ms if args.model == "fake" else None,
        "command": " ".join(["python", "benchmarks/serving_cost.py", *sys.argv[1:]]),
    }
    print(json.dumps(report["us_cpu_per_token"], indent=1))
    print(f"\nwritten to {write_report(args.name, report)}")


if __name__ == "__main__":
    main()
