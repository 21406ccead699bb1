"""What a grammar costs per token: computing llguidance's mask, and applying it to a row.

Il Suggeritore masks every row a constrained sequence samples or verifies, on the engine
thread, between two decodes: each microsecond there is one every running stream waits. This
walks a valid answer to an invoice schema token by token, as a constrained sequence would,
and times at each position:

- the mask: llguidance's `unsafe_compute_mask_ptr` into the constraint's own buffer;
- applying it to the float32 logits row: the plugin's `bitmask.apply`
  (refilling the row around the few allowed tokens where there are few), and, for
  reference, llguidance's own numpy `apply_token_bitmask_inplace`;
- the forced tokens (`compute_ff_tokens`), the draft source's work per step;
- consuming the token, and copying a compiled matcher (one per sequence).

On two vocabularies: SmolLM2's (49,152 tokens) and Qwen2.5's (151,936; the Qwen2.5-Coder
0.5B file in Reame's model cache, if there). Also: building the tokenizer from the
vocabulary and compiling the schema. No decoding: the numbers are the grammar's alone.

    .venv/bin/python benchmarks/grammar_mask_cost.py [--model PATH ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import measure, write_report

INVOICE = {
    "type": "object",
    "properties": {
        "invoice_number": {"type": "string", "pattern": "^INV-[0-9]{4}$"},
        "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
        "vendor": {"type": "string", "maxLength": 40},
        "currency": {"enum": ["EUR", "USD", "GBP"]},
        "lines": {
            "type": "array",
            "minItems": 1,
            "maxItems": 5,
            "items": {
                "type": "object",
                "properties": {
                    "item": {"type": "string", "maxLength": 30},
                    "quantity": {"type": "integer", "minimum": 1, "maximum": 1000},
                    "unit_price": {"type": "number", "minimum": 0},
                },
                "required": ["item", "quantity", "unit_price"],
                "additionalProperties": False,
            },
        },
        "total": {"type": "number", "minimum": 0},
        "paid": {"type": "boolean"},
        "notes": {"type": "string", "maxLength": 80},
    },
    "required": ["invoice_number", "date", "vendor", "currency", "lines", "total", "paid"],
    "additionalProperties": False,
}
ANSWER = {
    "invoice_number": "INV-2291",
    "date": "2024-03-12",
    "vendor": "Cartoleria Rossi",
    "currency": "EUR",
    "lines": [
        {"item": "paper, A4 box", "quantity": 3, "unit_price": 12.5},
        {"item": "printer cartridge", "quantity": 2, "unit_price": 39.99},
    ],
    "total": 117.48,
    "paid": False,
}
REPEAT = 9


def _us(work: Callable[[], Any], repeat: int = REPEAT) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return 1e6 * statistics.median(times)


def child(path: str) -> dict[str, Any]:
    import llguidance
    import llguidance.numpy

    from reame_core.backend.llama import LlamaBackend
    from reame_suggeritore import bitmask
    from reame_suggeritore.grammars import LIMITS
    from reame_suggeritore.request_grammar import JSON_OPTIONS
    from reame_suggeritore.tokenizer import build_tokenizer, end_of_sequence

    backend = LlamaBackend(path, n_ctx_seq=256, n_seq_max=1, n_threads=1)
    model = backend.info
    started = time.perf_counter()
    tokenizer = build_tokenizer(model)
    tokenizer_s = time.perf_counter() - started

    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        json.dumps(INVOICE),
        defaults=JSON_OPTIONS,  # type: ignore[arg-type]
    )
    started = time.perf_counter()
    prototype = llguidance.LLMatcher(tokenizer, grammar, log_level=0, limits=LIMITS)
    prototype.compute_bitmask()
    compile_ms = 1000 * (time.perf_counter() - started)
    assert not prototype.is_error(), prototype.get_error()

    text = json.dumps(ANSWER, separators=(", ", ": "))
    tokens = model.vocab.tokenize(text, add_special=False, parse_special=False)
    matcher = prototype.deep_copy()
    n_vocab = model.n_vocab
    mask = np.zeros((tokenizer.vocab_size + 31) // 32, dtype=np.int32)
    eos = end_of_sequence(model)
    eog = np.array(sorted(model.eog | {eos}), dtype=np.int64)
    row = np.random.default_rng(0).standard_normal(n_vocab).astype(np.float32)
    rows: list[dict[str, Any]] = []
    for token in tokens:

        def compute() -> None:
            matcher.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)

        mask_us = _us(compute)
        allowed = bitmask.allowed_ids(mask, np.flatnonzero(mask), n_vocab)
        assert token in allowed, f"the answer's token {token} is not allowed"
        count = len(allowed)
        sparse = len(np.flatnonzero(mask)) <= bitmask.FEW_WORDS

        def plugin_apply() -> None:
            logits = row.copy()
            bitmask.apply(logits, mask, eos, eog)

        def reference_apply() -> None:
            logits = row.copy()
            llguidance.numpy.apply_token_bitmask_inplace(logits, mask)

        copy_us = _us(row.copy)
        rows.append(
            {
                "allowed": count,
                "sparse": sparse,
                "mask_us": mask_us,
                "apply_us": _us(plugin_apply) - copy_us,
                "llguidance_numpy_apply_us": _us(reference_apply, 3) - copy_us,
                "forced_us": _us(matcher.compute_ff_tokens),
                "forced_tokens": len(matcher.compute_ff_tokens()),
            }
        )
        assert matcher.consume_token(token)
    consume_us = _us(lambda: (matcher.rollback(1), matcher.consume_token(tokens[-1])))
    copy_matcher_us = _us(prototype.deep_copy)
    backend.close()

    def median(key: str, subset: list[dict[str, Any]] | None = None) -> float:
        return round(statistics.median(r[key] for r in (subset or rows)), 1)

    sparse = [r for r in rows if r["sparse"]]
    dense = [r for r in rows if not r["sparse"]]
    return {
        "n_vocab": n_vocab,
        "tokenizer_s": round(tokenizer_s, 3),
        "compile_ms": round(compile_ms, 2),
        "answer_tokens": len(tokens),
        "forced_share": round(sum(1 for r in rows if r["forced_tokens"]) / len(rows), 3),
        "mask_us_median": median("mask_us"),
        "mask_us_p90": round(float(np.percentile([r["mask_us"] for r in rows], 90)), 1),
        "mask_us_max": round(max(r["mask_us"] for r in rows), 1),
        "apply_us_median": median("apply_us"),
        "apply_us_sparse_median": median("apply_us", sparse) if sparse else None,
        "apply_us_dense_median": median("apply_us", dense) if dense else None,
        "positions_sparse": len(sparse),
        "positions_dense": len(dense),
        "llguidance_numpy_apply_us_median": median("llguidance_numpy_apply_us"),
        "forced_us_median": median("forced_us"),
        "consume_us": round(consume_us, 1),
        "deep_copy_us": round(copy_matcher_us, 1),
    }


def main() -> None:
    from reame_core.models import resolve_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help="GGUF file (repeatable)")
    args = parser.parse_args()
    paths = args.model
    if not paths:
        paths = [str(resolve_model(None).path)]
        qwen = Path.home() / ".cache/reame/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
        if qwen.exists():
            paths.append(str(qwen))
    results = {Path(path).name: measure(__file__, path) for path in paths}
    for name, result in results.items():
        print(f"{name}: {json.dumps(result)}")
    path = write_report(
        "grammar_mask_cost",
        {
            "command": "python benchmarks/grammar_mask_cost.py",
            "schema": "invoice: 8 fields, nested line items, pattern, enum, bounded numbers",
            "answer": json.dumps(ANSWER, separators=(", ", ": ")),
            "models": results,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2])))
    else:
        main()
