"""Structured output on a JSON extraction workload: Reame with grammar drafts, Reame without,
and llama.cpp's own llama-server, all constrained by the same JSON schema.

The workload (benchmarks/extraction.py): twenty short documents, each one chat request,
greedy, answered under one 8-field schema (strings, a number, an enum, an array) given as
OpenAI's ``response_format: {"type": "json_schema", ...}``. Configurations:
  reame         `reame serve` defaults: constrained, speculation `auto` (grammar drafts);
  reame-off     the same server, the request field ``"speculate": "off"``: constrained
                decoding without any drafts;
  llama-server  llama.cpp's server (same build of llama.cpp, model, threads; one slot),
                the same ``response_format``, which it turns into a grammar.
Each rep runs the twenty requests in order against each configuration in turn (reame,
reame-off, llama-server; the other way round every second rep), several reps. The figure
is decode tokens per second (prompt time excluded) from each server's own ``timings``
(predicted_n / predicted_ms), summed over the twenty; ratios are medians of per-rep
ratios. Servers may spend different numbers of tokens on the same answer (whitespace
between JSON tokens), so the time each takes to decode all twenty answers is compared too.
Every answer is parsed and validated with jsonschema; Reame's answers with and without
drafts are compared text for text. From Reame's ``timings.drafts``: the share of output
tokens that were accepted drafts, by source. The host's ceiling (prompt rate / decode
rate) is printed next to the result.

Palimpsest is disabled on the Reame server: the reps repeat the same requests, and its
archive would draft them from the previous rep's answers, which no first request gets.

    .venv/bin/python benchmarks/structured_output.py [--model qwen2.5-coder-1.5b] [--reps 3] \
        [--llama-server PATH] [--only reame,reame-off,llama-server] [--name NAME]
    .venv/bin/python benchmarks/structured_output.py --merge RESULTS.json ... --name NAME

A slow model can be measured one rep per run (short quiet windows on a shared host) and the
runs merged: each run alternates the configurations within itself, so its reps stay paired.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import jsonschema

sys.path.insert(0, str(Path(__file__).parent))
from common import free_port, llama_server, measure, median_ratio, running_server, write_report
from extraction import DOCUMENTS, SCHEMA, messages, response_format

CONFIGURATIONS = ("reame", "reame-off", "llama-server")
# What each configuration adds to every request body.
REQUEST_FIELDS: dict[str, dict[str, Any]] = {
    "reame": {},
    "reame-off": {"speculate": "off"},
    "llama-server": {},
}


def reame_server(model: str, threads: int, kv_dir: str) -> AbstractContextManager[str]:
    port = free_port()
    reame = os.path.join(os.path.dirname(sys.executable), "reame")
    return running_server(
        [reame, "serve", model, "--port", str(port), "--threads", str(threads),
         "--log-level", "warning", "--kv-cache-dir", kv_dir,
         "--disable-plugin", "palimpsest"],
        port,
    )  # fmt: skip


def run_workload(url: str, configuration: str, max_tokens: int) -> dict[str, Any]:
    """The twenty requests in order; what the server's timings say, and every answer."""
    validator = jsonschema.Draft202012Validator(SCHEMA)
    predicted_n, predicted_ms = 0, 0.0
    accepted: dict[str, int] = {}
    proposed: dict[str, int] = {}
    answers: list[str] = []
    valid: list[bool] = []
    finish_reasons: dict[str, int] = {}
    # A new connection per request: llama-server at times drops a kept-alive connection.
    limits = httpx.Limits(max_keepalive_connections=0)
    started = time.perf_counter()
    with httpx.Client(timeout=900, limits=limits) as client:
        for document in DOCUMENTS:
            body = {
                "messages": messages(document),
                "temperature": 0,
                "max_tokens": max_tokens,
                "response_format": response_format(),
                **REQUEST_FIELDS[configuration],
            }
            reply = client.post(f"{url}/v1/chat/completions", json=body)
            reply.raise_for_status()
            data = reply.json()
            choice = data["choices"][0]
            answer = choice["message"]["content"] or ""
            answers.append(answer)
            valid.append(_valid(validator, answer))
            reason = choice.get("finish_reason") or "?"
            finish_reasons[reason] = finish_reasons.get(reason, 0) + 1
            timings = data["timings"]
            predicted_n += int(timings["predicted_n"])
            predicted_ms += float(timings["predicted_ms"])
            for source, counts in (timings.get("drafts") or {}).items():
                proposed[source] = proposed.get(source, 0) + int(counts["proposed"])
                accepted[source] = accepted.get(source, 0) + int(counts["accepted"])
    return {
        "tok_s": predicted_n / (predicted_ms / 1000),
        "tokens": predicted_n,
        "decode_seconds": predicted_ms / 1000,
        "wall_seconds": time.perf_counter() - started,
        "valid": sum(valid),
        "answers": answers,
        "finish_reasons": finish_reasons,
        "proposed_by_source": proposed,
        "accepted_by_source": accepted,
    }


def _valid(validator: jsonschema.Draft202012Validator, answer: str) -> bool:
    try:
        return bool(validator.is_valid(json.loads(answer)))
    except ValueError:
        return False


def summarise(samples: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """One row per configuration: medians, ratios of per-rep rates, validity, draft shares."""
    rates = {name: [s["tok_s"] for s in runs] for name, runs in samples.items()}
    rows: dict[str, Any] = {}
    for name, runs in samples.items():
        tokens = sum(s["tokens"] for s in runs)
        accepted = _summed([s["accepted_by_source"] for s in runs])
        proposed = _summed([s["proposed_by_source"] for s in runs])
        row: dict[str, Any] = {
            "decode_tok_s": round(statistics.median(rates[name]), 2),
            "decode_tok_s_by_rep": [round(rate, 2) for rate in rates[name]],
            "decode_seconds_by_rep": [round(s["decode_seconds"], 1) for s in runs],
            "wall_seconds_by_rep": [round(s["wall_seconds"], 1) for s in runs],
            "valid": f"{sum(s['valid'] for s in runs)} of {len(DOCUMENTS) * len(runs)}",
            "output_tokens": tokens,
            "finish_reasons": _summed([s["finish_reasons"] for s in runs]),
        }
        if proposed:
            row["drafted_share_by_source"] = {
                source: round(accepted.get(source, 0) / tokens, 3) for source in proposed
            }
            row["acceptance_by_source"] = {
                source: round(accepted.get(source, 0) / count, 3)
                for source, count in proposed.items()
            }
            row["accepted_by_source"] = accepted
            row["proposed_by_source"] = proposed
        rows[name] = row
    if "reame" in samples and "reame-off" in samples:
        rows["reame"]["vs_reame_off"] = round(median_ratio(rates["reame"], rates["reame-off"]), 3)
        same = [
            mine == plain
            for run, off in zip(samples["reame"], samples["reame-off"], strict=True)
            for mine, plain in zip(run["answers"], off["answers"], strict=True)
        ]
        rows["reame"]["answers_identical_to_reame_off"] = f"{sum(same)} of {len(same)}"
    if "llama-server" in samples:
        # Servers may spend different numbers of tokens on the same answers (whitespace in
        # the JSON): the rate is the goal's figure, the time to decode all twenty the user's.
        theirs = [s["decode_seconds"] for s in samples["llama-server"]]
        for name in ("reame", "reame-off"):
            if name in samples:
                rows[name]["vs_llama_server"] = round(
                    median_ratio(rates[name], rates["llama-server"]), 3
                )
                mine = [s["decode_seconds"] for s in samples[name]]
                rows[name]["decode_time_vs_llama_server"] = round(median_ratio(theirs, mine), 3)
    return rows


def _summed(counts: list[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for each in counts:
        for key, n in each.items():
            total[key] = total.get(key, 0) + n
    return total


def measure_reps(args: argparse.Namespace, model: str) -> dict[str, Any]:
    """The host's ceiling, then `args.reps` reps of every chosen configuration in turn."""
    from reame_core.models import resolve_model

    model_path = resolve_model(model).path
    chosen = [name for name in CONFIGURATIONS if name in args.only.split(",")]
    if "llama-server" in chosen and not args.llama_server:
        chosen.remove("llama-server")
    speculation = str(Path(__file__).parent / "speculation.py")
    host = measure(speculation, "ceiling", "--threads", str(args.threads), "--model", model)
    print(json.dumps({k: round(v, 2) for k, v in host.items()}), flush=True)

    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in chosen}
    with contextlib.ExitStack() as stack:
        urls: dict[str, str] = {}
        if {"reame", "reame-off"} & set(chosen):
            kv_dir = stack.enter_context(tempfile.TemporaryDirectory())
            reame_url = stack.enter_context(reame_server(model, args.threads, kv_dir))
            urls.update({name: reame_url for name in ("reame", "reame-off")})
        if "llama-server" in chosen:
            urls["llama-server"] = stack.enter_context(
                llama_server(args.llama_server, model_path, args.threads)
            )
        for name in chosen:  # warm each server once, outside the measurement
            run_workload(urls[name], name, 8)
        for rep in range(args.reps):
            for name in chosen if rep % 2 == 0 else list(reversed(chosen)):
                sample = run_workload(urls[name], name, args.max_tokens)
                samples[name].append(sample)
                shown = {k: v for k, v in sample.items() if k != "answers"}
                print(json.dumps({"rep": rep, "configuration": name, **shown}), flush=True)
    return {
        "model_file": model_path.name,
        "threads": args.threads,
        "max_tokens": args.max_tokens,
        "ceilings": [host],
        "samples": samples,
    }


def merged(paths: list[str]) -> dict[str, Any]:
    """The reps of earlier runs of the same workload and model, as one measurement: each run
    alternated its configurations within itself, so its reps pair up as they were taken."""
    runs = [json.loads(Path(path).read_text()) for path in paths]
    samples: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        for name, reps in run["samples"].items():
            samples.setdefault(name, []).extend(reps)
    return {
        **{key: runs[0][key] for key in ("model_file", "threads", "max_tokens")},
        "ceilings": [ceiling for run in runs for ceiling in run["ceilings"]],
        "samples": samples,
        "merged_from": [Path(path).name for path in paths],
        "commands": [run["command"] for run in runs],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", help="model alias or .gguf path (default: embedded)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--llama-server", help="llama.cpp's llama-server binary, to compare")
    parser.add_argument(
        "--only", default=",".join(CONFIGURATIONS), help="configurations to run, comma-separated"
    )
    parser.add_argument(
        "--merge", nargs="+", metavar="RESULTS", help="combine the reps of earlier results files"
    )
    parser.add_argument("--name", help="results file name (default: from the model)")
    args = parser.parse_args()

    from reame_core.settings import Settings

    model = args.model or Settings().model
    measured = merged(args.merge) if args.merge else measure_reps(args, model)
    samples = measured["samples"]
    rows = summarise(samples)
    name = args.name or "structured_output_" + Path(model).name.removesuffix(".gguf")
    path = write_report(
        name,
        {
            "workload": f"JSON extraction: {len(DOCUMENTS)} documents, one 8-field schema, "
            "chat completions, greedy, response_format json_schema",
            "model": f"{model} ({measured['model_file']})",
            "reps": len(next(iter(samples.values()))),
            "command": " ".join(["python", "benchmarks/structured_output.py", *sys.argv[1:]]),
            "configurations": rows,
            **measured,
        },
    )
    print(f"\nwritten to {path}\n")
    print("| configuration | decode tok/s | vs reame-off | vs llama-server | valid | drafted |")
    print("|---|---|---|---|---|---|")
    for config, row in rows.items():
        shares = row.get("drafted_share_by_source", {})
        drafted = ", ".join(f"{source} {share:.0%}" for source, share in shares.items())
        print(
            f"| {config} | {row['decode_tok_s']} | {row.get('vs_reame_off', '')} "
            f"| {row.get('vs_llama_server', '')} | {row['valid']} | {drafted} |"
        )


if __name__ == "__main__":
    main()
