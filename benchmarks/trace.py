"""A realistic workload, end to end: the day of requests in benchmarks/data/trace.jsonl,
replayed with its timing against `reame serve` and llama.cpp's llama-server.

The trace (written by benchmarks/data/make_trace.py, seeded): back-office clients extracting
documents into one JSON schema behind one long shared system prompt, chat sessions of three
turns, rewrites of supplied prose and code, and a nightly batch that sends earlier requests
again byte for byte. Requests leave at their trace times stretched by --pace (arrivals are
open-loop: a slow server gets the next request all the same); a chat turn leaves its think
time after the previous answer, with the conversation so far and ``X-Session-ID``.

Servers, each replay in a fresh process with empty caches, alternating (the order swaps
every repetition):
  reame         `reame serve MODEL` with its defaults: every installed plugin (disk prefix
                cache, Palimpsest, Il Suggeritore, The Conclave), speculation `auto`,
                deterministic, its own choice of slots and context;
  llama-server  the same llama.cpp, model, threads, slots and context per slot, with what
                suits this trace: prompt cache with KV-shift reuse (``--cache-reuse``) and
                its RAM cache of idle slots (on by default), n-gram speculation on the
                context (``--spec-type ngram-simple``, its prompt lookup), and
                ``response_format`` json_schema, which it compiles to a grammar.
Every request streams, greedy. Per replay: the completion time (first request sent to last
answer received), useful output per second (the answers' tokens, counted with the model's
own tokenizer after the replay: a structured answer re-serialised compactly, an invalid
one counted as nothing), time to first token p50/p95 over all requests, and every
structured answer parsed and validated with jsonschema. Ratios are medians of per-repetition
ratios; the host's ceiling (prompt rate / decode rate) is printed beside them.

    .venv/bin/python benchmarks/trace.py --llama-server PATH [--model PATH] [--pace 1.0]
        [--reps 3] [--name NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jsonschema

sys.path.insert(0, str(Path(__file__).parent))
from common import free_port, llama_server, measure, median_ratio, running_server, write_report
from extraction import SCHEMA

TRACE = Path(__file__).parent / "data" / "trace.jsonl"
SERVERS = ("reame", "llama-server")
SESSION_HEADER = "X-Session-ID"
# llama-server's best settings for this trace, beside its slots and context (see above).
LLAMA_SERVER_FLAGS = "--cache-reuse 256 --spec-type ngram-simple"


@dataclass
class Outcome:
    """One request's fate in one replay."""

    id: str
    kind: str
    sent: float  # seconds after the replay started
    ttft: float = 0.0
    latency: float = 0.0
    content: str = ""
    finish_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    valid: bool | None = None  # structured answers only
    error: str | None = None


def load_trace(path: Path = TRACE) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def send(
    client: httpx.AsyncClient,
    url: str,
    request: dict[str, Any],
    messages: list[Any],
    started: float,
) -> Outcome:
    """Stream one chat completion; what arrived, and when."""
    body = {**request["body"], "messages": messages, "stream": True}
    body["stream_options"] = {"include_usage": True}
    headers = {SESSION_HEADER: request["session"]} if "session" in request else {}
    outcome = Outcome(request["id"], request["kind"], time.perf_counter() - started)
    try:
        async with client.stream(
            "POST", f"{url}/v1/chat/completions", json=body, headers=headers
        ) as response:
            if response.status_code == 200:
                await _read(response, outcome, started)
            else:
                await response.aread()
                outcome.error = f"{response.status_code}: {response.text[:200]}"
    except httpx.HTTPError as error:
        outcome.error = repr(error)
    outcome.latency = time.perf_counter() - started - outcome.sent
    return outcome


async def _read(response: httpx.Response, outcome: Outcome, started: float) -> None:
    """The answer's server-sent events into `outcome`: its text, the moment of its first
    piece, its finish reason and usage."""
    pieces: list[str] = []
    async for line in response.aiter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        for choice in chunk.get("choices") or ():
            text = (choice.get("delta") or {}).get("content") or ""
            if text and not outcome.ttft:
                outcome.ttft = time.perf_counter() - started - outcome.sent
            pieces.append(text)
            outcome.finish_reason = choice.get("finish_reason") or outcome.finish_reason
        if chunk.get("usage"):
            outcome.usage = chunk["usage"]
    outcome.content = "".join(pieces)


async def replay(url: str, trace: list[dict[str, Any]], pace: float) -> list[Outcome]:
    """Every request of the trace against `url`, on the trace's clock stretched by `pace`:
    the day's requests, then, once all of them are answered, the night's reruns."""
    started = time.perf_counter()
    # A new connection per request: llama-server at times drops a kept-alive connection.
    limits = httpx.Limits(max_keepalive_connections=0, max_connections=None)

    async with httpx.AsyncClient(timeout=1800, limits=limits) as client:

        async def single(request: dict[str, Any], since: float) -> list[Outcome]:
            await _until(since + request["at"] * pace)
            return [await send(client, url, request, request["body"]["messages"], started)]

        async def conversation(turns: list[dict[str, Any]]) -> list[Outcome]:
            await _until(started + turns[0]["at"] * pace)
            messages = [{"role": "system", "content": turns[0]["system"]}]
            outcomes = []
            for turn in turns:
                await asyncio.sleep(turn["think"] * pace)
                messages.append({"role": "user", "content": turn["user"]})
                outcome = await send(client, url, turn, list(messages), started)
                outcomes.append(outcome)
                messages.append({"role": "assistant", "content": outcome.content})
            return outcomes

        sessions: dict[str, list[dict[str, Any]]] = {}
        for request in trace:
            if request["kind"] == "chat":
                sessions.setdefault(request["session"], []).append(request)
        day = [single(r, started) for r in trace if r["kind"] not in ("chat", "rerun")]
        day += [conversation(turns) for turns in sessions.values()]
        done = await asyncio.gather(*day)
        night = time.perf_counter()
        done += await asyncio.gather(*(single(r, night) for r in trace if r["kind"] == "rerun"))
    order = {request["id"]: i for i, request in enumerate(trace)}
    return sorted((o for outcomes in done for o in outcomes), key=lambda o: order[o.id])


async def _until(moment: float) -> None:
    await asyncio.sleep(max(0.0, moment - time.perf_counter()))


def structured(trace: list[dict[str, Any]]) -> set[str]:
    """The ids of the requests whose answers must follow the schema."""
    return {r["id"] for r in trace if "response_format" in r["body"]}


def check(outcomes: list[Outcome], trace: list[dict[str, Any]]) -> None:
    """Parse and validate every structured answer (sets `valid`)."""
    validator = jsonschema.Draft202012Validator(SCHEMA)
    must = structured(trace)
    for outcome in outcomes:
        if outcome.id in must:
            try:
                outcome.valid = bool(validator.is_valid(json.loads(outcome.content)))
            except ValueError:
                outcome.valid = False


def useful_text(outcome: Outcome) -> str:
    """What the answer is worth to its client: a structured answer as compact JSON (the
    whitespace a server lets the model choose is nobody's output), an invalid one nothing."""
    if outcome.valid is None:
        return outcome.content if outcome.error is None else ""
    if not outcome.valid:
        return ""
    return json.dumps(json.loads(outcome.content), separators=(",", ":"), ensure_ascii=False)


@contextlib.contextmanager
def counter(model_path: Path) -> Iterator[Any]:
    """The model's tokenizer alone (no weights), to count every server's answers alike."""
    import llama_cpp

    llm = llama_cpp.Llama(str(model_path), vocab_only=True, verbose=False)
    try:
        yield lambda text: len(llm.tokenize(text.encode(), add_bos=False, special=False))
    finally:
        llm.close()


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def summary(outcomes: list[Outcome], count: Any) -> dict[str, Any]:
    """One replay's figures."""
    finished = [o for o in outcomes if o.error is None]
    end = max(o.sent + o.latency for o in outcomes)
    useful = sum(count(useful_text(o)) for o in outcomes)
    checked = [o for o in outcomes if o.valid is not None]
    by_kind: dict[str, list[float]] = {}
    for outcome in finished:
        by_kind.setdefault(outcome.kind, []).append(outcome.latency)
    return {
        "completion_s": round(end, 2),
        "useful_tokens": useful,
        "useful_tok_s": round(useful / end, 2),
        "completion_tokens": sum(int(o.usage.get("completion_tokens", 0)) for o in outcomes),
        "cached_prompt_tokens": sum(
            int((o.usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
            for o in outcomes
        ),
        "prompt_tokens": sum(int(o.usage.get("prompt_tokens", 0)) for o in outcomes),
        "ttft_p50_s": round(statistics.median(o.ttft for o in finished), 3),
        "ttft_p95_s": round(percentile([o.ttft for o in finished], 0.95), 3),
        "latency_p50_s": round(statistics.median(o.latency for o in finished), 3),
        "latency_p95_s": round(percentile([o.latency for o in finished], 0.95), 3),
        "mean_latency_by_kind_s": {k: round(statistics.mean(v), 2) for k, v in by_kind.items()},
        "valid": sum(bool(o.valid) for o in checked),
        "structured": len(checked),
        "errors": [f"{o.id}: {o.error}" for o in outcomes if o.error is not None],
        "finish_reasons": dict(
            sorted(
                {
                    r: sum(o.finish_reason == r for o in outcomes)
                    for r in {o.finish_reason or "none" for o in outcomes}
                }.items()
            )
        ),
    }


def reame_server(model: str, threads: int, scratch: str) -> contextlib.AbstractContextManager[str]:
    """`reame serve` as installed, its defaults but for empty stores: the disk prefix cache
    and the generation archive start in `scratch`, as a new install's would."""
    port = free_port()
    reame = os.path.join(os.path.dirname(sys.executable), "reame")
    return running_server(
        [reame, "serve", model, "--port", str(port), "--threads", str(threads),
         "--kv-cache-dir", f"{scratch}/kv", "--palimpsest-dir", f"{scratch}/palimpsest",
         "--log-level", "warning"],
        port,
    )  # fmt: skip


def reame_plan(model: str) -> tuple[int, int]:
    """The slots and context per slot `reame serve` picks for `model` on this host (as
    `reame config` prints them), given to llama-server too."""
    reame = os.path.join(os.path.dirname(sys.executable), "reame")
    printed = subprocess.run(
        [reame, "config", model], capture_output=True, text=True, check=True
    ).stdout
    chosen = dict(line.split()[:2] for line in printed.splitlines() if line[:1].islower())
    return int(chosen["parallel"].rstrip(":")), int(chosen["ctx"].rstrip(":"))


def one_replay(
    server: str,
    args: argparse.Namespace,
    model: str,
    plan: tuple[int, int],
    trace: list[dict[str, Any]],
) -> list[Outcome]:
    """A fresh server, one warm-up request outside the measurement, the trace."""
    slots, ctx = plan
    with tempfile.TemporaryDirectory() as scratch, contextlib.ExitStack() as stack:
        if server == "reame":
            url = stack.enter_context(reame_server(model, args.threads, scratch))
        else:
            url = stack.enter_context(
                llama_server(args.llama_server, args.model_path, args.threads, slots=slots,
                             ctx=slots * ctx, extra=args.llama_server_flags.split())
            )  # fmt: skip
        warm = {"id": "warm", "kind": "warm", "body": {"temperature": 0, "max_tokens": 4}}
        messages = [{"role": "user", "content": "Hello"}]
        asyncio.run(_warm(url, warm, messages))
        outcomes = asyncio.run(replay(url, trace, args.pace))
    check(outcomes, trace)
    return outcomes


async def _warm(url: str, request: dict[str, Any], messages: list[Any]) -> None:
    async with httpx.AsyncClient(timeout=600) as client:
        await send(client, url, request, messages, time.perf_counter())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", help="model alias or .gguf path (default: embedded)")
    parser.add_argument("--llama-server", required=True, help="llama.cpp's llama-server binary")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pace", type=float, default=1.0, help="stretch the trace's clock")
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--name", help="results file name (default: trace_<model>)")
    parser.add_argument(
        "--llama-server-flags",
        default=LLAMA_SERVER_FLAGS,
        help="llama-server's flags beside model, threads, slots and context",
    )
    parser.add_argument("--only", default=",".join(SERVERS), help="servers to run, comma-separated")
    args = parser.parse_args()

    from reame_core.models import resolve_model
    from reame_core.settings import Settings

    model = args.model or Settings().model
    args.model_path = resolve_model(model).path
    trace = load_trace(args.trace)
    slots, ctx = plan = reame_plan(model)
    speculation = str(Path(__file__).parent / "speculation.py")
    host = measure(speculation, "ceiling", "--threads", str(args.threads), "--model", model)
    print(json.dumps({k: round(v, 2) for k, v in host.items()}), flush=True)

    chosen = [name for name in SERVERS if name in args.only.split(",")]
    replays: dict[str, list[list[Outcome]]] = {name: [] for name in chosen}
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in chosen}
    with counter(args.model_path) as count:
        for rep in range(args.reps):
            for server in chosen if rep % 2 == 0 else reversed(chosen):
                outcomes = one_replay(server, args, model, plan, trace)
                replays[server].append(outcomes)
                samples[server].append(summary(outcomes, count))
                print(json.dumps({"rep": rep, "server": server, **samples[server][-1]}), flush=True)
    rows = {server: _row(runs) for server, runs in samples.items()}
    if len(samples) == len(SERVERS):
        rows["reame"]["vs_llama_server"] = round(
            median_ratio(
                [s["useful_tok_s"] for s in samples["reame"]],
                [s["useful_tok_s"] for s in samples["llama-server"]],
            ),
            3,
        )
    name = args.name or "trace_" + Path(model).name.removesuffix(".gguf")
    kinds: dict[str, int] = {}
    for request in trace:
        kinds[request["kind"]] = kinds.get(request["kind"], 0) + 1
    path = write_report(
        name,
        {
            "workload": f"{len(trace)} requests ({kinds}), {args.trace.name}, pace {args.pace}",
            "model": f"{model} ({args.model_path.name})",
            "threads": args.threads,
            "slots": slots,
            "ctx_per_slot": ctx,
            "llama_server_flags": [
                "-np", str(slots), "-c", str(slots * ctx), *args.llama_server_flags.split()
            ],
            "reps": args.reps,
            "command": " ".join(["python", "benchmarks/trace.py", *sys.argv[1:]]),
            "ceiling": host,
            "servers": rows,
            "samples": samples,
            "answers": {
                server: [[asdict(o) for o in outcomes] for outcomes in runs]
                for server, runs in replays.items()
            },
        },
    )  # fmt: skip
    print(f"\nwritten to {path}\n")
    print("| server | completion s | useful tok/s | vs llama-server | TTFT p50 / p95 s | valid |")
    print("|---|---|---|---|---|---|")
    for server, row in rows.items():
        print(
            f"| {server} | {row['completion_s']} | {row['useful_tok_s']} "
            f"| {row.get('vs_llama_server', '')} | {row['ttft_p50_s']} / {row['ttft_p95_s']} "
            f"| {row['valid']} |"
        )


def _row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the repetitions, validity summed."""
    median = {
        key: round(statistics.median(run[key] for run in runs), 3)
        for key in ("completion_s", "useful_tok_s", "ttft_p50_s", "ttft_p95_s",
                    "latency_p50_s", "latency_p95_s")
    }  # fmt: skip
    return {
        **median,
        "useful_tok_s_by_rep": [run["useful_tok_s"] for run in runs],
        "valid": f"{sum(r['valid'] for r in runs)} of {sum(r['structured'] for r in runs)}",
        "errors": sum(len(r["errors"]) for r in runs),
    }


if __name__ == "__main__":
    main()
