"""HTTP load driver: concurrent streaming clients against `reame serve` (or any
OpenAI-compatible server), reporting aggregate tok/s and time to first token p50/p95.

With no --url it starts `reame serve` on the embedded model (or `--serve MODEL`), then measures:
  - serving overhead: one stream over HTTP (read by a plain blocking socket) vs the same
    request through the engine directly (goal >= 95%), alternating; the engine runs in its
    own process, built from the same settings as the server (deterministic or not, plugins
    included), and every measurement on either side gets a prompt nothing has seen before;
  - 1, 4 and 8 concurrent streams, aggregate; with --llama-server PATH also llama.cpp's own
    server on the same model, threads and slots, alternating with Reame within each rep.
With --url it only drives that server.

    .venv/bin/python benchmarks/http_load.py [--tokens 128] [--reps 3]
    .venv/bin/python benchmarks/http_load.py --llama-server PATH  # both, alternating
    .venv/bin/python benchmarks/http_load.py --url http://127.0.0.1:8081 --label other
    .venv/bin/python benchmarks/http_load.py --serve qwen2.5-coder-1.5b --llama-server PATH
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import statistics
import sys
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx

PROMPTS = [
    f"Story number {i}: once upon a time, in a small village by the sea, there lived"
    for i in range(8)
]


async def one_stream(
    client: httpx.AsyncClient, url: str, prompt: str, tokens: int, model: str | None
) -> tuple[float, int]:
    """Stream one completion; returns (seconds to first token, completion tokens)."""
    body = {
        "prompt": prompt,
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if model:
        body["model"] = model
    started = time.perf_counter()
    first = None
    completion_tokens = 0
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        # The client shares the host's cores with the server: parse as little as possible.
        async for line in response.aiter_lines():
            if first is None and '"text":"' in line and '"text":""' not in line:
                first = time.perf_counter() - started
            if '"usage":{' in line:
                completion_tokens = json.loads(line[6:])["usage"]["completion_tokens"]
    return first or 0.0, completion_tokens


def one_stream_blocking(url: str, prompt: str, tokens: int) -> float:
    """The serving-overhead measurement: one stream read with a plain blocking socket, so
    the client's own CPU use (on the server's cores) is as small as it can be."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    body = json.dumps(
        {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
         "stream": True}
    )  # fmt: skip
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)
    started = time.perf_counter()
    connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200, response.status
    while response.read1(65536):
        pass
    elapsed = time.perf_counter() - started
    connection.close()
    return elapsed


def overhead_prompt() -> str:
    """A prompt no slot or prefix cache holds: the overhead is measured on cold prompts."""
    return f"[{secrets.token_hex(4)}] {PROMPTS[0]}"


def server_settings(threads: int, fast: bool) -> list[str]:
    """The settings of the measured server; the engine measurement uses the same. Every
    repetition sends the same greedy requests: answered from remembered answers they would
    measure Reame's memory, not its serving, so recall is off."""
    return ["--parallel", "8", "--ctx", "1024", "--threads", str(threads),
            "--speculate", "off", "--palimpsest-no-recall",
            *(["--no-deterministic"] if fast else [])]  # fmt: skip


def engine_child(
    prompt: str, tokens: int, threads: int, fast: bool, model: str | None
) -> dict[str, float]:
    """One completion through the engine directly, with the server's settings and plugins:
    tokenized as /v1/completions tokenizes, timed from submission to the last token."""
    from reame_core.request import GenerationRequest, SamplingParams
    from reame_core.runtime import start_runtime
    from reame_core.settings import Settings

    settings = Settings(
        parallel=8, ctx=1024, threads=threads, speculate="off", deterministic=not fast,
        log_level="warning", plugins={"palimpsest": {"recall": False}},
        **({"model": model} if model else {}),
    )  # fmt: skip
    runtime = start_runtime(settings)

    def request(text: str, max_tokens: int) -> GenerationRequest:
        ids = runtime.backend.tokenize(text, add_special=True, parse_special=True)
        return GenerationRequest(ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True))

    runtime.engine.generate(request(overhead_prompt(), 8))  # as the server's first request
    measured = request(prompt, tokens)
    started = time.perf_counter()
    finished = runtime.engine.generate(measured)
    seconds = time.perf_counter() - started
    assert len(finished.candidates[0].tokens) == tokens
    runtime.close()
    return {"seconds": seconds}


async def load(url: str, streams: int, tokens: int, model: str | None) -> dict[str, float]:
    # A new connection per request: llama-server (cpp-httplib) at times drops a kept-alive
    # connection as the next request arrives; no server gets reused connections then.
    no_keepalive = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=600, limits=no_keepalive) as client:
        await one_stream(client, url, "Warm up.", 4, model)
        started = time.perf_counter()
        results = await asyncio.gather(
            *(one_stream(client, url, PROMPTS[i], tokens, model) for i in range(streams))
        )
        elapsed = time.perf_counter() - started
    ttfts = sorted(r[0] for r in results)
    total = sum(r[1] for r in results)
    return {
        "seconds": elapsed,
        "tok_s": total / elapsed,
        "ttft_p50": statistics.median(ttfts),
        "ttft_p95": ttfts[min(len(ttfts) - 1, round(0.95 * (len(ttfts) - 1)))],
        "tokens": total,
    }


def reame_server(threads: int, fast: bool, model: str | None) -> AbstractContextManager[str]:
    """Speculation off: the comparison is of serving, and llama-server does not speculate
    by default. `fast`: llama.cpp's fastest settings instead of the deterministic ones."""
    from common import free_port, running_server

    port = free_port()
    return running_server(reame_argv(threads, fast, model, port), port)


def reame_argv(threads: int, fast: bool, model: str | None, port: int) -> list[str]:
    """The command line of `reame_server`, for a caller that runs the process itself."""
    reame = os.path.join(os.path.dirname(sys.executable), "reame")
    return [reame, "serve", *([model] if model else []), "--port", str(port),
            "--log-level", "warning", *server_settings(threads, fast)]  # fmt: skip


def llama_server(binary: str, threads: int, model: str | None) -> AbstractContextManager[str]:
    """llama.cpp's own server on the same model, threads and slots (its default settings)."""
    import common

    from reame_core.models import resolve_model

    return common.llama_server(binary, resolve_model(model).path, threads, slots=8, ctx=8192)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--child", nargs=5, metavar=("PROMPT", "TOKENS", "THREADS", "FAST", "MODEL")
    )
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--url", help="drive this server instead of starting reame serve")
    parser.add_argument("--model", help="model field to send (needed by some servers)")
    parser.add_argument("--label", default="reame")
    parser.add_argument(
        "--serve", help="model both servers run (alias or .gguf; default the embedded one)"
    )
    parser.add_argument("--llama-server", help="llama.cpp's llama-server binary, to compare")
    parser.add_argument(
        "--no-deterministic", action="store_true", help="serve Reame with its fast settings"
    )
    parser.add_argument(
        "--compare",
        action="append",
        default=[],
        metavar="NAME=URL",
        help="also drive this running server in the same alternation (e.g. another Reame build)",
    )
    args = parser.parse_args()
    if args.child:
        prompt, tokens, threads, fast, model = args.child
        print(json.dumps(
            engine_child(prompt, int(tokens), int(threads), fast == "fast", model or None)
        ))  # fmt: skip
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from common import measure, median_ratio, write_report

    rows: list[dict[str, Any]] = []
    overhead = None

    def run_all(servers: dict[str, str]) -> None:
        """1, 4 and 8 streams against each server, alternating servers within each rep."""
        for streams in (1, 4, 8):
            samples: dict[str, list[dict[str, float]]] = {name: [] for name in servers}
            for _ in range(args.reps):
                for name, url in servers.items():
                    samples[name].append(asyncio.run(load(url, streams, args.tokens, args.model)))
            for name, runs in samples.items():
                row: dict[str, Any] = {
                    "server": name,
                    "streams": streams,
                    "tok_s": round(statistics.median(s["tok_s"] for s in runs), 1),
                    "ttft_p50_ms": round(1000 * statistics.median(s["ttft_p50"] for s in runs), 1),
                    "ttft_p95_ms": round(1000 * statistics.median(s["ttft_p95"] for s in runs), 1),
                    "tok_s_by_rep": [round(s["tok_s"], 1) for s in runs],
                }
                if name != "reame" and "reame" in samples:
                    row["reame_vs_this"] = round(
                        median_ratio(
                            [s["tok_s"] for s in samples["reame"]], [s["tok_s"] for s in runs]
                        ),
                        3,
                    )
                rows.append(row)
                print(json.dumps(row), flush=True)

    if args.url:
        run_all({args.label: args.url})
    else:
        http_seconds, engine_seconds = [], []
        fast = "fast" if args.no_deterministic else "deterministic"
        with contextlib.ExitStack() as stack:
            url = stack.enter_context(reame_server(args.threads, args.no_deterministic, args.serve))
            one_stream_blocking(url, overhead_prompt(), 8)  # the server's first request
            for _ in range(args.reps):
                http_seconds.append(one_stream_blocking(url, overhead_prompt(), args.tokens))
                engine_seconds.append(
                    measure(__file__, overhead_prompt(), str(args.tokens), str(args.threads),
                            fast, args.serve or "")["seconds"]
                )  # fmt: skip
            overhead = round(median_ratio(engine_seconds, http_seconds), 3)
            print(json.dumps({"http_vs_engine_one_stream": overhead}), flush=True)
            servers = {"reame": url}
            if args.llama_server:
                servers["llama-server"] = stack.enter_context(
                    llama_server(args.llama_server, args.threads, args.serve)
                )
            servers.update(name_url.split("=", 1) for name_url in args.compare)
            run_all(servers)
    served = args.serve or "SmolLM2-135M"
    path = write_report(
        f"http_load_{args.label}"
        + (f"_{args.serve}" if args.serve else "")
        + ("_fast" if args.no_deterministic else ""),
        {
            "server": args.label,
            "url": args.url
            or "reame serve --speculate off"
            + (" --no-deterministic" if args.no_deterministic else "")
            + f" ({served}, 8 slots, ctx 1024/slot)"
            + (", llama-server -np 8 -c 8192, same model" if args.llama_server else ""),
            "threads": args.threads,
            "tokens_per_stream": args.tokens,
            "reps": args.reps,
            "compared": args.compare,
            "command": " ".join(["python", *sys.argv]),
            "http_vs_engine_one_stream": overhead,
            "rows": rows,
        },
    )
    print(f"\nwritten to {path}\n")
    print("| server | streams | aggregate tok/s | TTFT p50 ms | TTFT p95 ms | Reame / it |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['server']} | {row['streams']} | {row['tok_s']} | {row['ttft_p50_ms']} "
            f"| {row['ttft_p95_ms']} | {row.get('reame_vs_this', '')} |"
        )


if __name__ == "__main__":
    main()
