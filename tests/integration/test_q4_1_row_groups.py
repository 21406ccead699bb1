"""Where no repacked or AMX kernel takes Q4_1 weights (an AVX2 CPU), Reame's build multiplies
them with several rows at once, each block of the weights unpacked once for up to eight rows
(scripts/patches/ggml-q4_1-row-groups.patch, `GGML_Q4_1_ROW_GROUPS`). A speed-up only: every
output must be bit-identical to ggml's one-row dot product. Checked on the kernel itself,
against that dot product on random blocks of every shape a product hands it, and on
SmolLM2 (Q4_1 weights): the logits of passes of every size, with the switch on and off,
each in a process of its own since ggml reads the switch once per process.
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
    assert_rows_too_long_are_refused,
    kernels,
    needs_avx2,
)
from switched import saved_logits
from test_row_kernels import logits_by_pass

from reame_core.backend.llama import Q4_1_ROW_GROUPS_ENV
from reame_core.backend.probe import BuildVerdict

Q4_1 = np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", 16)])
Q8_1 = np.dtype([("d", "<f2"), ("s", "<f2"), ("qs", "i1", 32)])
DOT, ROWS = "ggml_vec_dot_q4_1_q8_1", "ggml_gemm_q4_1_q8_1_rows"


@pytest.fixture(scope="module")
def ggml_cpu() -> ctypes.CDLL:
    return kernels(DOT, ROWS)


def _q4_1(rng: np.random.Generator, rows: int, blocks: int) -> np.ndarray:
    """Q4_1 weights with scales and values as quantization makes them."""
    weights = np.zeros((rows, blocks), Q4_1)
    weights["d"] = rng.uniform(1e-4, 2e-2, weights.shape)
    weights["m"] = rng.uniform(-0.2, 0.0, weights.shape)
    weights["qs"] = rng.integers(0, 256, (*weights.shape, 16))
    return weights


def _q8_1(rng: np.random.Generator, rows: int, blocks: int) -> np.ndarray:
    """src1 rows quantized as ggml quantizes them for a Q4_1 product (s: d times the sum)."""
    values = np.zeros((rows, blocks), Q8_1)
    values["qs"] = rng.integers(-127, 128, (*values.shape, 32))
    values["d"] = rng.uniform(1e-3, 5e-2, values.shape)
    values["s"] = values["d"].astype(np.float32) * values["qs"].sum(axis=-1)
    return values


@pytest.mark.parametrize("blocks", [1, 18, 48, 137])
@pytest.mark.parametrize("row_count", [2, 3, 7, 8, 9, 16, 17])
def test_every_output_is_the_one_row_dot_product_bit_for_bit(
    ggml_cpu: ctypes.CDLL, blocks: int, row_count: int
) -> None:
    rng = np.random.default_rng(blocks * 100 + row_count)
    assert_bit_identical(ggml_cpu, DOT, ROWS, _q4_1(rng, 21, blocks), _q8_1(rng, row_count, blocks))


def test_weight_rows_too_long_for_its_scratch_are_left_to_the_one_row_kernel(
    ggml_cpu: ctypes.CDLL,
) -> None:
    rng = np.random.default_rng(5)
    blocks = MAX_BLOCKS + 1
    assert_rows_too_long_are_refused(ggml_cpu, ROWS, _q4_1(rng, 1, blocks), _q8_1(rng, 2, blocks))


def test_smollm2_logits_are_the_same_with_the_switch_on_and_off(
    build_check: BuildVerdict, smollm2_path: Path, tmp_path: Path
) -> None:
    needs_avx2()
    if "AMX" in (build_check.fact("buffers") or {}):
        pytest.skip("SmolLM2's Q4_1 weights are in ggml's AMX buffer here, off this path")
    on = saved_logits(__file__, smollm2_path, tmp_path / "on.npy", Q4_1_ROW_GROUPS_ENV, "1")
    off = saved_logits(__file__, smollm2_path, tmp_path / "off.npy", Q4_1_ROW_GROUPS_ENV, "0")
    assert np.array_equal(on.view(np.uint32), off.view(np.uint32))


if __name__ == "__main__":
    logits_by_pass(sys.argv[1], sys.argv[2])
