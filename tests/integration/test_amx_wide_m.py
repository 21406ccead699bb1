"""On a CPU with AMX, Reame's build unpacks each block of a K-quant weight matrix once for all
the rows of a product (scripts/patches/ggml-amx-wide-m.patch, `GGML_AMX_WIDE_M`), where
ggml's kernel unpacks it again for every 32 rows. A speed-up only: every row of a prompt
chunk must get exactly the logits ggml's kernel gives it, whatever the chunk's length (a
multiple of 16 rows or not, one row past 32 or 64). Checked on Gemma 3 270M and on
Qwen2.5-Coder-0.5B (Q4_K_M: their Q4_K and Q6_K matrices; those whose rows are not a
multiple of 256 long are stored in other types), each configuration in a process of its
own, since ggml reads the switch once per process. That the build carries the patch on an
AMX host is tests/unit/test_llama_wheel.py's to check.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from switched import saved_logits

from reame_core.backend.probe_child import AMX_WIDE_M_ENV

PREFIX = 40
CHUNKS = (33, 65, 100, 48, 17)  # rows of the prompt chunks after the prefix, in turn


def _logits_by_chunk(model: str, out: str) -> None:
    """Child: a prefix, then prompt chunks of the sizes in `CHUNKS`, every row's logits
    kept; saved as one array of shape (tokens, vocab)."""
    from reame_core.backend.base import Batch
    from reame_core.backend.llama import LlamaBackend

    backend = LlamaBackend(model, n_ctx_seq=512, n_seq_max=1, n_batch=128, n_threads=2)
    rng = np.random.default_rng(13)
    tokens = [int(t) for t in rng.integers(100, 5000, PREFIX + sum(CHUNKS))]
    batch = Batch()
    for position in range(PREFIX):
        batch.add(tokens[position], position, 0, False)
    backend.decode(batch)
    rows, start = [], PREFIX
    for size in CHUNKS:
        batch = Batch()
        for position in range(start, start + size):
            batch.add(tokens[position], position, 0, True)
        rows.append(np.array(backend.decode(batch), copy=True))
        start += size
    backend.close()
    np.save(out, np.concatenate(rows))


def _run(model: Path, switch: str, out: Path) -> np.ndarray:
    return saved_logits(__file__, model, out, AMX_WIDE_M_ENV, switch)


@pytest.mark.parametrize("model", ["gemma", pytest.param("qwen", marks=pytest.mark.qwen)])
def test_every_row_of_a_chunk_gets_the_logits_of_ggmls_kernel(
    model: str, amx_weights: None, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    path = request.getfixturevalue("gemma_path" if model == "gemma" else "qwen_coder_05b_path")
    wide = _run(path, "1", tmp_path / "wide.npy")
    ggml = _run(path, "0", tmp_path / "ggml.npy")
    assert wide.shape[0] == sum(CHUNKS)
    assert np.isfinite(wide).all()
    assert np.array_equal(wide, ggml)  # the switch changes the speed, not the logits


if __name__ == "__main__":
    _logits_by_chunk(sys.argv[1], sys.argv[2])
