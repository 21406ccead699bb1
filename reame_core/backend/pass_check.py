"""Whether a row gets the same logits whatever pass computes it, for this model on this build
and CPU: measured once, kept.

Verifying k drafts computes them as the rows of one pass, where plain decoding computes
each in a pass of its own; a decode step holds the rows of every sequence decoding; a prompt
chunk computes a prompt's tokens as the rows of one pass, where the answer before it was
computed a token a pass. Whether a row gets the same logits either way depends on the
kernel each product takes, and that depends on the product's rows, the row's place among
them, the weights' types and the CPU: llamafile's kernels, ggml's repacked and AMX ones and
Reame's row kernels are each bit-identical to ggml's one-row product or not
(docs/ARCHITECTURE.md, "Determinism"). No rule written down covers every build, CPU and
model, so it is measured. After a context that ends off the chunk grid, `TOKENS` tokens are
decoded one per pass, then in passes of each size in `STEP_SIZES` from the first of them,
then as the last rows of passes of each size in `CHUNK_SIZES` (the pass recomputing the
context's last tokens); every row's logits are compared bit for bit. The passes' sizes
sample the kernels' thresholds and groups (a pass's row count is what selects them, whichever
sequences its rows belong to). Where all agree, verifying drafts is exact, and a row's KV
does not depend on its pass either (each compared row reads the KV of the rows before it),
so the engine reuses a generated answer's KV as it is. The compared rows read at most
`CONTEXT + TOKENS` cells of KV; attention's paths over longer caches are the build check's
question (`backend.probe`).

The answer is kept under the model's fingerprint (the model file, its KV and attention
configuration, the build and its CPU features): each model is checked once per build, CPU
and configuration. A check that cannot run (a decode fails) leaves the answer unknown.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import structlog
from pydantic import BaseModel, ConfigDict, ValidationError

from reame_core.backend.base import Backend, Batch, DecodeError
from reame_core.backend.probe import verdicts_dir, write_atomically

log = structlog.get_logger(__name__)

VERSION = 2  # of the measurement: another version measures again
CONTEXT = 113  # tokens before the compared ones: a chunk's worth, ending off the grid of 16
TOKENS = 33  # compared: a draft of `Settings.draft_max`'s default and the token after it
STEP_SIZES = (2, 4, 8, 17, TOKENS)  # passes from the first compared token
# Passes ending at the last compared token: ggml's AMX kernels take products of up to 12
# rows, of 13 to 32, of 33 to 128 and of more along different paths (scripts/patches).
CHUNK_SIZES = (48, 100, CONTEXT + TOKENS)
SEQ = 0
# The shortest limit on drafts a deterministic server sets so that it verifies them only in
# passes found exact (`PassCheck.draft_cap`); where the exact passes are shorter, drafts keep
# their length and are exact up to near-ties.
EXACT_DRAFT_MIN = 16


class PassCheck(BaseModel):
    """One model's answer on one build and CPU."""

    model_config = ConfigDict(frozen=True)

    exact: bool  # every pass gave the compared rows the logits of one-token steps
    # The sizes whose rows differ: steps first; chunks are not tried once a step differs.
    differing: tuple[int, ...]
    checked_at: float

    @property
    def steps_exact(self) -> bool:
        """The sampled passes of up to `TOKENS` tokens (`STEP_SIZES`: a draft verified,
        sequences decoded together) give the compared rows the logits of one-token steps,
        whatever prompt chunks give them."""
        return self.exact_steps == TOKENS

    @property
    def exact_steps(self) -> int:
        """The most tokens of a pass up to which every sampled step (`STEP_SIZES`) gave the
        compared rows the logits of one-token steps (1: none did)."""
        first = min((size for size in self.differing if size not in CHUNK_SIZES), default=None)
        if first is None:
            return TOKENS
        return max((1, *(size for size in STEP_SIZES if size < first)))

    @property
    def draft_cap(self) -> int | None:
        """The longest draft a deterministic server verifies, so that a sequence verifying
        its draft stays within the passes found exact: None where every path is exact (a
        row's logits then never depend on its pass), or where the exact steps would leave
        drafts shorter than `EXACT_DRAFT_MIN` (speculation is then kept, exact up to
        near-ties, rather than all but switched off)."""
        cap = self.exact_steps - 1
        return None if self.exact or cap < EXACT_DRAFT_MIN else cap


def check_path(cache_dir: Path, fingerprint: str) -> Path:
    return verdicts_dir(cache_dir) / f"passes-v{VERSION}-{fingerprint}.json"


def check_passes(backend: Backend, cache_dir: Path) -> PassCheck | None:
    """The kept answer for this backend's fingerprint, or one measured now on sequence
    `SEQ`, which must be empty and is left empty. None where the backend's batch or context
    is too small to check, or a decode failed."""
    info = backend.info
    path = check_path(cache_dir, info.fingerprint)
    try:
        return PassCheck.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        pass
    except (OSError, ValidationError) as error:
        log.warning("unreadable pass check, checking again", error=str(error))
    if info.n_batch < CONTEXT + TOKENS or info.n_ctx_seq < CONTEXT + TOKENS:
        return None
    log.info("checking whether rows depend on their pass (once per model, build and CPU)")
    began = time.perf_counter()
    try:
        check = measure(backend)
    except DecodeError as error:
        log.warning("the pass check could not decode; not checked", error=str(error))
        return None
    try:
        write_atomically(path, check.model_dump_json())
    except OSError as error:
        log.warning("the pass check's answer was not kept", error=str(error))
    log.info(
        "passes checked",
        exact=check.exact,
        differing=list(check.differing),
        seconds=round(time.perf_counter() - began, 2),
    )
    return check


def measure(backend: Backend) -> PassCheck:
    """Compare the compared tokens' rows along every path (see the module docstring)."""
    rng = np.random.default_rng(7)
    tokens = [int(t) for t in rng.integers(0, backend.info.n_vocab, CONTEXT + TOKENS)]
    try:
        _decode(backend, tokens[:CONTEXT], 0, logits=0)
        steps = _steps(backend, tokens, 1)
        # Rows that are not numbers would compare equal without computing anything alike.
        differing: tuple[int, ...] = () if np.isfinite(steps.view(np.float32)).all() else (1,)
        if not differing:
            differing = tuple(
                size
                for size in STEP_SIZES
                if not np.array_equal(_steps(backend, tokens, size), steps)
            )
        if not differing:
            differing = tuple(
                size
                for size in CHUNK_SIZES
                if not np.array_equal(_chunk(backend, tokens, size), steps)
            )
        return PassCheck(exact=not differing, differing=differing, checked_at=time.time())
    finally:
        backend.seq_rm(SEQ, -1, -1)


def _steps(backend: Backend, tokens: Sequence[int], size: int) -> np.ndarray:
    """The compared tokens' logits (as raw bits), decoded in passes of `size` tokens (the
    last pass holds the rest) after the context, which the sequence holds and is left
    holding alone."""
    rows = [
        _decode(backend, tokens[start : start + size], start, logits=size)
        for start in range(CONTEXT, len(tokens), size)
    ]
    _keep(backend, tokens, CONTEXT)
    return np.concatenate(rows).view(np.uint32)


def _chunk(backend: Backend, tokens: Sequence[int], size: int) -> np.ndarray:
    """The compared tokens' logits (as raw bits) as the last rows of one pass of `size`
    tokens, after the context's first tokens (as the context's own pass computed them,
    where the sequence can be cut)."""
    start = len(tokens) - size
    _keep(backend, tokens, start)
    rows = _decode(backend, tokens[start:], start, logits=TOKENS)
    _keep(backend, tokens, CONTEXT)
    return rows.view(np.uint32)


def _keep(backend: Backend, tokens: Sequence[int], length: int) -> None:
    """Cut the sequence back to its first `length` tokens; where a model's sequences cannot
    be cut, compute them again in one pass."""
    if backend.info.prefix_trim_safe and backend.seq_rm(SEQ, length, -1):
        return
    backend.seq_rm(SEQ, -1, -1)
    if length > 0:
        _decode(backend, tokens[:length], 0, logits=0)


def _decode(backend: Backend, tokens: Sequence[int], position: int, *, logits: int) -> np.ndarray:
    """One pass of `tokens` from `position`, the logits of its last `logits` rows."""
    batch = Batch()
    for offset, token in enumerate(tokens):
        batch.add(token, position + offset, SEQ, offset >= len(tokens) - logits)
    return np.array(backend.decode(batch), copy=True)
