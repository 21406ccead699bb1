"""A decode step's one-row products in Reame's build ask for the weights ahead of where they
read (scripts/patches/ggml-read-ahead.patch, `GGML_READ_AHEAD=N` bytes: `READ_AHEAD`, set by
Reame), and on CPUs with AVX-512 VNNI and VBMI take repacked Q4_K weights through a one-row
kernel of their own. A speed-up only: every output must stay bit for bit what ggml's one-row
kernels give. Checked: the kernel against ggml's on random blocks and on the sums' extremes;
on SmolLM2 (Q4_1 and Q8_0, through ggml's one-row loop) and Qwen2.5-Coder-0.5B (Q5_0 and Q8_0
through that loop, a few layers' repacked Q4_K and Q6_K), every row of a pass of 1 to 13
tokens gets the logits of a one-token step with the switch, and every logit is the same
without it (each setting in a process of its own: ggml reads it once per process).
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np
import pytest
from row_groups import assert_passes_are_one_token_steps_either_way, needs_avx2
from test_k_quant_row_groups import QK_K, _q4_k_x8, _q8_k
from test_row_kernels import logits_by_pass

from reame_core.backend.llama import READ_AHEAD, READ_AHEAD_ENV
from reame_core.backend.probe import BuildVerdict, cpu_flags, llama_library_dir

# What the build's one-row Q4_K kernel needs (-march=native: the host's flags)
KERNEL_FLAGS = {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512vbmi"}


@pytest.fixture(scope="module")
def kernels() -> ctypes.CDLL:
    if not KERNEL_FLAGS.issubset(cpu_flags()):
        pytest.skip("the one-row Q4_K kernel is built for CPUs with AVX-512 VNNI and VBMI")
    directory = llama_library_dir()
    assert directory is not None
    library = ctypes.CDLL(str(directory / "libggml-cpu.so"))
    size, pointer, count = ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int
    ggml, kernel = library.ggml_gemv_q4_K_8x8_q8_K, library.ggml_gemv_q4_K_8x8_q8_K_vnni
    ggml.restype = kernel.restype = None
    ggml.argtypes = [count, pointer, size, pointer, pointer, count, count]
    kernel.argtypes = [count, pointer, pointer, pointer, count, count]
    return library


def _both(library: ctypes.CDLL, weights: np.ndarray, row: np.ndarray, ahead: int) -> np.ndarray:
    """ggml's one-row product and the kernel's, as two rows."""
    n, columns = weights.shape[1] * QK_K, weights.shape[0] * 8
    out = np.full((2, columns), np.nan, np.float32)
    library.ggml_gemv_q4_K_8x8_q8_K(
        n, out[0].ctypes.data, columns, weights.ctypes.data, row.ctypes.data, 1, columns
    )
    library.ggml_gemv_q4_K_8x8_q8_K_vnni(
        n, out[1].ctypes.data, weights.ctypes.data, row.ctypes.data, columns, ahead
    )
    return out


@pytest.mark.parametrize("blocks", [1, 6, 35])
@pytest.mark.parametrize("columns", [8, 64, 200])
@pytest.mark.parametrize("ahead", [0, READ_AHEAD])
def test_the_one_row_q4_k_kernel_gives_ggmls_outputs_bit_for_bit(
    kernels: ctypes.CDLL, blocks: int, columns: int, ahead: int
) -> None:
    rng = np.random.default_rng(blocks * 1000 + columns)
    weights = _q4_k_x8(rng, columns, blocks)
    weights["d"][rng.random(weights["d"].shape) < 0.5] *= -1  # scales of either sign
    row = _q8_k(rng, 1, blocks)[0]
    out = _both(kernels, weights, row, ahead)
    assert np.isfinite(out[0]).all()
    assert np.array_equal(out[1].view(np.uint32), out[0].view(np.uint32))


@pytest.mark.parametrize("quant", [-128, 127])
def test_the_kernel_holds_at_the_sums_extremes(kernels: ctypes.CDLL, quant: int) -> None:
    # Every nibble 15 and every scale 63 against src1 quants all at one end: the largest
    # lane sums the kernel packs into 16 bits before scaling them.
    rng = np.random.default_rng(3)
    weights = _q4_k_x8(rng, 16, 6)
    weights["qs"] = 0xFF
    weights["scales"] = 0xFF
    row = _q8_k(rng, 1, 6)[0]
    row["qs"] = quant
    row["bsums"] = quant * 16
    out = _both(kernels, weights, row, READ_AHEAD)
    assert np.isfinite(out[0]).all()
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
