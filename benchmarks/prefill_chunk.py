"""What computing prompts in chunks costs, and what it buys: a request arriving while a
long cold prompt is computed.

1. Prompt rate by chunk size: a 512-token prompt computed in calls of 512, 256, 128 and 64
   tokens (the model loaded as `reame serve` loads it), median seconds over the reps.
2. Time to first token of a short request sent while a 1,500-token cold prompt is being
   computed, by the engine with `prefill_chunk` 512 (every call as large as the batch, as
   the engine once computed a prompt alone) and 128 (the default): a call is not
   interrupted, so the short request waits for the call under way. Sent 0.3 s after the
   long one, medians over the reps, each in a fresh runtime.

    .venv/bin/python benchmarks/prefill_chunk.py [--model PATH] [--threads 1] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

CHUNKS = (512, 256, 128, 64)
TEXT = "The quick brown fox jumps over the lazy dog and keeps running through the forest. " * 80


def prompt_seconds(model: Path, threads: int, reps: int) -> dict[int, float]:
    from reame_core.backend.base import Batch
    from reame_core.backend.llama import LlamaBackend

    backend = LlamaBackend(model, n_ctx_seq=2048, n_seq_max=2, n_threads=threads)
    tokens = backend.tokenize(TEXT, add_special=False, parse_special=False)[:512]
    seconds: dict[int, list[float]] = {}
    for _ in range(reps):
        for chunk in CHUNKS:
            backend.seq_rm(0, -1, -1)
            began = time.perf_counter()
            for start in range(0, len(tokens), chunk):
                batch = Batch()
                for i in range(start, min(start + chunk, len(tokens))):
                    batch.add(tokens[i], i, 0, i == len(tokens) - 1)
                backend.decode(batch)
            seconds.setdefault(chunk, []).append(time.perf_counter() - began)
    backend.close()
    return {chunk: statistics.median(values) for chunk, values in seconds.items()}


def arrival_ttft(model: str, threads: int, prefill_chunk: int) -> dict[str, float]:
    """A fresh runtime; the long prompt, then 0.3 s later the short one."""
    from common import empty_cache_dir

    from reame_core.plugins import PluginHost
    from reame_core.request import GenerationRequest, SamplingParams
    from reame_core.runtime import start_runtime
    from reame_core.settings import Settings

    with empty_cache_dir() as cache:
        settings = Settings(
            model=model,
            threads=threads,
            adapt_threads=False,
            prefill_chunk=prefill_chunk,
            speculate="off",
            cache_dir=cache,
        )
        runtime = start_runtime(settings, plugins=PluginHost(discover=False))
        try:
            tokenize = runtime.backend.tokenize
            long_prompt = tokenize(TEXT * 3, add_special=True, parse_special=False)[:1500]
            short_prompt = tokenize("Name three colours.", add_special=True, parse_special=False)
            firsts: dict[str, float] = {}

            def run(name: str, prompt: list[int]) -> None:
                sent = time.perf_counter()

                def first(event: Any) -> None:
                    firsts.setdefault(name, time.perf_counter() - sent)

                request = GenerationRequest(prompt, SamplingParams(max_tokens=4))
                runtime.engine.generate(request, first)

            long = threading.Thread(target=run, args=("long", long_prompt))
            long.start()
            time.sleep(0.3)
            run("short", short_prompt)
            long.join()
            return {"short_ttft_s": firsts["short"], "long_ttft_s": firsts["long"]}
        finally:
            runtime.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", help="model alias or .gguf path (default: embedded)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--name", default="prefill_chunk", help="results file name")
    args = parser.parse_args()

    from common import write_report

    from reame_core.models import resolve_model
    from reame_core.settings import Settings

    model = resolve_model(args.model or Settings().model)
    rates = prompt_seconds(model.path, args.threads, args.reps)
    for chunk in CHUNKS:
        print(f"512 prompt tokens in calls of {chunk}: {rates[chunk]:.3f} s", flush=True)
    arrivals: dict[int, list[dict[str, float]]] = {512: [], 128: []}
    for _ in range(args.reps):
        for chunk in arrivals:  # alternating
            arrivals[chunk].append(arrival_ttft(str(model.path), args.threads, chunk))
            print(f"prefill_chunk {chunk}: {arrivals[chunk][-1]}", flush=True)
    summary = {
        str(chunk): {
            key: round(statistics.median(run[key] for run in runs), 3)
            for key in ("short_ttft_s", "long_ttft_s")
        }
        for chunk, runs in arrivals.items()
    }
    path = write_report(
        args.name,
        {
            "model": model.path.name,
            "threads": args.threads,
            "reps": args.reps,
            "command": " ".join(["python", "benchmarks/prefill_chunk.py", *sys.argv[1:]]),
            "prompt_512_seconds_by_chunk": {str(c): round(s, 3) for c, s in rates.items()},
            "prompt_cost_vs_512": {str(c): round(s / rates[512], 3) for c, s in rates.items()},
            "arrival_during_a_cold_prompt": summary,
            "runs": {str(c): runs for c, runs in arrivals.items()},
        },
    )
    print(summary)
    print(path)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
