"""The row-group kernels of Reame's build (scripts/patches/ggml-*-row-groups.patch) against
ggml's one-row dot products, called directly: both take quantized blocks as numpy arrays
(rows of blocks), and each group kernel must give every output bit for bit as the one-row
product gives it."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
from switched import saved_logits
from test_row_kernels import PASSES

from reame_core.backend.probe import cpu_flags, llama_library_dir

QK = 32  # values per block of the types these kernels take
MAX_BLOCKS = 1024  # the longest weight row the kernels take, in blocks


def needs_avx2() -> None:
    """Skip the test off x86 with AVX2, where the group kernels are not built."""
    if "avx2" not in cpu_flags():
        pytest.skip("the row-group kernels are built for x86 CPUs with AVX2")


def cpu_library() -> ctypes.CDLL:
    """The build's CPU library, initialized: the kernels read fp16 scales through a table
    that ggml_cpu_init fills; before it every scale reads 0, and so does every product,
    whichever kernel computes it."""
    directory = llama_library_dir()
    assert directory is not None
    library = ctypes.CDLL(str(directory / "libggml-cpu.so"))
    library.ggml_cpu_init.restype = None
    library.ggml_cpu_init.argtypes = []
    library.ggml_cpu_init()
    return library


def assert_products(expected: np.ndarray) -> None:
    """One-row products to compare a kernel's with: each computed, and not all 0 as they are
    where the scales read as 0 (a block's integer sum may be 0: most are not)."""
    assert np.isfinite(expected).all()
    assert np.count_nonzero(expected) > expected.size // 2


Q8_0 = np.dtype([("d", "<f2"), ("qs", "i1", 32)])


def q8_0_blocks(rng: np.random.Generator, rows: int, blocks: int) -> np.ndarray:
    """Q8_0 blocks (the weights' of a Q8_0 product, src1's of a Q8_0 or Q5_0 one): scales as
    quantization makes them, values over all of int8 (-128, which quantization does not
    make, must still come out as the one-row product has it)."""
    blocks_ = np.zeros((rows, blocks), Q8_0)
    blocks_["d"] = rng.uniform(1e-4, 5e-2, blocks_.shape)
    blocks_["qs"] = rng.integers(-128, 128, (*blocks_.shape, 32))
    return blocks_


def kernels(dot: str, rows: str) -> ctypes.CDLL:
    """The build's CPU library with the one-row product `dot` and its group kernel `rows`
    declared (the test skipped where they are not built)."""
    needs_avx2()
    library = cpu_library()
    size, pointer, count = ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int
    getattr(library, dot).restype = None
    getattr(library, dot).argtypes = [count, pointer, size, pointer, size, pointer, size, count]
    getattr(library, rows).restype = ctypes.c_bool
    getattr(library, rows).argtypes = [
        count, count, count, pointer, size, pointer, size, pointer, size,
    ]  # fmt: skip
    return library


def one_row_products(dot: ctypes._CFuncPtr, weights: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """out[c, r]: weight row r times src1 row c, one product at a time."""
    out = np.zeros((len(rows), len(weights)), np.float32)
    n = weights.shape[1] * QK
    for c in range(len(rows)):
        for r in range(len(weights)):
            dot(n, out[c, r:].ctypes.data, 0, weights[r].ctypes.data, 0, rows[c].ctypes.data, 0, 1)
    return out


def group_products(
    gemm: ctypes._CFuncPtr, weights: np.ndarray, rows: np.ndarray
) -> tuple[bool, np.ndarray]:
    """Whether the group kernel computed the product, and what it wrote (NaN where nothing)."""
    out = np.full((len(rows), len(weights)), np.nan, np.float32)
    done = gemm(
        weights.shape[1] * QK, len(weights), len(rows), out.ctypes.data, len(weights),
        weights.ctypes.data, weights.strides[0], rows.ctypes.data, rows.strides[0],
    )  # fmt: skip
    return bool(done), out


def assert_bit_identical(
    library: ctypes.CDLL, dot: str, rows_kernel: str, weights: np.ndarray, rows: np.ndarray
) -> None:
    done, out = group_products(getattr(library, rows_kernel), weights, rows)
    assert done
    expected = one_row_products(getattr(library, dot), weights, rows)
    assert_products(expected)
    assert np.array_equal(out.view(np.uint32), expected.view(np.uint32))


def assert_rows_too_long_are_refused(
    library: ctypes.CDLL, rows_kernel: str, weights: np.ndarray, rows: np.ndarray
) -> None:
    assert weights.shape[1] > MAX_BLOCKS
    done, out = group_products(getattr(library, rows_kernel), weights, rows)
    assert not done
    assert np.isnan(out).all()  # nothing written


def assert_passes_are_one_token_steps_either_way(
    script: str, model: Path, tmp_path: Path, variable: str, on: str
) -> None:
    """Every row of a pass of each size in `PASSES` gets the logits of a one-token step with
    the switch `variable` at `on`, and every logit is the same with it at "0": each setting in
    a process of its own (ggml reads its switches once), `script`'s `__main__` saving them."""
    with_switch = saved_logits(script, model, tmp_path / "on.npy", variable, on)
    without = saved_logits(script, model, tmp_path / "off.npy", variable, "0")
    one_token_steps = with_switch[0]
    for index, size in enumerate(PASSES):
        assert np.array_equal(
            with_switch[index].view(np.uint32), one_token_steps.view(np.uint32)
        ), size
    assert np.array_equal(with_switch.view(np.uint32), without.view(np.uint32))
