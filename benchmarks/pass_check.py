"""What the server's pass check (reame_core/backend/pass_check.py) finds for a model on this
host: whether a row gets the logits of one-token steps in passes of 2, 4, 8, 17 and 33 tokens
and at the end of prompt chunks of 48, 100 and 146, with Reame's configuration and with one of
its build's switches at another value (default: the K-quant row groups off,
`GGML_K_QUANT_ROW_GROUPS=0`, ggml's own kernels for Q4_K and Q6_K weights). Each setting is
measured in a fresh process (ggml reads a switch once), the model loaded as `reame serve`
loads it, bypassing any kept answer.

    .venv/bin/python benchmarks/pass_check.py [--model ALIAS_OR_PATH] [--name pass_check]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from reame_core.backend.llama import K_QUANT_ROW_GROUPS_ENV


def child(model: str, threads: int) -> None:
    """The check's answer in this fresh process, as one JSON line."""
    from reame_core.backend.llama import k_quant_row_groups
    from reame_core.backend.pass_check import measure
    from reame_core.runtime import planned_backend
    from reame_core.settings import Settings

    backend = planned_backend(Settings(model=model, threads=threads, log_level="warning"))
    check = measure(backend)
    answer = {
        "exact": check.exact,
        "steps_exact": check.steps_exact,
        "differing": list(check.differing),
        "k_quant_row_groups": k_quant_row_groups(),
    }
    backend.close()
    print(json.dumps(answer))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", help="model alias or .gguf path (default: embedded)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--switch", default=K_QUANT_ROW_GROUPS_ENV, help="the other setting's switch"
    )
    parser.add_argument("--value", default="0", help="the other setting's value")
    parser.add_argument("--name", default="pass_check", help="results file name (no extension)")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return

    from common import measure, write_report

    from reame_core.models import resolve_model
    from reame_core.settings import Settings

    model = resolve_model(args.model or Settings().model)
    answers = {
        "reame": measure(__file__, str(model.path), str(args.threads)),
        f"{args.switch}={args.value}": measure(
            __file__, str(model.path), str(args.threads),
            env={**os.environ, args.switch: args.value},
        ),
    }  # fmt: skip
    for setting, answer in answers.items():
        print(setting, answer, flush=True)
    report = {
        "model": model.path.name,
        "threads": args.threads,
        "command": " ".join(["python", "benchmarks/pass_check.py", *sys.argv[1:]]),
        "answers": answers,
    }
    print(write_report(args.name, report))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
