"""A real draft model: Qwen2.5-Coder-0.5B drafting for Qwen2.5-Coder-1.5B (same vocabulary).

Workloads (single stream, greedy unless said):
  code         raw code completion: the start of a Python function, continued by the model;
  rewrite      chat requests whose answer repeats most of the prompt (copy, fix typos);
  prose        chat requests for free explanatory text, nothing to copy from the prompt;
  adversarial  free text at temperature 1.0, seeded: where no draft source should pay.
Modes, each in a fresh process with an empty cache directory and built-in plugins only:
  off     no drafts;
  lookup  the default without a draft model: prompt lookup, governed;
  pair    the default with --draft-model: prompt lookup and the draft model, governed;
  forced  the draft model's every proposal verified in full (`--speculate on`): what it
          would bring if the governor always let it draft;
  file    `pair` drafting from the draft model's file as it is, not its Q4_0 copy
          (`[plugins.draft_model] weights = "file"`; not run unless named in `--modes`).
Modes alternate in the order given, `--reps` times; the figure is generated tokens per second
of decoding (prompt time excluded); ratios are medians of per-rep ratios against `off`.
Outputs are compared with off's of the same rep, request by request (greedy workloads).

    .venv/bin/python benchmarks/draft_pair.py [--reps 3] [--target PATH] [--draft PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from speculation import REWRITES

from reame_core.bench import texts

MODELS = Path.home() / ".cache/reame/models"
TARGET = MODELS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
DRAFT = MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"

PROSE = (
    "Explain how a hash table handles collisions.",
    "Describe what happens when you type a URL into a browser and press enter.",
    "Explain the difference between a process and a thread.",
    "What is a database index and when should you add one?",
)
WORKLOADS = ("code", "rewrite", "prose", "adversarial")
MODES = ("off", "lookup", "pair", "forced")
DRAFTING = ("pair", "forced", "file")


def child(
    mode: str, workload: str, target: str, draft: str, threads: int, max_tokens: int, count: int
) -> Any:
    from common import empty_cache_dir

    from reame_core.chat import encode_chat
    from reame_core.plugins import PluginHost
    from reame_core.request import GenerationRequest, SamplingParams
    from reame_core.runtime import start_runtime
    from reame_core.settings import Settings

    greedy = SamplingParams(max_tokens=max_tokens)
    with empty_cache_dir() as cache:
        settings = Settings(
            model=target,
            threads=threads,
            speculate={"off": "off", "forced": "on"}.get(mode, "auto"),  # type: ignore[arg-type]
            draft_model=draft if mode in DRAFTING else None,
            cache_dir=cache,
            plugins={"draft_model": {"weights": "file" if mode == "file" else "q4_0"}},
        )
        runtime = start_runtime(settings, plugins=PluginHost(discover=False))
        engine, backend = runtime.engine, runtime.backend
        if workload == "code":
            params = greedy
            prompts = [
                backend.tokenize(text, add_special=True, parse_special=False)
                for text in texts.CODE[:count]
            ]
        else:
            chats = {"rewrite": REWRITES, "prose": PROSE, "adversarial": texts.ADVERSARIAL}
            params = greedy
            if workload == "adversarial":
                params = SamplingParams(
                    max_tokens=max_tokens, temperature=1.0, seed=7, ignore_eos=True
                )
            prompts = [
                encode_chat(backend.info, [{"role": "user", "content": text}])
                for text in chats[workload][:count]
            ]
        results = [engine.generate(GenerationRequest(prompt, params)) for prompt in prompts]
        governor = engine.governor.report()
        runtime.close()
    tokens = sum(result.usage.completion_tokens for result in results)
    decode_ms = sum(result.usage.predicted_ms for result in results)
    proposed: dict[str, int] = {}
    accepted: dict[str, int] = {}
    for result in results:
        for source, n in result.usage.draft_proposed.items():
            proposed[source] = proposed.get(source, 0) + n
        for source, n in result.usage.draft_accepted.items():
            accepted[source] = accepted.get(source, 0) + n
    return {
        "tok_s": tokens / (decode_ms / 1000),
        "tokens": tokens,
        "proposed": proposed,
        "accepted": accepted,
        "outputs": [list(result.candidates[0].tokens) for result in results],
        "governor": [
            {
                k: row[k]
                for k in ("source", "reason", "drafts", "shadow_drafts", "probes", "probe_ms")
            }
            for row in governor["sources"]
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--target", default=str(TARGET))
    parser.add_argument("--draft", default=str(DRAFT))
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=4, help="requests per workload (max 4)")
    parser.add_argument(
        "--workloads", nargs="*", default=list(WORKLOADS), choices=WORKLOADS, metavar="NAME"
    )
    parser.add_argument(
        "--modes", nargs="*", default=list(MODES), choices=(*MODES, "file"), metavar="MODE"
    )
    parser.add_argument("--name", default="draft_pair_qwen2.5-coder")
    parser.add_argument("--child", nargs="*")
    args = parser.parse_args()
    if args.child is not None:
        mode, workload = args.child
        result = child(
            mode, workload, args.target, args.draft, args.threads, args.max_tokens, args.prompts
        )
        print(json.dumps(result))
        return

    from common import host_description, measure, median_ratio, write_report

    extra = ["--threads", str(args.threads), "--max-tokens", str(args.max_tokens)]
    extra += ["--prompts", str(args.prompts)]
    extra += ["--target", args.target, "--draft", args.draft]
    modes = ["off", *(mode for mode in dict.fromkeys(args.modes) if mode != "off")]
    report: dict[str, Any] = {"workloads": {}}
    for workload in args.workloads:
        samples: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
        for _ in range(args.reps):
            for mode in modes:
                samples[mode].append(measure(__file__, mode, workload, *extra))
        rates = {mode: [s["tok_s"] for s in samples[mode]] for mode in modes}
        row: dict[str, Any] = {}
        for mode in modes:
            runs = samples[mode]
            same = [
                mine == plain
                for run, off in zip(runs, samples["off"], strict=True)
                for mine, plain in zip(run["outputs"], off["outputs"], strict=True)
            ]
            proposed: dict[str, int] = {}
            accepted: dict[str, int] = {}
            for run in runs:
                for source, n in run["proposed"].items():
                    proposed[source] = proposed.get(source, 0) + n
                for source, n in run["accepted"].items():
                    accepted[source] = accepted.get(source, 0) + n
            row[mode] = {
                "tok_s": round(statistics.median(rates[mode]), 2),
                "tok_s_by_rep": [round(rate, 2) for rate in rates[mode]],
                "vs_off": round(median_ratio(rates[mode], rates["off"]), 3),
                "proposed_by_source": proposed,
                "accepted_by_source": accepted,
                "outputs_identical_to_off": f"{sum(same)} of {len(same)}",
                "governor_last_rep": runs[-1]["governor"],
            }
        for mode, base in (("pair", "lookup"), ("pair", "file")):
            if mode in row and base in row:
                row[mode][f"vs_{base}"] = round(median_ratio(rates[mode], rates[base]), 3)
        report["workloads"][workload] = row
        print(json.dumps({workload: {m: row[m]["vs_off"] for m in modes}}), flush=True)
    report.update(
        host=host_description(),
        threads=args.threads,
        reps=args.reps,
        modes=modes,
        max_tokens=args.max_tokens,
        prompts=args.prompts,
        target=Path(args.target).name,
        draft=Path(args.draft).name,
        command=" ".join(["python", "benchmarks/draft_pair.py", *sys.argv[1:]]),
    )
    path = write_report(args.name, report)
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
