"""Engine throughput against the raw llama.cpp ceiling, in one run.

(a) the ceiling: a plain ctypes decode loop over llama.cpp (no engine), with 1, 4 and 8
    sequences decoded together in one batch per step;
(b) the engine with one stream: goal >= 97% of (a) at 1 sequence;
(c) the engine with 4 and 8 concurrent streams, against (a) at 4 and 8 and against
    running the same requests one after another: goal within 5% of (a).

Measurements alternate (raw, engine, raw, engine, ...) and the median ratio is reported.
Every stream is greedy with ignore_eos, so all runs generate exactly the same token count.

    .venv/bin/python benchmarks/engine_throughput.py [--tokens 128] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import threading
import time
from pathlib import Path

import llama_cpp
import numpy as np

from reame_core.backend.llama import LlamaBackend
from reame_core.engine.engine import Engine
from reame_core.models import resolve_model
from reame_core.request import FinishEvent, GenerationRequest, SamplingParams

PROMPTS = [
    f"Story number {i}: once upon a time, in a small village by the sea, there lived"
    for i in range(8)
]


class RawLoop:
    """The ceiling: llama.cpp's C API driven directly, the same context parameters."""

    def __init__(self, backend: LlamaBackend) -> None:
        self.backend = backend
        self.ctx = backend._ctx
        self.batch = llama_cpp.llama_batch_init(backend.info.n_batch, 0, 1)
        self.n_vocab = backend.info.n_vocab

    def run(self, prompts: list[list[int]], n_tokens: int) -> float:
        """Prefill every prompt, then decode `n_tokens` per sequence; returns seconds."""
        memory = llama_cpp.llama_get_memory(self.ctx)
        for seq in range(len(prompts)):
            llama_cpp.llama_memory_seq_rm(memory, seq, -1, -1)
        b = self.batch
        started = time.perf_counter()
        i = 0
        for seq, prompt in enumerate(prompts):
            for pos, token in enumerate(prompt):
                b.token[i], b.pos[i], b.n_seq_id[i] = token, pos, 1
                b.seq_id[i][0] = seq
                b.logits[i] = pos == len(prompt) - 1
                i += 1
        b.n_tokens = i
        assert llama_cpp.llama_decode(self.ctx, b) == 0
        positions = [len(p) for p in prompts]
        for _ in range(n_tokens):
            logits = np.ctypeslib.as_array(
                llama_cpp.llama_get_logits(self.ctx), shape=(len(prompts), self.n_vocab)
            )
            nexts = logits.argmax(axis=1)
            for seq, token in enumerate(nexts):
                b.token[seq], b.pos[seq], b.n_seq_id[seq] = int(token), positions[seq], 1
                b.seq_id[seq][0] = seq
                b.logits[seq] = 1
                positions[seq] += 1
            b.n_tokens = len(prompts)
            assert llama_cpp.llama_decode(self.ctx, b) == 0
        elapsed = time.perf_counter() - started
        for seq in range(len(prompts)):  # hand the sequences back empty, as the engine expects
            llama_cpp.llama_memory_seq_rm(memory, seq, -1, -1)
        return elapsed


def engine_run(engine: Engine, prompts: list[list[int]], n_tokens: int, serial: bool) -> float:
    params = SamplingParams(max_tokens=n_tokens, ignore_eos=True)
    results: list[FinishEvent] = []

    def generate(prompt: list[int]) -> None:
        results.append(engine.generate(GenerationRequest(prompt, params)))

    started = time.perf_counter()
    if serial:
        for prompt in prompts:
            generate(prompt)
    else:
        threads = [threading.Thread(target=generate, args=(p,)) for p in prompts]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    elapsed = time.perf_counter() - started
    for result in results:
        assert result.error is None and len(result.candidates[0].tokens) == n_tokens, result
    return elapsed


def evict(engine: Engine) -> None:
    """Forget resident prefixes so every run prefills its prompt, as the raw loop does."""
    for slot in engine.slots.slots:
        engine.slots.truncate(slot, 0)


def host() -> str:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in lscpu.splitlines()
            if line.startswith("Model name")
        ),
        platform.processor(),
    )
    return f"{model}, {len(__import__('os').sched_getaffinity(0))} cores"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results/engine_throughput.json")
    args = parser.parse_args()

    model = resolve_model(None)
    backend = LlamaBackend(
        model.path,
        n_ctx_seq=1024,
        n_seq_max=8,
        n_batch=512,
        n_threads=args.threads,
        deterministic=True,
        name=model.name,
    )
    prompts = [backend.tokenize(p, add_special=True, parse_special=False) for p in PROMPTS]
    raw = RawLoop(backend)
    engine = Engine(backend)
    engine.start()
    raw.run(prompts[:1], 8)  # warm up
    rows = []
    try:
        for streams in (1, 4, 8):
            batch = prompts[:streams]
            samples: dict[str, list[float]] = {"raw": [], "engine": [], "serial": []}
            for _ in range(args.reps):
                samples["raw"].append(raw.run(batch, args.tokens))
                evict(engine)
                samples["engine"].append(engine_run(engine, batch, args.tokens, serial=False))
                if streams > 1:
                    evict(engine)
                    samples["serial"].append(engine_run(engine, batch, args.tokens, serial=True))
            tokens = streams * args.tokens
            raw_rate = tokens / statistics.median(samples["raw"])
            engine_rate = tokens / statistics.median(samples["engine"])
            ratios = [r / e for r, e in zip(samples["raw"], samples["engine"], strict=True)]
            row = {
                "streams": streams,
                "raw_tok_s": round(raw_rate, 1),
                "engine_tok_s": round(engine_rate, 1),
                "engine_vs_raw": round(statistics.median(ratios), 3),
            }
            if samples["serial"]:
                serial_ratios = [
                    s / e for s, e in zip(samples["serial"], samples["engine"], strict=True)
                ]
                row["serial_tok_s"] = round(tokens / statistics.median(samples["serial"]), 1)
                row["engine_vs_serial"] = round(statistics.median(serial_ratios), 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        engine.stop()
    single = rows[0]["raw_tok_s"]
    for row in rows:
        row["raw_vs_raw_1"] = round(row["raw_tok_s"] / single, 3)
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "host": host(),
        "model": str(model.path.name),
        "threads": args.threads,
        "tokens_per_stream": args.tokens,
        "reps": args.reps,
        "config": "deterministic (per-sequence KV, flash attention off), n_batch 512",
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(
        "\n| streams | raw loop tok/s | engine tok/s | engine / raw | serial tok/s | "
        "engine / serial |"
    )
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['streams']} | {row['raw_tok_s']} | {row['engine_tok_s']} | "
            f"{row['engine_vs_raw']:.3f} | {row.get('serial_tok_s', '-')} | "
            f"{row.get('engine_vs_serial', '-')} |"
        )


if __name__ == "__main__":
    main()
