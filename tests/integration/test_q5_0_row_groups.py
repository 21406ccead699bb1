"""Q5_0 weights (the layers of Qwen2.5-0.5B whose rows of 896 values no K-quant takes) go,
like Q8_0's, to llamafile's kernel for every product of two rows or more. Reame's build sends
products of 2 to N rows to the Q8_0 row groups instead (scripts/patches/
ggml-q5_0-row-groups.patch, `GGML_Q5_0_ROW_GROUPS=N`), each block unpacked once for up to
eight rows. A speed-up only: every output must be bit-identical to ggml's one-row dot
product. Checked on the kernel itself, against that dot product on random blocks of every
shape a product hands it, and on Qwen2.5-Coder-0.5B: every row of a pass of any size (up to
N rows through the groups, beyond through llamafile's kernel) gets the logits of a one-token
step, and the same logits with the switch on and off (each setting in a process of its own,
since ggml reads the switch once per process). llamafile's kernel computes each row as the
one-row product does too, so the model's check holds whichever kernel takes a pass: the
kernel tests are the ones that see the row groups' outputs.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np
import pytest
from row_groups import (
    MAX_BLOCKS,
    assert_bit_identical,
    assert_passes_are_one_token_steps_either_way,
    assert_rows_too_long_are_refused,
    kernels,
    needs_avx2,
    q8_0_blocks,
)
from test_row_kernels import PASSES, logits_by_pass

from reame_core.backend.llama import Q5_0_ROW_GROUPS, Q5_0_ROW_GROUPS_ENV

# A scale, the fifth bits of the 32 values, then their low four bits two to a byte.
Q5_0 = np.dtype([("d", "<f2"), ("qh", "u1", 4), ("qs", "u1", 16)])
DOT, ROWS = "ggml_vec_dot_q5_0_q8_0", "ggml_gemm_q5_0_q8_0_rows"


@pytest.fixture(scope="module")
def ggml_cpu() -> ctypes.CDLL:
    return kernels(DOT, ROWS)


def _q5_0(rng: np.random.Generator, rows: int, blocks: int) -> np.ndarray:
    """Q5_0 blocks: scales as quantization makes them, every bit pattern of the values."""
    blocks_ = np.zeros((rows, blocks), Q5_0)
    blocks_["d"] = rng.uniform(1e-4, 5e-2, blocks_.shape)
    blocks_["qh"] = rng.integers(0, 256, (*blocks_.shape, 4))
    blocks_["qs"] = rng.integers(0, 256, (*blocks_.shape, 16))
    return blocks_


@pytest.mark.parametrize("blocks", [1, 28, 152])  # 28: Qwen2.5-0.5B's rows; 152: a long row
@pytest.mark.parametrize("row_count", range(2, 18))  # every group shape, and groups after one
def test_every_output_is_the_one_row_dot_product_bit_for_bit(
    ggml_cpu: ctypes.CDLL, blocks: int, row_count: int
) -> None:
    rng = np.random.default_rng(blocks * 100 + row_count)
    assert_bit_identical(
        ggml_cpu, DOT, ROWS, _q5_0(rng, 21, blocks), q8_0_blocks(rng, row_count, blocks)
    )


def test_weight_rows_too_long_for_its_scratch_are_left_to_the_other_kernels(
    ggml_cpu: ctypes.CDLL,
) -> None:
    rng = np.random.default_rng(5)
    blocks = MAX_BLOCKS + 1
    assert_rows_too_long_are_refused(
        ggml_cpu, ROWS, _q5_0(rng, 1, blocks), q8_0_blocks(rng, 2, blocks)
    )


def test_qwen_05b_rows_of_every_pass_get_the_logits_of_one_token_steps(
    qwen_coder_05b_path: Path, tmp_path: Path
) -> None:
    needs_avx2()
    assert min(PASSES) < Q5_0_ROW_GROUPS < max(PASSES)  # the groups, and llamafile's beyond
    assert_passes_are_one_token_steps_either_way(
        __file__, qwen_coder_05b_path, tmp_path, Q5_0_ROW_GROUPS_ENV, str(Q5_0_ROW_GROUPS)
    )


if __name__ == "__main__":
    logits_by_pass(sys.argv[1], sys.argv[2])
