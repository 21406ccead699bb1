"""On a CPU with AMX, Reame's build computes matrix products of up to `AMX_ROWS` rows with
ggml's VNNI row kernels instead of AMX tiles (scripts/patches/ggml-amx-row-kernels.patch):
verifying a draft, or decoding a few sequences together, then costs far less. A speed-up
only: every row must get exactly the logits a one-token step gives it, and the same logits
as ggml's tiles give it with the switch off. Checked on SmolLM2 (Q4_1 weights) and on
Qwen2.5-Coder-0.5B (Q4_K and Q6_K: the K-quant row kernels), each configuration in a
process of its own, since ggml reads the switch once per process.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from switched import saved_logits

from reame_core.backend.probe_child import AMX_ROWS, AMX_ROWS_ENV

PASSES = (1, 2, 3, 4, 5, 8, 12, 13)  # rows per pass: the row kernels, and tiles beyond them
PROMPT = 40
FOLLOWING = 26  # tokens after the prompt: two passes of 13
COMPARED = 24  # rows every pass size covers


def logits_by_pass(model: str, out: str) -> None:
    """Child: after a prompt, the same tokens decoded in passes of each size in `PASSES`,
    every row's logits kept; saved as one array of shape (passes, tokens, vocab)."""
    from reame_core.backend.base import Batch
    from reame_core.backend.llama import LlamaBackend

    backend = LlamaBackend(model, n_ctx_seq=512, n_seq_max=1, n_batch=64, n_threads=2)
    rng = np.random.default_rng(11)
    tokens = [int(t) for t in rng.integers(100, 5000, PROMPT + FOLLOWING)]
    batch = Batch()
    for position in range(PROMPT):
        batch.add(tokens[position], position, 0, False)
    backend.decode(batch)
    runs = []
    for size in PASSES:
        rows = []
        for start in range(PROMPT, len(tokens) - size + 1, size):
            batch = Batch()
            for position in range(start, start + size):
                batch.add(tokens[position], position, 0, True)
            rows.append(np.array(backend.decode(batch), copy=True))
        runs.append(np.concatenate(rows)[:COMPARED])
        backend.seq_rm(0, PROMPT, -1)
    backend.close()
    np.save(out, np.stack(runs))


def _run(model: Path, switch: str, out: Path) -> np.ndarray:
    return saved_logits(__file__, model, out, AMX_ROWS_ENV, switch)


@pytest.mark.parametrize("model", ["smollm2", pytest.param("qwen", marks=pytest.mark.qwen)])
def test_rows_of_a_pass_get_the_logits_of_one_token_steps(
    model: str, amx_weights: None, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    path = request.getfixturevalue("smollm2_path" if model == "smollm2" else "qwen_coder_05b_path")
    rows = _run(path, str(AMX_ROWS), tmp_path / "rows.npy")
    tiles = _run(path, "1", tmp_path / "tiles.npy")
    one_token_steps = rows[0]
    for index, size in enumerate(PASSES):
        assert np.array_equal(rows[index], one_token_steps), f"passes of {size} tokens"
    assert np.array_equal(rows, tiles)  # the switch changes the speed, not the logits


if __name__ == "__main__":
    logits_by_pass(sys.argv[1], sys.argv[2])
