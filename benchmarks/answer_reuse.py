"""A chat's second turn where the first turn's answer is reused as computed, against
recomputed as a prompt chunk.

Where the server's pass check (reame_core/backend/pass_check.py) finds that a row's logits
do not depend on the pass computing it, the engine reuses a generated answer's KV as it is
(`Engine(rows_exact=True)`); elsewhere the deterministic configuration reuses only what was
computed as prompt chunks, on the chunk grid, so a second turn sent without a session
computes the first answer again. For each of 8 questions behind one system prompt: a first
turn (greedy, `ANSWER` tokens), then the second turn (the conversation, the answer as text,
a follow-up), timed by its prompt (`prompt_ms`: what its first token waits for besides a
queue) and its computed prompt tokens. The two configurations alternate, each a fresh engine
on one model loaded as `reame serve` loads it (the host plan's attention and KV); every
second turn's tokens are compared between them and must be equal.

    .venv/bin/python benchmarks/answer_reuse.py [--reps 3] [--model PATH] [--name answer_reuse]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from reame_core.settings import Settings

SYSTEM = (
    "You are the assistant of a small bookshop. Answer briefly and kindly, and never invent "
    "titles, prices or opening hours you were not told. The shop opens from nine to seven, "
    "Monday to Saturday, ships inside the country in two to four days, and takes back any "
    "unread book within thirty days."
)
QUESTIONS = (
    "Recommend a novel for a long train journey.",
    "How should I store old paperbacks?",
    "What makes a good gift for a new reader?",
    "Explain what a first edition is.",
    "Suggest a book club theme for the winter.",
    "How do I choose a dictionary for a student?",
    "Describe a cosy reading corner.",
    "What should I read after a detective novel?",
)
FOLLOW_UP = "Say that again in two sentences."
ANSWER = 128  # tokens of each first answer
CONFIGS = {"recomputed": False, "reused": True}  # rows_exact


def run(engine: Any, info: Any) -> list[dict[str, Any]]:
    from reame_core.chat import encode_chat
    from reame_core.request import GenerationRequest, SamplingParams

    turns = []
    for question in QUESTIONS:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        first = engine.generate(
            GenerationRequest(
                encode_chat(info, messages), SamplingParams(max_tokens=ANSWER, ignore_eos=True)
            )
        )
        messages += [
            {"role": "assistant", "content": first.candidates[0].text},
            {"role": "user", "content": FOLLOW_UP},
        ]
        second = engine.generate(
            GenerationRequest(encode_chat(info, messages), SamplingParams(max_tokens=16))
        )
        turns.append(
            {
                "prompt_tokens": second.usage.prompt_tokens,
                "computed_tokens": second.usage.computed_prompt_tokens,
                "prompt_ms": round(second.usage.prompt_ms, 2),
                "tokens": list(second.candidates[0].tokens),
            }
        )
    return turns


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", help="model alias or .gguf path (default: embedded)")
    parser.add_argument("--name", default="answer_reuse", help="results file name")
    args = parser.parse_args()

    from common import write_report

    from reame_core.backend.pass_check import check_passes
    from reame_core.engine.engine import Engine
    from reame_core.runtime import planned_backend

    settings = Settings(
        model=args.model or Settings().model, threads=args.threads, log_level="warning"
    )
    backend = planned_backend(settings)
    with tempfile.TemporaryDirectory() as cache:
        check = check_passes(backend, Path(cache))
    report: dict[str, Any] = {
        "model": backend.info.name,
        "threads": args.threads,
        "reps": args.reps,
        "command": " ".join(["python", "benchmarks/answer_reuse.py", *sys.argv[1:]]),
        "pass_check": None if check is None else check.model_dump(exclude={"checked_at"}),
    }
    if check is None or not check.exact:
        report["result"] = (
            "rows depend on their pass here: answers are recomputed, nothing to compare"
        )
        print(report["result"], check)
        print(write_report(args.name, report))
        return

    by_config: dict[str, list[list[dict[str, Any]]]] = {name: [] for name in CONFIGS}
    for rep in range(args.reps):
        order = list(CONFIGS) if rep % 2 == 0 else list(reversed(CONFIGS))
        for name in order:
            engine = Engine(backend, speculate="off", exact_reuse=True, rows_exact=CONFIGS[name])
            engine.start()
            try:
                by_config[name].append(run(engine, backend.info))
            finally:
                engine.stop()
    backend.close()

    def pooled(name: str, key: str) -> list[float]:
        return [turn[key] for rep in by_config[name] for turn in rep]

    summary = {
        name: {
            "prompt_ms_median": round(statistics.median(pooled(name, "prompt_ms")), 2),
            "computed_tokens_median": statistics.median(pooled(name, "computed_tokens")),
            "prompt_tokens_median": statistics.median(pooled(name, "prompt_tokens")),
        }
        for name in CONFIGS
    }
    per_rep = [
        statistics.median(r["prompt_ms"] for r in recomputed)
        / statistics.median(r["prompt_ms"] for r in reused)
        for recomputed, reused in zip(by_config["recomputed"], by_config["reused"], strict=True)
    ]
    equal = sum(
        a["tokens"] == b["tokens"]
        for recomputed, reused in zip(by_config["recomputed"], by_config["reused"], strict=True)
        for a, b in zip(recomputed, reused, strict=True)
    )
    report["summary"] = summary
    report["prompt_ms_recomputed_over_reused_by_rep"] = [round(r, 2) for r in per_rep]
    report["second_turns_equal"] = f"{equal} of {len(QUESTIONS) * args.reps}"
    report["turns"] = by_config
    print(summary, report["prompt_ms_recomputed_over_reused_by_rep"], report["second_turns_equal"])
    print(write_report(args.name, report))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
