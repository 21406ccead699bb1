"""Exact repeats answered from remembered answers, against drafting them from the archive.

20 chat requests (greedy, at most 96 tokens; the `exact` workload of palimpsest.py), then
the same 20 again in a new process on the same archive directory, one after another:
  first     the first pass (nothing remembered, nothing archived yet);
  recalled  the second pass, recall on (the default): each answer sent from the shelf;
  drafted   the second pass, recall off: drafted from the archive, verified by the model.
Every pass is a fresh process with its own empty cache directory (no prefix reuse across
passes); each rep has its own archive directory and runs recalled and drafted in
alternating order. The figure is wall time for the 20 requests as the engine's caller
waits for them (prompts included); ratios are medians of per-rep ratios to the first pass.
The recalled answers are compared with the first pass's token for token.

    .venv/bin/python benchmarks/recall.py [--reps 3] [--model PATH] [--name recall]
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

from palimpsest import EXACT, MAX_TOKENS

from reame_core.settings import Settings


def child(recall: bool, archive: str, model: str | None, threads: int) -> dict[str, Any]:
    """One pass in this (fresh) process."""
    from common import empty_cache_dir

    from reame_core.chat import encode_chat
    from reame_core.plugins import PluginHost
    from reame_core.request import GenerationRequest, SamplingParams
    from reame_core.runtime import start_runtime
    from reame_palimpsest.plugin import Palimpsest

    plugins = PluginHost(discover=False)
    plugin = Palimpsest()
    plugins.register(plugin, "palimpsest")
    with empty_cache_dir() as cache:
        settings = Settings(
            model=model or Settings().model,
            threads=threads,
            cache_dir=cache,
            plugins={"palimpsest": {"dir": archive, "recall": recall}},
        )
        runtime = start_runtime(settings, plugins=plugins)
        assert plugin.archivist is not None and plugin.archivist.ready.wait(120)
        engine, info = runtime.engine, runtime.backend.info
        requests = [
            GenerationRequest(
                encode_chat(info, [{"role": "user", "content": text}]),
                SamplingParams(max_tokens=MAX_TOKENS),
            )
            for text in EXACT
        ]
        started = time.perf_counter()
        results = [engine.generate(request) for request in requests]
        seconds = time.perf_counter() - started
        assert plugin.flush()
        runtime.close()
    return {
        "seconds": seconds,
        "tokens": sum(r.usage.completion_tokens for r in results),
        "recalled_tokens": sum(r.usage.recalled_tokens for r in results),
        "drafted_accepted": sum(sum(r.usage.draft_accepted.values()) for r in results),
        "outputs": [list(r.candidates[0].tokens) for r in results],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", help="model alias or .gguf path (default: embedded)")
    parser.add_argument("--name", default="recall", help="results file name (no extension)")
    parser.add_argument("--child", nargs="*")
    args = parser.parse_args()
    if args.child is not None:
        recall, archive = args.child
        print(json.dumps(child(recall == "on", archive, args.model, args.threads)))
        return

    from common import measure, write_report

    script = str(Path(__file__))
    extra = ["--threads", str(args.threads), *(["--model", args.model] if args.model else [])]
    samples: list[dict[str, Any]] = []
    for rep in range(args.reps):
        with tempfile.TemporaryDirectory() as archive:
            first = measure(script, "on", archive, *extra)
            second = {}
            order = ("recalled", "drafted") if rep % 2 == 0 else ("drafted", "recalled")
            for config in order:
                second[config] = measure(
                    script, "on" if config == "recalled" else "off", archive, *extra
                )
        sample = {
            "rep": rep,
            "first_s": round(first["seconds"], 3),
            "recalled_s": round(second["recalled"]["seconds"], 3),
            "drafted_s": round(second["drafted"]["seconds"], 3),
            "tokens": first["tokens"],
            "recalled_tokens": second["recalled"]["recalled_tokens"],
            "drafted_accepted": second["drafted"]["drafted_accepted"],
            "recalled_same_as_first": sum(
                a == b for a, b in zip(second["recalled"]["outputs"], first["outputs"], strict=True)
            ),
            "drafted_same_as_first": sum(
                a == b for a, b in zip(second["drafted"]["outputs"], first["outputs"], strict=True)
            ),
        }
        samples.append(sample)
        print(json.dumps(sample), flush=True)

    def ratio(config: str) -> float:
        return round(statistics.median(s["first_s"] / s[f"{config}_s"] for s in samples), 2)

    path = write_report(
        args.name,
        {
            "model": args.model or "embedded SmolLM2-135M",
            "threads": args.threads,
            "reps": args.reps,
            "requests": len(EXACT),
            "max_tokens": MAX_TOKENS,
            "command": " ".join(["python", "benchmarks/recall.py", *sys.argv[1:]]),
            "recalled_vs_first": ratio("recalled"),
            "drafted_vs_first": ratio("drafted"),
            "samples": samples,
        },
    )
    print(path)


if __name__ == "__main__":
    main()
