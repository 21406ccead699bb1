"""Structure drafts without a grammar: what proposing the next list number, bullet or table
pipe gains on list-shaped answers, and what it costs on prose, where it has nothing to say.

Workloads (single stream, greedy, the embedded SmolLM2-135M unless --model):
  lists  chat requests for numbered and bulleted lists (countries, months, tips...);
  prose  stories and descriptions, `ignore_eos`: no list, table or JSON in sight.
Modes, each a fresh Reame runtime in its own process (an empty cache directory), run one
after another, `--reps` times:
  off         no speculation;
  builtins    the governor (auto) with the built-in sources only (prompt lookup);
  structure   the same plus the `suggeritore_structure` source;
  quotes      the same plus the `suggeritore_quote` source: all Il Suggeritore drafts
              without a grammar.
The figure is generated tokens per second of decoding (prompt time excluded); ratios are
medians of per-rep ratios, against `off` and against `builtins` (the source's own share).
Outputs are compared with off's of the same rep, token for token. The structure and quotes
children also replay their outputs through a fresh source of their own (structure, quote)
one token at a time and time each propose call (catching up on the new token, then
proposing): what the engine thread waits for it. The
host's ceiling (prompt rate / decode rate, from benchmarks/speculation.py) is printed too.

    .venv/bin/python benchmarks/structure_drafts.py [--reps 5] [--model PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from reame_core.settings import Settings

LISTS = (
    "Write a numbered list of 20 countries in Europe.",
    "Give me a bulleted list of 20 vegetables.",
    "Make a shopping list with 20 items as bullet points.",
    "List the numbers from 1 to 40 with their names, like 1. one.",
    "Write a numbered list of 15 tips for learning to cook.",
    "List 20 programming languages as a bulleted list.",
    "Write a numbered list of the 12 months of the year.",
)
PROSE = (
    "Write a short story about a lighthouse keeper.",
    "Describe a walk through a forest in autumn.",
    "Write a letter to a friend about your summer holiday.",
    "Tell me about the history of the bicycle.",
)
WORKLOADS = {"lists": LISTS, "prose": PROSE}
MODES = ("off", "builtins", "structure", "quotes")
MAX_TOKENS = 200


def child(mode: str, workload: str, model: str | None, threads: int) -> dict[str, Any]:
    from common import empty_cache_dir

    from reame_core.chat import encode_chat
    from reame_core.plugins import PluginHost
    from reame_core.request import GenerationRequest, SamplingParams
    from reame_core.runtime import start_runtime
    from reame_suggeritore import quotes, structure

    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=workload == "prose")
    host = PluginHost(discover=False)
    if mode in ("structure", "quotes"):
        host.register(structure.StructureDrafts(), structure.NAME)
    if mode == "quotes":
        host.register(quotes.QuoteDrafts(), quotes.NAME)
    with empty_cache_dir() as cache:
        settings = Settings(
            model=model or Settings().model,
            threads=threads,
            speculate="off" if mode == "off" else "auto",
            cache_dir=cache,
        )
        runtime = start_runtime(settings, plugins=host)
        engine, info = runtime.engine, runtime.backend.info
        prompts = [
            encode_chat(info, [{"role": "user", "content": text}]) for text in WORKLOADS[workload]
        ]
        results = [engine.generate(GenerationRequest(prompt, params)) for prompt in prompts]
        governor = engine.governor.report()
        outputs = [list(result.candidates[0].tokens) for result in results]
        timed = {"structure": structure.StructureDrafts, "quotes": quotes.QuoteDrafts}.get(mode)
        propose = propose_cost(timed(), info, prompts, outputs) if timed else None
        runtime.close()
    tokens = sum(result.usage.completion_tokens for result in results)
    decode_ms = sum(result.usage.predicted_ms for result in results)
    return {
        "tok_s": tokens / (decode_ms / 1000),
        "tokens": tokens,
        "proposed": summed([result.usage.draft_proposed for result in results]),
        "accepted": summed([result.usage.draft_accepted for result in results]),
        "outputs": outputs,
        "governor": [
            {k: row[k] for k in ("source", "reason", "drafts", "shadow_drafts", "propose_ms")}
            for row in governor["sources"]
        ],
        "propose_us": propose,
    }


def propose_cost(
    source: Any, info: Any, prompts: list[list[int]], outputs: list[list[int]]
) -> dict[str, Any]:
    """Microseconds of each propose call of `source` (a fresh draft source), replaying the
    outputs one token at a time as the engine would commit them (the first call, which reads
    the prompt, reported apart)."""
    from dataclasses import dataclass, field

    from reame_core.hooktypes import DraftRequest
    from reame_core.settings import Settings

    @dataclass
    class View:
        prompt_tokens: list[int]
        key: int
        output_tokens: list[int] = field(default_factory=list)

    source.reame_configure(Settings(), info)
    first, calls = [], []
    for key, (prompt, output) in enumerate(zip(prompts, outputs, strict=True)):
        view = View(prompt, key)
        for token in [None, *output]:
            if token is not None:
                view.output_tokens.append(token)
            started = time.perf_counter()
            source.reame_propose_drafts([DraftRequest(view, 8)])
            (calls if token is not None else first).append(time.perf_counter() - started)
    calls.sort()
    return {
        "calls": len(calls),
        "median": round(statistics.median(calls) * 1e6, 2),
        "p99": round(calls[int(0.99 * (len(calls) - 1))] * 1e6, 2),
        "first_call_median": round(statistics.median(first) * 1e6, 1),
    }


def summed(counts: list[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for each in counts:
        for source, n in each.items():
            total[source] = total.get(source, 0) + n
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", help="model alias or .gguf path (default: embedded)")
    parser.add_argument(
        "--workloads", nargs="*", default=list(WORKLOADS), choices=WORKLOADS, metavar="NAME"
    )
    parser.add_argument("--name", default="structure_drafts", help="results file name")
    parser.add_argument("--child", nargs="*")
    args = parser.parse_args()
    if args.child is not None:
        kind, *rest = args.child
        if kind == "ceiling":
            from speculation import ceiling

            print(json.dumps(ceiling(args.model, args.threads)))
        else:
            print(json.dumps(child(kind, rest[0], args.model, args.threads)))
        return

    sys.path.insert(0, str(Path(__file__).parent))
    from common import measure, median_ratio, write_report

    script = str(Path(__file__))
    extra = ["--threads", str(args.threads)] + (["--model", args.model] if args.model else [])

    host = measure(script, "ceiling", *extra)
    print(json.dumps({k: round(v, 2) for k, v in host.items()}), flush=True)
    report: dict[str, Any] = {"ceiling": host, "workloads": {}}
    for workload in args.workloads:
        samples: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
        for _ in range(args.reps):
            for mode in MODES:
                samples[mode].append(measure(script, mode, workload, *extra))
        rates = {mode: [s["tok_s"] for s in samples[mode]] for mode in MODES}
        row: dict[str, Any] = {}
        for mode in MODES:
            runs = samples[mode]
            proposed = summed([s["proposed"] for s in runs])
            accepted = summed([s["accepted"] for s in runs])
            tokens = sum(s["tokens"] for s in runs)
            same = [
                mine == plain
                for run, off in zip(runs, samples["off"], strict=True)
                for mine, plain in zip(run["outputs"], off["outputs"], strict=True)
            ]
            row[mode] = {
                "tok_s": round(statistics.median(rates[mode]), 1),
                "tok_s_by_rep": [round(rate, 1) for rate in rates[mode]],
                "vs_off": round(median_ratio(rates[mode], rates["off"]), 3),
                "vs_builtins": round(median_ratio(rates[mode], rates["builtins"]), 3),
                "proposed_by_source": proposed,
                "accepted_by_source": accepted,
                "drafted_share_by_source": {
                    source: round(n / tokens, 3) for source, n in accepted.items()
                },
                "outputs_identical_to_off": f"{sum(same)} of {len(same)}",
                "governor_last_rep": runs[-1]["governor"],
            }
        for mode in ("structure", "quotes"):
            row[mode]["propose_us"] = samples[mode][-1]["propose_us"]
        report["workloads"][workload] = row
        print(json.dumps({workload: row}), flush=True)

    report.update(
        threads=args.threads,
        reps=args.reps,
        max_tokens=MAX_TOKENS,
        model=args.model or "smollm2-135m (embedded, Q4_1)",
        command=" ".join(["python", "benchmarks/structure_drafts.py", *sys.argv[1:]]),
    )
    path = write_report(args.name, report)
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
