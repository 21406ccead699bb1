"""Speculative decoding from a cold start: what prompt lookup gains where output copies
input, what the governor saves where drafts never hit, and which source it picks when a
draft model competes with prompt lookup.

Workloads (single stream, the embedded SmolLM2-135M unless --model):
  rewrite      copy / fix typos / reformat tasks, greedy: output largely repeats the prompt;
  adversarial  free text at temperature 1.0, seeded: drafts are proposed but rarely hit;
  draft-model  the rewrites again, with a draft model loaded as well (--draft-model; by
               default the embedded file drafting for itself: always right, as slow to
               propose as the target is to decode), so prompt lookup and the draft model
               compete.
Modes: off (no drafts), auto (the governor decides), on (every proposal verified in full).
Each measurement starts a fresh Reame runtime (built-in plugins only, an empty cache
directory) in its own process and runs the workload's requests one after another, so
`auto` starts cold, with nothing learned. Modes alternate off/auto/on, `--reps` times; the
figure is generated tokens per second of decoding (prompt time excluded), and ratios are
medians of per-rep ratios: against `off`, and auto against the better of on and off.
Outputs of auto and on are compared with off's of the same rep, token for token, request by
request; acceptance and drafted tokens are totals over every rep. The host's ceiling is
printed too: prompt rate / decode rate bounds what verifying drafts can gain here.

With --llama-server PATH the rewrite workload also runs against llama.cpp's own server
(same model, threads, one slot) without speculation and with its n-gram speculators.

    .venv/bin/python benchmarks/speculation.py [--reps 5] [--llama-server PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from reame_core.bench import texts
from reame_core.settings import Settings

# What a 135M model really copies: tasks whose answer repeats most of the prompt.
REWRITES = (
    "Copy this text exactly, word for word:\n\nDear customer, thank you for your order number "
    "48213. Your package was shipped on Monday and will arrive within three to five business "
    "days. If you have any questions, please reply to this email.",
    "Copy this text exactly, word for word:\n\nInvoice 2291. Date: 12 March 2024. Customer: "
    "Acme Ltd, 14 Harbour Road, Leeds. Items: 3 boxes of paper at 12.50 each, 2 printer "
    "cartridges at 39.99 each. Total due: 117.48. Payment within 30 days.",
    "Copy this text exactly, word for word:\n\nThe quick brown fox jumps over the lazy dog near "
    "the river bank. Every morning, the farmer walks to the market with a basket of fresh "
    "apples, and he sells them to the children who wait by the old stone bridge.",
    "Fix the typos in this paragraph:\n\nThe wether was nice, so we walkd to the park and sat "
    "on a bench under the big oak tree untill the sun went down behind the hills.",
    "Copy this text exactly, word for word:\n\nMeeting notes, 4 June. Present: Anna, Bruno, "
    "Chen. Decisions: the release moves to 18 June; Bruno owns the migration script; Chen "
    "reviews the billing changes by Friday. Next meeting: 11 June at 10:00.",
    "Copy this text exactly, word for word:\n\nProduct: Trail runner shoe, model TR-40. "
    "Sizes 38 to 46. Colours: black, blue, red. Weight 280 g. Waterproof upper, recycled "
    "rubber sole. Price 89 euros. Ships in 2 days.",
)
ADVERSARIAL = texts.ADVERSARIAL  # free text at temperature 1.0, where drafts miss
MODES = ("off", "auto", "on")
WORKLOADS = ("rewrite", "adversarial", "draft-model")


def child(
    mode: str,
    workload: str,
    model: str | None,
    threads: int,
    draft_max: int,
    draft_model: str | None,
) -> dict[str, Any]:
    from common import empty_cache_dir

    from reame_core.chat import encode_chat
    from reame_core.models import resolve_model
    from reame_core.plugins import PluginHost
    from reame_core.request import GenerationRequest, SamplingParams
    from reame_core.runtime import start_runtime

    if workload in ("rewrite", "draft-model"):
        texts, params = REWRITES, SamplingParams(max_tokens=160)
    else:
        texts = ADVERSARIAL
        params = SamplingParams(max_tokens=160, temperature=1.0, seed=7, ignore_eos=True)
    with empty_cache_dir() as cache:
        settings = Settings(
            model=model or Settings().model,
            threads=threads,
            speculate=mode,  # type: ignore[arg-type]
            draft_max=draft_max,
            draft_model=(draft_model or str(resolve_model(model).path))
            if workload == "draft-model"
            else None,
            cache_dir=cache,
        )
        runtime = start_runtime(settings, plugins=PluginHost(discover=False))
        engine, backend = runtime.engine, runtime.backend
        results = [
            engine.generate(
                GenerationRequest(
                    encode_chat(backend.info, [{"role": "user", "content": text}]), params
                )
            )
            for text in texts
        ]
        tokens = sum(result.usage.completion_tokens for result in results)
        decode_ms = sum(result.usage.predicted_ms for result in results)
        proposed = summed([result.usage.draft_proposed for result in results])
        accepted = summed([result.usage.draft_accepted for result in results])
        outputs = [list(result.candidates[0].tokens) for result in results]
        governor = engine.governor.report()
        runtime.close()
    return {
        "tok_s": tokens / (decode_ms / 1000),
        "tokens": tokens,
        "proposed": proposed,
        "accepted": accepted,
        "outputs": outputs,
        "governor": [
            {k: row[k] for k in ("source", "reason", "drafts", "shadow_drafts", "probes")}
            for row in governor["sources"]
        ],
    }


def summed(counts: list[dict[str, int]]) -> dict[str, int]:
    """Per-source counters added up over every rep."""
    total: dict[str, int] = {}
    for each in counts:
        for source, n in each.items():
            total[source] = total.get(source, 0) + n
    return total


def ceiling(model_path: str | None, threads: int, streams: int = 1) -> dict[str, Any]:
    """Prompt rate and plain decode rate of this host for the model (raw backend calls on
    the model loaded as `reame serve` loads it here);
    with `streams` > 1 also llama.cpp's raw decode loop over that many sequences in one
    batch (`batched_decode_tok_s`: the most plain decoding gives with that many answers
    under way)."""
    from reame_core.backend.base import Batch
    from reame_core.runtime import planned_backend

    backend = planned_backend(
        Settings(
            model=model_path or Settings().model,
            threads=threads,
            parallel=max(1, streams),
            ctx=2048,
            log_level="warning",
        )
    )
    prompt_rates, decode_rates = [], []
    for _ in range(3):
        backend.seq_rm(0, -1, -1)
        batch = Batch()
        for position in range(512):
            batch.add(100 + position % 1000, position, 0, position == 511)
        started = time.perf_counter()
        logits = backend.decode(batch)
        prompt_rates.append(512 / (time.perf_counter() - started))
        token = int(logits[0].argmax())
        started = time.perf_counter()
        for position in range(512, 640):
            single = Batch()
            single.add(token, position, 0, True)
            token = int(backend.decode(single)[0].argmax())
        decode_rates.append(128 / (time.perf_counter() - started))
    batched: dict[str, Any] = {}
    if streams > 1:
        from common import raw_decode

        prompts = [[100 + (s * 37 + i) % 1000 for i in range(64)] for s in range(streams)]
        seconds = [raw_decode(backend, prompts, 64)[1] for _ in range(3)]
        batched = {
            "batched_streams": streams,
            "batched_decode_tok_s": streams * 64 / statistics.median(seconds),
        }
    backend.close()
    prompt, decode = statistics.median(prompt_rates), statistics.median(decode_rates)
    return {"prompt_tok_s": prompt, "decode_tok_s": decode, "ceiling": prompt / decode, **batched}


# ----------------------------------------------------------------- llama-server


def llama_server_rates(binary: str, model_path: str, threads: int, spec: list[str]) -> float:
    """Decode tok/s of llama-server on the rewrite workload, as its own timings report."""
    import httpx
    from common import llama_server

    with llama_server(binary, model_path, threads, ctx=2048, extra=spec) as url:
        tokens, ms = 0, 0.0
        for text in REWRITES:
            body = {
                "messages": [{"role": "user", "content": text}],
                "max_tokens": 160,
                "temperature": 0,
                "cache_prompt": False,
            }
            reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600).json()
            tokens += reply["timings"]["predicted_n"]
            ms += reply["timings"]["predicted_ms"]
        return tokens / (ms / 1000)


LLAMA_SERVER_SPECS = {
    "none": [],
    "ngram-simple": ["--spec-type", "ngram-simple"],
    "ngram-map-k": ["--spec-type", "ngram-map-k"],
    "ngram-mod": ["--spec-type", "ngram-mod"],
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", help="model alias or .gguf path (default: embedded)")
    parser.add_argument("--draft-max", type=int, default=Settings().draft_max)
    parser.add_argument(
        "--draft-model", help="draft model of the draft-model workload (default: the model)"
    )
    parser.add_argument(
        "--workloads", nargs="*", default=list(WORKLOADS), choices=WORKLOADS, metavar="NAME"
    )
    parser.add_argument("--llama-server", help="llama.cpp's llama-server binary, to compare")
    parser.add_argument(
        "--name", default="speculation_cold_start", help="results file name (no extension)"
    )
    parser.add_argument("--child", nargs="*")
    args = parser.parse_args()
    if args.child is not None:
        kind, *rest = args.child
        if kind == "ceiling":  # ceiling [STREAMS]
            sys.path.insert(0, str(Path(__file__).parent))
            streams = int(rest[0]) if rest else 1
            print(json.dumps(ceiling(args.model, args.threads, streams)))
        else:
            result = child(
                kind, rest[0], args.model, args.threads, args.draft_max, args.draft_model
            )
            print(json.dumps(result))
        return

    sys.path.insert(0, str(Path(__file__).parent))
    from common import median_ratio, write_report

    script = str(Path(__file__))
    extra = ["--threads", str(args.threads), "--draft-max", str(args.draft_max)]
    extra += ["--model", args.model] if args.model else []
    extra += ["--draft-model", args.draft_model] if args.draft_model else []

    def run(*child_args: str) -> dict[str, Any]:
        from common import measure

        return measure(script, *child_args, *extra)

    host = run("ceiling")
    print(json.dumps({k: round(v, 2) for k, v in host.items()}), flush=True)
    report: dict[str, Any] = {"ceiling": host, "workloads": {}}
    for workload in args.workloads:
        samples: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
        for _ in range(args.reps):
            for mode in MODES:
                samples[mode].append(run(mode, workload))
        rates = {mode: [s["tok_s"] for s in samples[mode]] for mode in MODES}
        best = [max(on, off) for on, off in zip(rates["on"], rates["off"], strict=True)]
        row: dict[str, Any] = {}
        for mode in MODES:
            runs = samples[mode]
            proposed = summed([s["proposed"] for s in runs])
            accepted = summed([s["accepted"] for s in runs])
            total_proposed = sum(proposed.values())
            # Each rep's outputs against the same rep's `off` outputs, request by request.
            same = [
                mine == plain
                for run_, off in zip(runs, samples["off"], strict=True)
                for mine, plain in zip(run_["outputs"], off["outputs"], strict=True)
            ]
            row[mode] = {
                "tok_s": round(statistics.median(rates[mode]), 1),
                "tok_s_by_rep": [round(rate, 1) for rate in rates[mode]],
                "vs_off": round(median_ratio(rates[mode], rates["off"]), 3),
                "acceptance": round(sum(accepted.values()) / total_proposed, 3)
                if total_proposed
                else None,
                "proposed_by_source": proposed,
                "accepted_by_source": accepted,
                "outputs_identical_to_off": f"{sum(same)} of {len(same)}",
            }
        row["auto"]["vs_best_of_on_off"] = round(median_ratio(rates["auto"], best), 3)
        row["auto"]["governor_by_rep"] = [s["governor"] for s in samples["auto"]]
        report["workloads"][workload] = row
        print(json.dumps({workload: row}), flush=True)

    if args.llama_server:
        from reame_core.models import resolve_model

        model_path = str(resolve_model(args.model).path)
        rates: dict[str, list[float]] = {name: [] for name in LLAMA_SERVER_SPECS}
        for _ in range(args.reps):
            for name, spec in LLAMA_SERVER_SPECS.items():
                rates[name].append(
                    llama_server_rates(args.llama_server, model_path, args.threads, spec)
                )
        report["llama_server_rewrite"] = {
            name: {
                "tok_s": round(statistics.median(values), 1),
                "vs_none": round(median_ratio(values, rates["none"]), 3),
            }
            for name, values in rates.items()
        }
        print(json.dumps({"llama_server_rewrite": report["llama_server_rewrite"]}), flush=True)

    report.update(
        threads=args.threads,
        draft_max=args.draft_max,
        reps=args.reps,
        model=args.model or "smollm2-135m (embedded, Q4_1)",
        draft_model=args.draft_model or "the model itself",
        command=" ".join(["python", "benchmarks/speculation.py", *sys.argv[1:]]),
    )
    path = write_report(args.name, report)
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
