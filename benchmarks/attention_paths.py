"""Which of llama.cpp's CPU paths give a token the same logits: flash attention off, on with
f16 keys and values (ggml's own paths, and the row-exact path Reame's build is patched
with), and on with keys cached as q8_0 (values f16).

Reame promises that a greedy request's tokens do not depend on its batch neighbours, on what
the cache held, or on how many threads the host could spare at that moment. Each check below
computes the same tokens along two paths, in one llama.cpp context with one KV stream per
sequence, and reports the largest difference of a logit between them (0 = bit-identical):

  tail chunk of k    a 300-token prompt computed as one chunk, against the same prompt with
                     its last k tokens in a chunk of their own (what reusing a cached prefix
                     of 300 - k tokens does);
  k at a time        the last 100 tokens fed k per call (k = 1: plain decoding; k > 1:
                     verifying a k - 1 token draft), against one token per call;
  threads            a one-token decode after a 300- or 600-token context, with one thread
                     against two (Reame lowers its thread count when neighbours take a core).

    .venv/bin/python benchmarks/attention_paths.py [--model PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from reame_core.backend.probe_child import ROW_EXACT_ENV

TAILS = (1, 2, 8, 32, 63, 64, 65, 128)
STRIDES = (2, 5, 9, 33, 64)


# --child NAME: flash attention, K type, the row-exact path switched on
CONFIGS = {
    "off": (False, "f16", False),
    "on": (True, "f16", False),
    "on-rows": (True, "f16", True),
    "on-k8": (True, "q8_0", False),
}


def measure(model: str | None, config: str) -> dict[str, Any]:
    flash_attn, type_k, row_exact = CONFIGS[config]
    os.environ[ROW_EXACT_ENV] = "1" if row_exact else "0"  # before llama.cpp computes

    from reame_core.backend.base import Batch
    from reame_core.backend.llama import LlamaBackend
    from reame_core.models import resolve_model

    backend = LlamaBackend(
        resolve_model(model).path,
        n_ctx_seq=1024,
        n_seq_max=1,
        n_batch=512,
        n_threads=2,
        deterministic=True,
        flash_attn=flash_attn,
        type_k=type_k,
    )
    vocab = backend.info.n_vocab
    rng = np.random.default_rng(3)
    tokens = [int(t) for t in rng.integers(100, min(vocab, 5000), 700)]

    def rows(sizes: list[int], threads: int = 2) -> np.ndarray:
        """Logits of every token, the prompt fed in chunks of `sizes` (the last chunk with
        `threads` threads)."""
        backend.seq_rm(0, 0, -1)
        backend.set_threads(2)
        out, position = [], 0
        for index, size in enumerate(sizes):
            if index == len(sizes) - 1:
                backend.set_threads(threads)
            batch = Batch()
            for offset in range(size):
                batch.add(tokens[position + offset], position + offset, 0, True)
            out.append(np.array(backend.decode(batch), copy=True))
            position += size
        backend.set_threads(2)
        return np.concatenate(out)

    def gap(a: np.ndarray, b: np.ndarray) -> float:
        return round(float(np.abs(a - b).max()), 4)

    whole = rows([300])
    tail = {k: gap(rows([300 - k, k])[300 - k :], whole[300 - k :]) for k in TAILS}
    single = rows([200] + [1] * 100)[200:]
    strides = {}
    for k in STRIDES:
        sizes = [200] + [k] * (100 // k) + ([100 % k] if 100 % k else [])
        strides[k] = gap(rows(sizes)[200:], single)
    threads = {}
    for context in (300, 600):
        prefix = [256] * ((context - 1) // 256) + [(context - 1) % 256]
        one = rows([*prefix, 1], threads=1)[-1]
        two = rows([*prefix, 1], threads=2)[-1]
        threads[context] = gap(one, two)
    backend.close()
    return {"tail_chunk_vs_one_chunk": tail, "k_at_a_time_vs_one": strides, "threads": threads}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", help="model alias or .gguf path (default: embedded)")
    parser.add_argument("--name", default="attention_paths", help="results file name")
    parser.add_argument("--child", choices=tuple(CONFIGS))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.model, args.child)))
        return

    sys.path.insert(0, str(Path(__file__).parent))
    from common import host_description, write_report
    from common import measure as in_child

    extra = ["--model", args.model] if args.model else []
    report: dict[str, Any] = {
        "flash_attn_off": in_child(__file__, "off", *extra),
        "flash_attn_on": in_child(__file__, "on", *extra),
        "flash_attn_on_row_exact": in_child(__file__, "on-rows", *extra),
        "flash_attn_on_keys_q8_0": in_child(__file__, "on-k8", *extra),
        "model": args.model or "smollm2-135m (embedded, Q4_1)",
        "host": host_description(),
        "command": " ".join(["python", "benchmarks/attention_paths.py", *sys.argv[1:]]),
    }
    print(json.dumps(report, indent=1))
    print(f"\nwritten to {write_report(args.name, report)}")


if __name__ == "__main__":
    main()
