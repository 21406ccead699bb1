"""Shared pieces of the benchmarks: host facts, isolated measurements, reports.

Every measurement runs in a fresh child process. Two ways of driving llama.cpp in one
process interfere (each calling thread gets its own OpenMP team, and on a 2-core host the
idle team's spinning workers steal cycles), so A and B must not share a process.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import IO, Any

from reame_core.backend.probe_child import AMX_ROWS_ENV, AMX_WIDE_M_ENV, ROW_EXACT_ENV

# The environment as the benchmark started, before a backend sets Reame's switches in it.
_STARTED_WITH = dict(os.environ)

RESULTS = Path(__file__).parent / "results"


def host_description() -> str:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in lscpu.splitlines()
            if line.startswith("Model name")
        ),
        platform.processor() or platform.machine(),
    )
    return f"{model}, {len(os.sched_getaffinity(0))} cores, {platform.machine()}"


def measure(script: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `script --child ARGS` in a fresh interpreter (with `env`, if given, as its
    environment); it prints one JSON line last."""
    completed = subprocess.run(
        [sys.executable, script, "--child", *args],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"measurement {args} failed:\n{completed.stderr[-2000:]}")
    return dict(json.loads(completed.stdout.strip().splitlines()[-1]))


def switch_taking_turns(
    script: str, variable: str, reps: int, *args: str, on: str = "1"
) -> dict[str, list[dict[str, Any]]]:
    """`reps` pairs of fresh `script --child ARGS` processes, one with the environment
    variable `variable` at `on` ("on") and one at "0" ("off"), taking turns at going first
    (a switch read once per process; on a shared host the cores' speed drifts over
    minutes): each side's results in order."""
    runs: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    for rep in range(reps):
        for side in ("on", "off") if rep % 2 == 0 else ("off", "on"):
            switch = on if side == "on" else "0"
            runs[side].append(measure(script, *args, env={**os.environ, variable: switch}))
            print(side, runs[side][-1], flush=True)
    return runs


def memory_mib(model: str) -> dict[str, float]:
    """This process's memory in huge pages (AnonHugePages), its mappings of the model file
    `model` (a resolved path) and their resident pages."""
    huge = resident = mappings = 0
    in_model = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
            in_model = len(fields) == 6 and fields[5] == model
            mappings += in_model
        elif fields[0] == "AnonHugePages:":
            huge += int(fields[1])
        elif fields[0] == "Rss:" and in_model:
            resident += int(fields[1])
    return {
        "anon_huge_pages_mib": round(huge / 1024, 1),
        "file_mappings": mappings,
        "file_mapped_mib": round(resident / 1024, 1),
    }


def timed_decode(backend: Any, batch: Any, digest: Any = None) -> float:
    """The seconds `backend` took to decode `batch`; `digest` (a hashlib object), if given,
    takes every logits row."""
    import numpy as np

    began = time.perf_counter()
    logits = backend.decode(batch)
    seconds = time.perf_counter() - began
    if digest is not None:
        digest.update(np.ascontiguousarray(logits).tobytes())
    return seconds


def repeated_pass(
    backend: Any, batch: Any, start: int, warm: int, timed: int, digest: Any = None
) -> list[float]:
    """Seconds of `timed` passes of `batch` (sequence 0's tokens from position `start` on),
    each taken back after it, after `warm` untimed ones (so that llama.cpp reuses that
    shape's graph); `digest` (a hashlib object), if given, takes the first pass's logits."""
    seconds = []
    for attempt in range(warm + timed):
        elapsed = timed_decode(backend, batch, digest if attempt == 0 else None)
        backend.seq_rm(0, start, -1)
        if attempt >= warm:
            seconds.append(elapsed)
    return seconds


def prompt_and_steps(
    backend: Any, tokens: Sequence[int], prompt: int, steps: int, digest: Any = None
) -> tuple[list[float], list[float]]:
    """Sequence 0's first `prompt` tokens computed three times (the first also faults the
    buffers' pages in), then `steps` one-token steps after them: the seconds each took.
    `digest` (a hashlib object), if given, takes every logits row."""
    from reame_core.backend.base import Batch

    prompt_s = []
    for _ in range(3):
        backend.seq_rm(0, 0)
        batch = Batch()
        for position in range(prompt):
            batch.add(tokens[position], position, 0, position == prompt - 1)
        prompt_s.append(timed_decode(backend, batch, digest))
    step_s = []
    for position in range(prompt, prompt + steps):
        batch = Batch()
        batch.add(tokens[position], position, 0, True)
        step_s.append(timed_decode(backend, batch, digest))
    return prompt_s, step_s


class SwitchedRuns:
    """A build switch's benchmark, measured: its arguments, the model's path, and each
    side's runs ("on", "off") in order. (A plain class: the tests load this module without
    registering it, where a dataclass cannot resolve its annotations.)"""

    def __init__(
        self, args: argparse.Namespace, model: str, runs: dict[str, list[dict[str, Any]]]
    ) -> None:
        self.args = args
        self.model = model
        self.runs = runs

    def logits_agree(self) -> bool:
        """Whether every process, on either side, reported the same logits digests."""
        digests = {
            json.dumps(r["digests"], sort_keys=True) for rs in self.runs.values() for r in rs
        }
        return len(digests) == 1

    def write(self, figures: dict[str, Any]) -> Path:
        """The report under `--name`: model, threads, repetitions, the command, `figures`
        and every run."""
        command = ["python", f"benchmarks/{Path(sys.argv[0]).name}", *sys.argv[1:]]
        return write_report(
            self.args.name,
            {
                "model": Path(self.model).name,
                "threads": self.args.threads,
                "reps": self.args.reps,
                "command": " ".join(command),
                **figures,
                "runs": self.runs,
            },
        )


def switched_benchmark(
    script: str,
    variable: str,
    child: Callable[[str, int], dict[str, Any]],
    reps: int,
    name: str,
    on: str = "1",
) -> SwitchedRuns | None:
    """The command line of a benchmark of a build switch (`--model`, `--reps`, `--threads`,
    `--name`, defaults `reps` and `name`): run as a child, prints `child(model, threads)`'s
    figures and returns None; else runs the children with `variable` at `on` and off taking
    turns (`switch_taking_turns`)."""
    from reame_core.models import resolve_model
    from reame_core.settings import Settings

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", help="model alias or .gguf path (default: embedded)")
    parser.add_argument("--reps", type=int, default=reps)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default=name, help="results file name (no extension)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    model = str(resolve_model(args.model or Settings().model).path)
    if args.child:
        print(json.dumps(child(model, args.threads)), flush=True)
        return None
    runs = switch_taking_turns(
        script, variable, args.reps, "--model", model, "--threads", str(args.threads), on=on
    )
    return SwitchedRuns(args, model, runs)


class Resident:
    """A child process kept alive between measurements: `script --resident ARGS` answers
    each line written to it with one JSON line. Two residents alternating request by
    request see the same state of a noisy host, where separate passes minutes apart do
    not; the one not asked is idle in its read."""

    def __init__(self, script: str, *args: str) -> None:
        self.args = args
        self.process = subprocess.Popen(
            [sys.executable, script, "--resident", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ask(self, line: str) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        if not answer:
            raise RuntimeError(f"resident {self.args} exited ({self.process.wait()})")
        return dict(json.loads(answer))

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=120)


@contextmanager
def empty_cache_dir() -> Iterator[Path]:
    """A new, empty Reame cache directory for one measurement (no KV entries, archive or
    remembered answers) that shares only the user's build checks: whether the build runs
    and how each model's attention times are facts of the build and CPU, taken once, not
    again by every measuring process (two of which, side by side, would time each other)."""
    from reame_core.backend.probe import verdicts_dir
    from reame_core.settings import Settings

    checks = verdicts_dir(Settings().cache_path)
    checks.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as directory:
        cache = Path(directory)
        verdicts_dir(cache).symlink_to(checks, target_is_directory=True)
        yield cache


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(url: str, seconds: float = 60.0) -> bool:
    """Wait until the server at `url` says 200 on /health; False if it has not within
    `seconds`."""
    import httpx

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return False


def stock_environment() -> dict[str, str]:
    """This process's environment without Reame's switches of its build's patches
    (row-exact attention, AMX row kernels and wide products, row groups, read-ahead, huge
    pages, kept graphs, KV regions; set by any process that loaded llama.cpp through Reame):
    llama-server, built from the same patched source, then runs llama.cpp's own ways, as its
    users run it."""
    switches = build_switches()
    return {name: value for name, value in os.environ.items() if name not in switches}


def build_switches() -> tuple[str, ...]:
    """The environment variables of Reame's build's patches."""
    from reame_core.backend.llama import (
        GRAPH_CACHE_ENV,
        GRAPH_CACHE_TOKENS_ENV,
        HUGEPAGES_ENV,
        K_QUANT_ROW_GROUPS_ENV,
        KV_REGIONS_ENV,
        Q4_1_ROW_GROUPS_ENV,
        Q5_0_ROW_GROUPS_ENV,
        Q8_0_ROW_GROUPS_ENV,
        READ_AHEAD_ENV,
        ROW_GROUPS_CHUNK_ENV,
    )

    return (
        ROW_EXACT_ENV, AMX_ROWS_ENV, AMX_WIDE_M_ENV, Q4_1_ROW_GROUPS_ENV, K_QUANT_ROW_GROUPS_ENV,
        Q8_0_ROW_GROUPS_ENV, Q5_0_ROW_GROUPS_ENV, ROW_GROUPS_CHUNK_ENV, READ_AHEAD_ENV,
        HUGEPAGES_ENV, GRAPH_CACHE_ENV, GRAPH_CACHE_TOKENS_ENV, KV_REGIONS_ENV,
    )  # fmt: skip


@contextmanager
def running_server(
    argv: Sequence[str],
    port: int,
    log: IO[bytes] | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[str]:
    """Start an HTTP server process (Reame's or another's) and wait until /health says
    200; yields its base URL and stops the process afterwards. Its log (stderr) goes to
    `log` when given, for what the server reports about itself."""
    process = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=log or subprocess.DEVNULL, env=env
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def llama_server(
    binary: str,
    model_path: str | Path,
    threads: int,
    *,
    slots: int = 1,
    ctx: int = 4096,
    extra: Sequence[str] = (),
) -> AbstractContextManager[str]:
    """llama.cpp's own server on `model_path` with these threads, slots and context (its
    defaults otherwise, plus `extra` flags), running until the block ends; yields its URL."""
    port = free_port()
    argv = llama_server_argv(binary, model_path, threads, port, slots=slots, ctx=ctx, extra=extra)
    return running_server(argv, port, env=stock_environment())


def llama_server_argv(
    binary: str,
    model_path: str | Path,
    threads: int,
    port: int,
    *,
    slots: int = 1,
    ctx: int = 4096,
    extra: Sequence[str] = (),
) -> list[str]:
    """The command line of `llama_server`, for a caller that runs the process itself."""
    return [binary, "-m", str(model_path), "-t", str(threads), "-np", str(slots),
            "-c", str(ctx), "--port", str(port), "--no-webui", *extra]  # fmt: skip


def median_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> float:
    return statistics.median(n / d for n, d in zip(numerators, denominators, strict=True))


def write_report(name: str, report: dict[str, Any]) -> Path:
    """Write `report` as RESULTS/NAME.json, with the date, the host and the build switches
    the benchmark was started with (those not set take Reame's settings)."""
    started_with = {
        switch: _STARTED_WITH[switch] for switch in build_switches() if switch in _STARTED_WITH
    }
    report = {"date": time.strftime("%Y-%m-%d"), "host": host_description(), **report}
    if started_with:
        report["build_switches_set"] = started_with
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """CPU seconds each thread of process `pid` has run so far, by thread id, from the
    scheduler's nanosecond counts (/proc/PID/task/TID/schedstat; Linux)."""
    seconds = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            ran = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0]
        except FileNotFoundError:  # the thread ended
            continue
        seconds[int(tid)] = int(ran) / 1e9
    return seconds


def raw_decode(backend: Any, prompts: Sequence[Sequence[int]], tokens: int) -> tuple[float, float]:
    """llama.cpp's own decode loop on `backend`'s context, no engine: prompt i as sequence
    i, all in one batch, then `tokens` greedy steps of one token per sequence (batch,
    `llama_decode`, argmax, through ctypes). Returns the prompts' seconds and the steps'."""
    import llama_cpp
    import numpy as np

    ctx = backend._ctx
    n = len(prompts)
    batch = llama_cpp.llama_batch_init(max(512, sum(map(len, prompts))), 0, 1)

    def decode(rows: list[tuple[int, int, int, bool]]) -> None:  # seq, token, position, logits
        for i, (seq, token, pos, want) in enumerate(rows):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, pos, 1, want
            batch.seq_id[i][0] = seq
        batch.n_tokens = len(rows)
        assert llama_cpp.llama_decode(ctx, batch) == 0

    try:
        for seq in range(n):
            llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx), seq, -1, -1)
        started = time.perf_counter()
        decode(
            [
                (seq, token, pos, pos == len(prompt) - 1)
                for seq, prompt in enumerate(prompts)
                for pos, token in enumerate(prompt)
            ]
        )
        prompted = time.perf_counter()
        positions = [len(prompt) for prompt in prompts]
        for _ in range(tokens):  # one row of logits per sequence, in sequence order
            logits = np.ctypeslib.as_array(
                llama_cpp.llama_get_logits(ctx), shape=(n, backend.info.n_vocab)
            )
            decode([(seq, int(token), positions[seq], True)
                    for seq, token in enumerate(logits.argmax(axis=1))])  # fmt: skip
            positions = [pos + 1 for pos in positions]
        return prompted - started, time.perf_counter() - prompted
    finally:
        llama_cpp.llama_batch_free(batch)
