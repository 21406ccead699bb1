"""How far logits drift between two ways of computing the same tokens, on this build.

Where llama.cpp does not guarantee bit-identical logits along two paths (DESIGN
"Determinism"), greedy outputs may part ways, but only at a position where the plain path's
best token led another by less than the drift. This measures that drift, so the real-model
tests can bound a divergence by what the build shows instead of by a guess.

Two pairs of paths, teacher-forced on the plain path's own greedy tokens:

    verify   deterministic configuration (per-sequence KV; flash attention on with q8_0 keys,
             or with --flash-attn off, off with f16 keys and values): a sequence
             decoded one token per step (plain) vs. in steps of 1 + k tokens, as verifying
             k drafts computes them (k = 4 and 8); on the embedded Q4_1 model and a Q8_0
             copy of it (the target of the draft-model test).
    batch    fast configuration (unified KV, flash attention on): each of eight sequences
             decoded alone (plain) vs. all eight in one batch per step.

For each position, the plain row's best token b and its top-5 rivals t: the drift of a gap
is (other[t] - other[b]) - (plain[t] - plain[b]). The other path emits t instead of b only
where the plain gap plain[b] - plain[t] is below that drift. Reported: the largest drift of
a top-5 gap per position (median, p99, max) and the largest drift of any logit.

    .venv/bin/python benchmarks/logit_drift.py [--tokens 48] [--flash-attn on|off] [--name N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import write_report

PROMPTS = (
    "What is the capital of France?",
    "Write a haiku about rain.",
    "List three fruits.",
    "Explain gravity briefly.",
    "Copy this text exactly: The quick brown fox jumps over the lazy dog near the river bank.",
    "Fix the typos: The wether was nice, so we walkd to the park and sat on a bench.",
    "Convert to a bulleted list: apples, oranges, bananas, grapes, pears, plums, cherries.",
    "Why is the sky blue?",
)
TOP = 5


def _decode_rows(backend: Any, seq_id: int, tokens: Sequence[int], start: int) -> np.ndarray:
    from reame_core.backend.base import Batch

    batch = Batch()
    for offset, token in enumerate(tokens):
        batch.add(token, start + offset, seq_id, True)
    return np.array(backend.decode(batch), dtype=np.float64, copy=True)


def _prefill(backend: Any, seq_id: int, prompt: Sequence[int]) -> None:
    from reame_core.backend.base import Batch

    backend.seq_rm(seq_id, -1, -1)
    for start in range(0, len(prompt), backend.info.n_batch):
        batch = Batch()
        chunk = prompt[start : start + backend.info.n_batch]
        for offset, token in enumerate(chunk):
            batch.add(token, start + offset, seq_id, start + offset == len(prompt) - 1)
        backend.decode(batch)


def _greedy(backend: Any, prompt: Sequence[int], n: int) -> tuple[list[int], np.ndarray]:
    """The plain path: prefill, then one token per decode; its tokens and the rows that
    predicted them (row i predicts token i)."""
    eog = list(backend.info.eog)
    _prefill(backend, 0, prompt[:-1])
    rows = []
    tokens: list[int] = []
    token = prompt[-1]
    for position in range(len(prompt) - 1, len(prompt) - 1 + n):
        row = _decode_rows(backend, 0, [token], position)[0]
        rows.append(row)
        masked = row.copy()
        masked[eog] = -np.inf
        token = int(np.argmax(masked))
        tokens.append(token)
    backend.seq_rm(0, -1, -1)
    return tokens, np.array(rows)


def _gap_drifts(plain: np.ndarray, other: np.ndarray, eog: Sequence[int]) -> list[float]:
    """Per row: the largest drift of a gap between the plain best and a top-5 rival."""
    drifts = []
    for p, o in zip(plain, other, strict=True):
        p = p.copy()
        p[list(eog)] = -np.inf
        order = np.argsort(p)[::-1]
        best, rivals = order[0], order[1 : 1 + TOP]
        drifts.append(float(max(abs((o[t] - o[best]) - (p[t] - p[best])) for t in rivals)))
    return drifts


def _flips(plain: np.ndarray, other: np.ndarray, eog: Sequence[int]) -> int:
    """Rows whose best token (EOG masked, as `ignore_eos` does) differs between the paths."""
    p, o = plain.copy(), other.copy()
    p[:, list(eog)] = -np.inf
    o[:, list(eog)] = -np.inf
    return int(np.sum(np.argmax(p, axis=1) != np.argmax(o, axis=1)))


def _summary(drifts: list[float], logit_drifts: list[float], flips: int) -> dict[str, Any]:
    ordered = sorted(drifts)
    return {
        "positions": len(drifts),
        "best_token_differs": flips,
        "gap_drift_median": round(statistics.median(ordered), 4),
        "gap_drift_p99": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 4),
        "gap_drift_max": round(ordered[-1], 4),
        "logit_drift_max": round(max(logit_drifts), 4),
    }


def verify_drift(
    model: Path, tokens: int, steps: Sequence[int], flash_attn: bool = True
) -> dict[str, Any]:
    from reame_core.backend.llama import LlamaBackend
    from reame_core.chat import encode_chat

    backend = LlamaBackend(
        model, n_ctx_seq=1024, n_seq_max=1, n_batch=512, n_threads=2, flash_attn=flash_attn
    )
    eog = list(backend.info.eog)
    results: dict[str, Any] = {}
    plains = []
    for text in PROMPTS:
        prompt = encode_chat(backend.info, [{"role": "user", "content": text}])
        plains.append((prompt, *_greedy(backend, prompt, tokens)))
    for step in steps:
        drifts: list[float] = []
        logit_drifts: list[float] = []
        flips = 0
        for prompt, generated, plain_rows in plains:
            _prefill(backend, 0, prompt[:-1])
            fed = [prompt[-1], *generated[:-1]]
            rows = []
            for start in range(0, len(fed), step):
                chunk = fed[start : start + step]
                rows.append(_decode_rows(backend, 0, chunk, len(prompt) - 1 + start))
            other = np.concatenate(rows)
            backend.seq_rm(0, -1, -1)
            drifts += _gap_drifts(plain_rows, other, eog)
            logit_drifts.append(float(np.max(np.abs(other - plain_rows))))
            flips += _flips(plain_rows, other, eog)
        results[f"steps_of_{step}"] = _summary(drifts, logit_drifts, flips)
    backend.close()
    return results


def batch_drift(model: Path, tokens: int) -> dict[str, Any]:
    from reame_core.backend.base import Batch
    from reame_core.backend.llama import LlamaBackend
    from reame_core.chat import encode_chat

    backend = LlamaBackend(
        model, n_ctx_seq=1024, n_seq_max=8, n_batch=512, n_threads=2, deterministic=False
    )
    eog = list(backend.info.eog)
    prompts = [encode_chat(backend.info, [{"role": "user", "content": t}]) for t in PROMPTS]
    plains = [_greedy(backend, prompt, tokens) for prompt in prompts]
    for seq_id, prompt in enumerate(prompts):
        _prefill(backend, seq_id, prompt[:-1])
    together: list[list[np.ndarray]] = [[] for _ in prompts]
    for step in range(tokens):
        batch = Batch()
        for seq_id, (prompt, (generated, _)) in enumerate(zip(prompts, plains, strict=True)):
            token = prompt[-1] if step == 0 else generated[step - 1]
            batch.add(token, len(prompt) - 1 + step, seq_id, True)
        logits = np.array(backend.decode(batch), dtype=np.float64, copy=True)
        for seq_id in range(len(prompts)):
            together[seq_id].append(logits[seq_id])
    drifts: list[float] = []
    logit_drifts: list[float] = []
    flips = 0
    for (_, plain_rows), rows in zip(plains, together, strict=True):
        other = np.array(rows)
        drifts += _gap_drifts(plain_rows, other, eog)
        logit_drifts.append(float(np.max(np.abs(other - plain_rows))))
        flips += _flips(plain_rows, other, eog)
    backend.close()
    return {"eight_sequences": _summary(drifts, logit_drifts, flips)}


def main() -> None:
    import llama_cpp

    from reame_core.models import resolve_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--name", default="logit_drift", help="results file name")
    parser.add_argument(
        "--flash-attn", choices=("on", "off"), default="on", help="for the verify pairs"
    )
    args = parser.parse_args()
    flash = args.flash_attn == "on"
    q4 = resolve_model(None).path
    with tempfile.TemporaryDirectory() as tmp:
        q8 = Path(tmp) / "SmolLM2-135M-Instruct.Q8_0.gguf"
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
        params.allow_requantize = True
        assert llama_cpp.llama_model_quantize(str(q4).encode(), str(q8).encode(), params) == 0
        report = {
            "model": f"{q4.name} (and a Q8_0 copy)",
            "prompts": len(PROMPTS),
            "tokens_per_prompt": args.tokens,
            "top": TOP,
            "command": f"python logit_drift.py --tokens {args.tokens} --flash-attn "
            f"{args.flash_attn} --name {args.name}",
            "verify_flash_attn": args.flash_attn,
            "verify_q4_1": verify_drift(q4, args.tokens, (5, 9), flash),
            "verify_q8_0": verify_drift(q8, args.tokens, (5, 9), flash),
            "batch_fast_config": batch_drift(q4, args.tokens),
        }
    print(write_report(args.name, report).read_text())


if __name__ == "__main__":
    main()
