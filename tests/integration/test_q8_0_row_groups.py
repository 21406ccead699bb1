"""Where no AMX kernel takes Q8_0 weights (x86 with AVX2; SmolLM2's output layer is Q8_0),
ggml hands every product of two rows or more to llamafile's kernel, made for products of
many rows. Reame's build sends products of 2 to N rows to row groups instead
(scripts/patches/ggml-q8_0-row-groups.patch, `GGML_Q8_0_ROW_GROUPS=N`), each block of the
weights loaded once for up to eight rows. A speed-up only: every output must be
bit-identical to ggml's one-row dot product. Checked on the kernel itself, against that dot
product on random blocks of every shape a product hands it, and on SmolLM2: every row of a
pass of any size (up to N rows through the groups, beyond through llamafile's kernel, which
computes each row as a one-row product does too) gets the logits of a one-token step, and
the same logits with the switch on and off (each setting in a process of its own, since
ggml reads the switch once per process).
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

from reame_core.backend.llama import Q8_0_ROW_GROUPS, Q8_0_ROW_GROUPS_ENV
from reame_core.backend.probe import BuildVerdict

DOT, ROWS = "ggml_vec_dot_q8_0_q8_0", "ggml_gemm_q8_0_q8_0_rows"


@pytest.fixture(scope="module")
def ggml_cpu() -> ctypes.CDLL:
    return kernels(DOT, ROWS)


@pytest.mark.parametrize("blocks", [1, 18, 48, 137])
@pytest.mark.parametrize("row_count", range(2, 18))  # every group shape, and groups after one
def test_every_output_is_the_one_row_dot_product_bit_for_bit(
    ggml_cpu: ctypes.CDLL, blocks: int, row_count: int
) -> None:
    rng = np.random.default_rng(blocks * 100 + row_count)
    assert_bit_identical(
        ggml_cpu, DOT, ROWS, q8_0_blocks(rng, 21, blocks), q8_0_blocks(rng, row_count, blocks)
    )


def test_weight_rows_too_long_for_its_scratch_are_left_to_the_other_kernels(
    ggml_cpu: ctypes.CDLL,
) -> None:
    rng = np.random.default_rng(5)
    blocks = MAX_BLOCKS + 1
    assert_rows_too_long_are_refused(
        ggml_cpu, ROWS, q8_0_blocks(rng, 1, blocks), q8_0_blocks(rng, 2, blocks)
    )


def test_smollm2_rows_of_every_pass_get_the_logits_of_one_token_steps(
    build_check: BuildVerdict, smollm2_path: Path, tmp_path: Path
) -> None:
    needs_avx2()
    if "AMX" in (build_check.fact("buffers") or {}):
        pytest.skip("SmolLM2's Q8_0 output layer is in ggml's AMX buffer here, off this path")
    assert min(PASSES) < Q8_0_ROW_GROUPS < max(PASSES)  # the groups, and llamafile's beyond
    assert_passes_are_one_token_steps_either_way(
        __file__, smollm2_path, tmp_path, Q8_0_ROW_GROUPS_ENV, str(Q8_0_ROW_GROUPS)
    )


if __name__ == "__main__":
    logits_by_pass(sys.argv[1], sys.argv[2])
