"""Whether verifying drafts is exact for this model on this build and CPU: measured once, kept.

Verifying k drafts computes them as the rows of one pass, where plain decoding computes
each in a pass of its own. Whether a row gets the same logits both ways depends on the
kernel each product takes, and that depends on the product's rows, the weights' types and
the CPU: llamafile's kernels, ggml's repacked and AMX ones and Reame's row kernels are each
bit-identical to ggml's one-row product or not (docs/ARCHITECTURE.md, "Determinism"). No
rule written down covers every build, CPU and model, so it is measured: after a short
context, the same tokens decoded one per pass and in passes of each size verification
uses, every row's logits compared bit for bit. The answer is kept under the model's
fingerprint (the model file, its KV and attention configuration, the build and its CPU
features): each model is checked once per build, CPU and configuration.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import structlog
from pydantic import BaseModel, ConfigDict, ValidationError

from reame_core.backend.base import Backend, Batch
from reame_core.backend.probe import verdicts_dir, write_atomically

log = structlog.get_logger(__name__)

CONTEXT = 16  # tokens decoded before the compared ones
TOKENS = 17  # compared: one-token steps against passes of each size (a draft of 16 + 1)
PASS_SIZES = (2, 4, 8, TOKENS)  # rows per pass: about the kernels' thresholds and groups
SEQ = 0


class VerificationCheck(BaseModel):
    """One model's answer on one build and CPU."""

    model_config = ConfigDict(frozen=True)

    exact: bool
    differing: tuple[int, ...]  # pass sizes whose rows differ from one-token steps
    checked_at: float


def check_path(cache_dir: Path, fingerprint: str) -> Path:
    return verdicts_dir(cache_dir) / f"verification-{fingerprint}.json"


def verification_exact(backend: Backend, cache_dir: Path) -> bool | None:
    """Whether every row of a pass of up to `TOKENS` tokens gets the logits a one-token
    step gives it: the kept answer for this backend's fingerprint, or one measured now on
    sequence `SEQ`, which must be empty and is left empty. None where the backend's batch
    or context is too small to check."""
    info = backend.info
    if info.n_batch < TOKENS or info.n_ctx_seq < CONTEXT + TOKENS:
        return None
    path = check_path(cache_dir, info.fingerprint)
    try:
        return VerificationCheck.model_validate_json(path.read_bytes()).exact
    except FileNotFoundError:
        pass
    except (OSError, ValidationError) as error:
        log.warning("unreadable verification check, checking again", error=str(error))
    log.info("checking whether verifying drafts is exact (once per model, build and CPU)")
    began = time.perf_counter()
    differing = differing_pass_sizes(backend)
    check = VerificationCheck(exact=not differing, differing=differing, checked_at=time.time())
    write_atomically(path, check.model_dump_json())
    log.info(
        "verification checked",
        exact=check.exact,
        differing=list(differing),
        seconds=round(time.perf_counter() - began, 2),
    )
    return check.exact


def differing_pass_sizes(backend: Backend) -> tuple[int, ...]:
    """The sizes in `PASS_SIZES` whose passes give some row other logits than one-token
    steps do, over the same `TOKENS` tokens after the same context."""
    rng = np.random.default_rng(7)
    tokens = [int(t) for t in rng.integers(0, backend.info.n_vocab, CONTEXT + TOKENS)]
    context, compared = tokens[:CONTEXT], tokens[CONTEXT:]
    try:
        _decode(backend, context, 0, logits=False)
        steps = _rows(backend, context, compared, 1)
        return tuple(
            size
            for size in PASS_SIZES
            if not np.array_equal(_rows(backend, context, compared, size), steps)
        )
    finally:
        backend.seq_rm(SEQ, -1, -1)


def _rows(
    backend: Backend, context: Sequence[int], compared: Sequence[int], size: int
) -> np.ndarray:
    """Every compared token's logits (as raw bits), decoded in passes of `size` tokens
    (the last pass holds the rest) after `context`, which the sequence holds; the compared
    tokens are taken back afterwards (the context computed again where a model's
    sequences cannot be cut)."""
    rows = [
        _decode(backend, compared[start : start + size], CONTEXT + start, logits=True)
        for start in range(0, len(compared), size)
    ]
    if not (backend.info.prefix_trim_safe and backend.seq_rm(SEQ, CONTEXT, -1)):
        backend.seq_rm(SEQ, -1, -1)
        _decode(backend, context, 0, logits=False)
    return np.concatenate(rows).view(np.uint32)


def _decode(backend: Backend, tokens: Sequence[int], position: int, *, logits: bool) -> np.ndarray:
    batch = Batch()
    for offset, token in enumerate(tokens):
        batch.add(token, position + offset, SEQ, logits)
    return np.array(backend.decode(batch), copy=True)
