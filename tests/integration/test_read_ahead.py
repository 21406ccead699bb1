"""Reame's build reads the weights ahead of where it computes in products of one row of src1 (a
decode step's) and of a few (a draft verified, sequences decoded together):
scripts/patches/ggml-read-ahead.patch, `GGML_READ_AHEAD=N` bytes (`READ_AHEAD`, set by Reame).
On CPUs with AVX-512 VNNI and VBMI, repacked Q4_K weights go through a kernel of its own for
one row and for the rows the K-quant row groups take; with AVX-512 VNNI, so do Q6_K weights
for the row groups' products of 2 to 16 rows (groups of 2 to 8; a group of one row takes
ggml's one-row kernel). A speed-up only: every output must stay bit for bit what ggml's
one-row kernels give. Checked: both kernels against ggml's one-row kernels on random blocks
and on the sums' extremes; on SmolLM2 (Q4_1 and Q8_0, through the row groups
and ggml's one-row loop) and Qwen2.5-Coder-0.5B (Q5_0 and Q8_0 through that loop, a few
layers' repacked Q4_K and Q6_K), every row of a pass of 1 to 13 tokens gets the logits of a
one-token step with the switch, and every logit is the same without it (each setting in a
process of its own: ggml reads it once per process).
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np
import pytest
from row_groups import (
    assert_passes_are_one_token_steps_either_way,
    assert_products,
    cpu_library,
    needs_avx2,
)
from test_k_quant_row_groups import QK_K, _q4_k_x8, _q6_k, _q8_k
from test_row_kernels import logits_by_pass

from reame_core.backend.llama import READ_AHEAD, READ_AHEAD_ENV
from reame_core.backend.probe import BuildVerdict, cpu_flags

# What the build's Q4_K kernel needs (-march=native: the host's flags); its Q6_K kernel: not VBMI
KERNEL_FLAGS = {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512vbmi"}
Q6_K_KERNEL_FLAGS = KERNEL_FLAGS - {"avx512vbmi"}


def _library(flags: set[str], what: str) -> ctypes.CDLL:
    if not flags.issubset(cpu_flags()):
        pytest.skip(f"the {what} kernel is built for CPUs with {', '.join(sorted(flags))}")
    return cpu_library()


@pytest.fixture(scope="module")
def kernels() -> ctypes.CDLL:
    library = _library(KERNEL_FLAGS, "Q4_K")
    size, pointer, count = ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int
    ggml, kernel = library.ggml_gemv_q4_K_8x8_q8_K, library.ggml_gemv_q4_K_8x8_q8_K_vnni
    ggml.restype = kernel.restype = None
    ggml.argtypes = [count, pointer, size, pointer, pointer, count, count]
    kernel.argtypes = [count, pointer, size, pointer, pointer, count, count, count]
    return library


@pytest.fixture(scope="module")
def q6_k_kernels() -> ctypes.CDLL:
    library = _library(Q6_K_KERNEL_FLAGS, "Q6_K")
    # built for this CPU (-march=native): the row groups choose the kernel, not ggml's AVX2 path
    assert library.ggml_cpu_has_avx512_vnni()
    size, pointer, count = ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int
    ggml, rows = library.ggml_vec_dot_q6_K_q8_K, library.ggml_gemm_q6_K_q8_K_rows
    ggml.restype = rows.restype = None
    ggml.argtypes = [count, pointer, size, pointer, size, pointer, size, count]
    rows.argtypes = [count, count, count, pointer, size, pointer, size, pointer, size, count]
    return library


def _q4_k_both(
    library: ctypes.CDLL, weights: np.ndarray, rows: np.ndarray, ahead: int
) -> np.ndarray:
    """ggml's one-row products, a row at a time, and the kernel's of all the rows at once."""
    n, columns = weights.shape[1] * QK_K, weights.shape[0] * 8
    out = np.full((2, len(rows), columns), np.nan, np.float32)
    for r, row in enumerate(rows):
        library.ggml_gemv_q4_K_8x8_q8_K(
            n, out[0, r].ctypes.data, columns, weights.ctypes.data, row.ctypes.data, 1, columns
        )
    library.ggml_gemv_q4_K_8x8_q8_K_vnni(
        n, out[1].ctypes.data, columns, weights.ctypes.data, rows.ctypes.data, len(rows), columns,
        ahead,
    )  # fmt: skip
    return out


@pytest.mark.parametrize("blocks", [1, 6, 35])
@pytest.mark.parametrize("columns", [8, 200])
@pytest.mark.parametrize("row_count", [*range(1, 10), 17, 40])
@pytest.mark.parametrize("ahead", [0, READ_AHEAD])
def test_the_q4_k_kernel_gives_ggmls_one_row_outputs_bit_for_bit(
    kernels: ctypes.CDLL, blocks: int, columns: int, row_count: int, ahead: int
) -> None:
    rng = np.random.default_rng(blocks * 1000 + columns * 10 + row_count)
    weights = _q4_k_x8(rng, columns, blocks)
    weights["d"][rng.random(weights["d"].shape) < 0.5] *= -1  # scales of either sign
    out = _q4_k_both(kernels, weights, _q8_k(rng, row_count, blocks), ahead)
    assert_products(out[0])
    assert np.array_equal(out[1].view(np.uint32), out[0].view(np.uint32))


@pytest.mark.parametrize("quant", [-128, 127])
def test_the_q4_k_kernel_holds_at_the_sums_extremes(kernels: ctypes.CDLL, quant: int) -> None:
    # Every nibble 15 and every scale 63 against src1 quants all at one end: the largest
    # lane sums the kernel packs into 16 bits before scaling them.
    rng = np.random.default_rng(3)
    weights = _q4_k_x8(rng, 16, 6)
    weights["qs"] = 0xFF
    weights["scales"] = 0xFF
    rows = _q8_k(rng, 3, 6)
    rows["qs"] = quant
    rows["bsums"] = quant * 16
    out = _q4_k_both(kernels, weights, rows, READ_AHEAD)
    assert_products(out[0])
    assert np.array_equal(out[1].view(np.uint32), out[0].view(np.uint32))


def _q6_k_both(library: ctypes.CDLL, weights: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """ggml's one-row dot products and the row groups' products reading ahead (the kernel)."""
    n = weights.shape[1] * QK_K
    out = np.full((2, len(rows), len(weights)), np.nan, np.float32)
    for c, row in enumerate(rows):
        for r, weight_row in enumerate(weights):
            library.ggml_vec_dot_q6_K_q8_K(
                n, out[0, c, r:].ctypes.data, 0, weight_row.ctypes.data, 0, row.ctypes.data, 0, 1
            )
    library.ggml_gemm_q6_K_q8_K_rows(
        n, len(weights), len(rows), out[1].ctypes.data, len(weights), weights.ctypes.data,
        weights.strides[0], rows.ctypes.data, rows.strides[0], READ_AHEAD,
    )  # fmt: skip
    return out


@pytest.mark.parametrize("blocks", [1, 6, 35])
@pytest.mark.parametrize("row_count", [*range(2, 18)])
def test_the_q6_k_kernel_gives_ggmls_one_row_outputs_bit_for_bit(
    q6_k_kernels: ctypes.CDLL, blocks: int, row_count: int
) -> None:
    rng = np.random.default_rng(blocks * 100 + row_count)
    out = _q6_k_both(q6_k_kernels, _q6_k(rng, 11, blocks), _q8_k(rng, row_count, blocks))
    assert_products(out[0])
    assert np.array_equal(out[1].view(np.uint32), out[0].view(np.uint32))


@pytest.mark.parametrize("quant", [-128, 127])
def test_the_q6_k_kernel_holds_at_the_sums_extremes(q6_k_kernels: ctypes.CDLL, quant: int) -> None:
    # Every quant 63 and scales at both ends against src1 quants all at one end: the largest
    # sums of four products the kernel scales as 16-bit values.
    rng = np.random.default_rng(5)
    weights = _q6_k(rng, 5, 6)
    weights["ql"] = weights["qh"] = 0xFF
    weights["scales"] = np.where(np.arange(QK_K // 16) % 2, 127, -128)
    rows = _q8_k(rng, 4, 6)
    rows["qs"] = quant
    rows["bsums"] = quant * 16
    out = _q6_k_both(q6_k_kernels, weights, rows)
    assert_products(out[0])
    assert np.array_equal(out[1].view(np.uint32), out[0].view(np.uint32))


@pytest.mark.parametrize("model", ["smollm2", pytest.param("qwen", marks=pytest.mark.qwen)])
def test_steps_reading_ahead_get_the_logits_of_passes_and_of_steps_without(
    model: str, build_check: BuildVerdict, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    needs_avx2()  # the passes' rows are one-token steps through the row groups
    if "AMX" in (build_check.fact("buffers") or {}):
        pytest.skip("the weights are in ggml's AMX buffers here, off these paths")
    path = request.getfixturevalue("smollm2_path" if model == "smollm2" else "qwen_coder_05b_path")
    assert_passes_are_one_token_steps_either_way(
        __file__, path, tmp_path, READ_AHEAD_ENV, str(READ_AHEAD)
    )


if __name__ == "__main__":
    logits_by_pass(sys.argv[1], sys.argv[2])
