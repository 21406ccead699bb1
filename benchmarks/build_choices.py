"""What a llama.cpp build choice costs on this host: prompt rate and decode rate.

Compares llama-cpp-python installations (each venv's interpreter given with `--python`),
each loaded with its extra buffer types (CPU_REPACK, AMX where built: the default) and
without them (`use_extra_bufts = False`, the load that avoids ggml's AMX path but also drops
the repacked Q4 kernels). Every measurement runs in a fresh process, alternating, `--reps`
times; the report gives median rates and each choice's median ratio to the first.

    .venv/bin/python benchmarks/build_choices.py --python .venv/bin/python \
        --python /tmp/portable/bin/python --label native-no-amx --label portable-avx2

The child needs only llama_cpp, so any venv with llama-cpp-python installed will do. `--lib`
points one of them at other llama.cpp libraries (LLAMA_CPP_LIB_PATH), such as the AMX build
of `benchmarks/amx_build.sh`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, statistics, sys, time
import llama_cpp

path, extra, n_prompt, n_decode, threads = sys.argv[1], sys.argv[2] == "1", *map(int, sys.argv[3:6])
llama_cpp.llama_log_set(LOG := llama_cpp.llama_log_callback(lambda *a: None), None)
params = llama_cpp.llama_model_default_params()
params.use_extra_bufts = extra
model = llama_cpp.llama_model_load_from_file(path.encode(), params)
cparams = llama_cpp.llama_context_default_params()
cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = 2048, 512, 512
cparams.n_threads = cparams.n_threads_batch = threads
cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
ctx = llama_cpp.llama_init_from_model(model, cparams)
memory = llama_cpp.llama_get_memory(ctx)
batch = llama_cpp.llama_batch_init(512, 0, 1)

def decode(tokens, start):
    for i, token in enumerate(tokens):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, start + i, 1
        batch.seq_id[i][0] = 0
        batch.logits[i] = i == len(tokens) - 1
    batch.n_tokens = len(tokens)
    assert llama_cpp.llama_decode(ctx, batch) == 0

def prompt_rate():
    llama_cpp.llama_memory_seq_rm(memory, 0, -1, -1)
    started = time.perf_counter()
    decode([100 + i % 1000 for i in range(n_prompt)], 0)
    return n_prompt / (time.perf_counter() - started)

def decode_rate():
    llama_cpp.llama_memory_seq_rm(memory, 0, -1, -1)
    decode([100, 200], 0)
    started = time.perf_counter()
    for i in range(n_decode):
        decode([300 + i], 2 + i)
    return n_decode / (time.perf_counter() - started)

prompt_rate(); decode_rate()  # warm up
pp = statistics.median(prompt_rate() for _ in range(3))
tg = decode_rate()
print(json.dumps({"pp": pp, "tg": tg, "system_info": llama_cpp.llama_print_system_info().decode()}))
"""


def measure(
    python: str, lib: str, model: str, extra: bool, args: argparse.Namespace
) -> dict[str, float]:
    argv = [python, "-c", CHILD, model, "1" if extra else "0"]
    argv += [str(args.prompt), str(args.decode), str(args.threads)]
    env = dict(os.environ)
    env.pop("LLAMA_CPP_LIB_PATH", None)
    if lib != "-":
        env["LLAMA_CPP_LIB_PATH"] = lib  # llama-cpp-python loads llama.cpp from there
    completed = subprocess.run(argv, capture_output=True, text=True, env=env)
    if completed.returncode != 0:
        raise RuntimeError(f"{python} failed ({completed.returncode}):\n{completed.stderr[-2000:]}")
    return dict(json.loads(completed.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--python", action="append", required=True)
    parser.add_argument("--label", action="append", required=True)
    parser.add_argument(
        "--lib",
        action="append",
        help="per --python: a directory of llama.cpp libraries to load instead ('-': installed)",
    )
    parser.add_argument("--name", default="build_choices", help="results file name")
    parser.add_argument("--model", default=None, help="GGUF file (default: the embedded model)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--decode", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    assert len(args.python) == len(args.label), "one --label per --python"
    libs = args.lib or ["-"] * len(args.python)
    assert len(libs) == len(args.python), "one --lib per --python, or none"

    sys.path.insert(0, str(Path(__file__).parent))
    from common import write_report

    from reame_core.models import resolve_model

    model = args.model or str(resolve_model(None).path)
    builds = zip(args.label, args.python, libs, strict=True)
    choices = [(label, python, lib, extra) for label, python, lib in builds
               for extra in (True, False)]  # fmt: skip
    runs: dict[str, list[dict[str, float]]] = {}
    infos: dict[str, str] = {}
    for _ in range(args.reps):
        for label, python, lib, extra in choices:
            name = f"{label}, extra bufts {'on' if extra else 'off'}"
            result = measure(python, lib, model, extra, args)
            infos[label] = str(result.pop("system_info"))
            runs.setdefault(name, []).append(result)
            time.sleep(0.5)
    first = next(iter(runs.values()))
    rows = []
    for name, results in runs.items():
        row = {
            "choice": name,
            "pp_tok_s": round(statistics.median(r["pp"] for r in results), 1),
            "tg_tok_s": round(statistics.median(r["tg"] for r in results), 1),
            "pp_vs_first": round(
                statistics.median(r["pp"] / f["pp"] for r, f in zip(results, first, strict=True)),
                3,
            ),
            "tg_vs_first": round(
                statistics.median(r["tg"] / f["tg"] for r, f in zip(results, first, strict=True)),
                3,
            ),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    path = write_report(
        args.name,
        {
            "model": Path(model).name,
            "threads": args.threads,
            "prompt_tokens": args.prompt,
            "decode_tokens": args.decode,
            "reps": args.reps,
            "builds": infos,
            "command": " ".join(["python", *sys.argv]),
            "rows": rows,
        },
    )
    print(f"\nwritten to {path}\n")
    print("| build, load | prompt tok/s | decode tok/s | prompt vs first | decode vs first |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['choice']} | {row['pp_tok_s']} | {row['tg_tok_s']} | "
            f"{row['pp_vs_first']:.2f} | {row['tg_vs_first']:.2f} |"
        )


if __name__ == "__main__":
    main()
