"""Where no AMX kernel takes K-quant weights (x86 with AVX2), Reame's build multiplies repacked
Q4_K and Q6_K weights with 2 to N rows in row groups, each block of the weights unpacked once
for all the rows (scripts/patches/ggml-k-quant-row-groups.patch, `GGML_K_QUANT_ROW_GROUPS=N`:
`K_QUANT_ROW_GROUPS` in the fast configuration, every product in the deterministic one),
where ggml's 4-row and tiled kernels give a row other logits than a one-row product. Every
output must be bit-identical to ggml's one-row product: checked on both kernels against
ggml's one-row kernels on random blocks of every group shape and of 40 and 130 rows, and on
Qwen2.5-Coder-0.5B and Gemma 3 270M: with the switch, every row of a pass of up to 13 tokens
gets the logits of one-token steps; without it, passes of one to three tokens (one row after
another in ggml) get the same logits as with it; on every product, a prompt cut into chunks
of other lengths gets the same logits. Each setting in a process of its own, since ggml
reads the switch once per process. (Those two models' K-quant weights are a few of their
layers' `ffn_down` and `attn_v`, 9-15% of their bytes; their output layers are Q8_0.)
"""

from __future__ import annotations

import ctypes
import itertools
import sys
from pathlib import Path

import numpy as np
import pytest
from row_groups import assert_products, cpu_library
from switched import saved_logits, switched_run
from test_row_kernels import PASSES, logits_by_pass

from reame_core.backend.llama import (
    GRAPH_CACHE_TOKENS,
    K_QUANT_ROW_GROUPS,
    K_QUANT_ROW_GROUPS_ENV,
    K_QUANT_ROW_GROUPS_EVERY,
)
from reame_core.backend.pass_check import TOKENS
from reame_core.backend.probe import BuildVerdict, cpu_flags
from reame_core.settings import Settings

QK_K = 256  # values per block
Q6_K = np.dtype(
    [("ql", "u1", QK_K // 2), ("qh", "u1", QK_K // 4), ("scales", "i1", QK_K // 16), ("d", "<f2")]
)
Q8_K = np.dtype([("d", "<f4"), ("qs", "i1", QK_K), ("bsums", "<i2", QK_K // 16)])
# Eight Q4_K rows interleaved for ggml's repacked kernels (block_q4_Kx8)
Q4_KX8 = np.dtype([("d", "<f2", 8), ("dmin", "<f2", 8), ("scales", "u1", 96), ("qs", "u1", 1024)])


def _needs_avx2() -> None:
    if "avx2" not in cpu_flags():
        pytest.skip("the K-quant row groups are built for x86 CPUs with AVX2")


def _needs_the_groups(build_check: BuildVerdict) -> None:
    """Skip where a model's K-quant products do not reach the groups."""
    _needs_avx2()
    if "AMX" in (build_check.fact("buffers") or {}):
        pytest.skip("K-quant weights are in ggml's AMX buffer here, off this path")


@pytest.fixture(scope="module")
def ggml_cpu() -> ctypes.CDLL:
    _needs_avx2()
    library = cpu_library()
    size = ctypes.c_size_t
    library.ggml_vec_dot_q6_K_q8_K.restype = None
    library.ggml_vec_dot_q6_K_q8_K.argtypes = [
        ctypes.c_int, ctypes.c_void_p, size, ctypes.c_void_p, size, ctypes.c_void_p, size,
        ctypes.c_int,
    ]  # fmt: skip
    library.ggml_gemm_q6_K_q8_K_rows.restype = None
    library.ggml_gemm_q6_K_q8_K_rows.argtypes = [
        ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, size,
        ctypes.c_void_p, size, ctypes.c_void_p, size, ctypes.c_int,
    ]  # fmt: skip
    for name in ("ggml_gemv_q4_K_8x8_q8_K", "ggml_gemv_q4_K_8x8_q8_K_rows"):
        getattr(library, name).restype = None
        getattr(library, name).argtypes = [
            ctypes.c_int, ctypes.c_void_p, size, ctypes.c_void_p, ctypes.c_void_p,
            ctypes.c_int, ctypes.c_int,
        ]  # fmt: skip
    return library


def _q6_k(rng: np.random.Generator, rows: int, blocks: int) -> np.ndarray:
    weights = np.zeros((rows, blocks), Q6_K)
    weights["ql"] = rng.integers(0, 256, (*weights.shape, QK_K // 2))
    weights["qh"] = rng.integers(0, 256, (*weights.shape, QK_K // 4))
    weights["scales"] = rng.integers(-128, 128, (*weights.shape, QK_K // 16))
    weights["d"] = rng.uniform(1e-4, 2e-2, weights.shape)
    return weights


def _q8_k(rng: np.random.Generator, rows: int, blocks: int) -> np.ndarray:
    """src1 rows quantized as ggml quantizes them for a K-quant product (bsums: sums of 16)."""
    values = np.zeros((rows, blocks), Q8_K)
    values["qs"] = rng.integers(-127, 128, (*values.shape, QK_K))
    values["d"] = rng.uniform(1e-3, 5e-2, values.shape)
    values["bsums"] = values["qs"].reshape(rows, blocks, QK_K // 16, 16).sum(axis=-1)
    return values


@pytest.mark.parametrize("blocks", [1, 6, 35])
@pytest.mark.parametrize("row_count", [*range(2, 18), 40, 130])
def test_every_q6_k_output_is_the_one_row_dot_product_bit_for_bit(
    ggml_cpu: ctypes.CDLL, blocks: int, row_count: int
) -> None:
    rng = np.random.default_rng(blocks * 100 + row_count)
    weights = _q6_k(rng, 19, blocks)
    rows = _q8_k(rng, row_count, blocks)
    out = np.full((row_count, len(weights)), np.nan, np.float32)
    ggml_cpu.ggml_gemm_q6_K_q8_K_rows(
        blocks * QK_K, len(weights), row_count, out.ctypes.data, len(weights),
        weights.ctypes.data, weights.strides[0], rows.ctypes.data, rows.strides[0], 0,
    )  # fmt: skip
    expected = np.zeros_like(out)
    for c in range(row_count):
        for r in range(len(weights)):
            ggml_cpu.ggml_vec_dot_q6_K_q8_K(
                blocks * QK_K, expected[c, r:].ctypes.data, 0, weights[r].ctypes.data, 0,
                rows[c].ctypes.data, 0, 1,
            )  # fmt: skip
    assert_products(expected)
    assert np.array_equal(out.view(np.uint32), expected.view(np.uint32))


def _q4_k_x8(rng: np.random.Generator, columns: int, blocks: int) -> np.ndarray:
    """Repacked Q4_K weights: eight weight rows (columns of the product) per block."""
    weights = np.zeros((columns // 8, blocks), Q4_KX8)
    weights["d"] = rng.uniform(1e-4, 2e-2, weights["d"].shape)
    weights["dmin"] = rng.uniform(1e-4, 2e-2, weights["dmin"].shape)
    weights["scales"] = rng.integers(0, 256, weights["scales"].shape)
    weights["qs"] = rng.integers(0, 256, weights["qs"].shape)
    return weights


@pytest.mark.parametrize("blocks", [1, 6, 35])
@pytest.mark.parametrize("row_count", [*range(1, 18), 40, 130])
def test_every_repacked_q4_k_output_is_the_one_row_product_bit_for_bit(
    ggml_cpu: ctypes.CDLL, blocks: int, row_count: int
) -> None:
    rng = np.random.default_rng(blocks * 1000 + row_count)
    columns = 24
    weights = _q4_k_x8(rng, columns, blocks)
    rows = _q8_k(rng, row_count, blocks)
    out = np.full((row_count, columns), np.nan, np.float32)
    ggml_cpu.ggml_gemv_q4_K_8x8_q8_K_rows(
        blocks * QK_K, out.ctypes.data, columns, weights.ctypes.data, rows.ctypes.data,
        row_count, columns,
    )  # fmt: skip
    expected = np.full_like(out, np.nan)
    for r in range(row_count):
        ggml_cpu.ggml_gemv_q4_K_8x8_q8_K(
            blocks * QK_K, expected[r].ctypes.data, columns, weights.ctypes.data,
            rows[r].ctypes.data, 1, columns,
        )  # fmt: skip
    assert_products(expected)
    assert np.array_equal(out.view(np.uint32), expected.view(np.uint32))


def test_the_groups_cover_a_default_draft_verified_with_the_token_after_it() -> None:
    # The fast configuration's setting (a deterministic server takes every product), the
    # pass check's longest step and the graphs kept for reuse.
    assert K_QUANT_ROW_GROUPS == Settings().draft_max + 1 == TOKENS == GRAPH_CACHE_TOKENS


# A prompt's first tokens in chunks on the grid of 16, as the engine cuts them: alone, after
# a prefix reused up to a grid point, beside neighbours sharing the step's prompt budget.
CHUNKINGS = (
    (0, 40),
    (0, 32, 40),
    (0, 16, 32, 40),
    (0, 100),
    (0, 96, 100),
    (0, 64, 100),
    (0, 48, 96, 100),
    (0, 150),
    (0, 128, 150),
    (0, 144, 150),
)


def chunked_logits(model: str, out: str) -> None:
    """Child: for each of `CHUNKINGS`, the prompt's last row and the next one-token step's
    logits, after the prompt computed in those chunks; saved as one array."""
    from reame_core.backend.base import Batch
    from reame_core.backend.llama import LlamaBackend

    backend = LlamaBackend(model, n_ctx_seq=512, n_seq_max=1, n_batch=256, n_threads=2)
    rng = np.random.default_rng(5)
    tokens = [int(t) for t in rng.integers(100, 5000, 160)]
    runs = []
    for cuts in CHUNKINGS:
        backend.seq_rm(0, -1, -1)
        for start, end in itertools.pairwise(cuts):
            batch = Batch()
            for position in range(start, end):
                batch.add(tokens[position], position, 0, position == end - 1)
            last = np.array(backend.decode(batch)[-1], copy=True)
        batch = Batch()
        batch.add(tokens[cuts[-1]], cuts[-1], 0, True)
        runs.append(np.stack([last, np.array(backend.decode(batch)[-1], copy=True)]))
    backend.close()
    np.save(out, np.stack(runs))


@pytest.mark.qwen
def test_a_prompts_rows_do_not_depend_on_how_it_was_cut_into_chunks(
    qwen_coder_05b_path: Path, build_check: BuildVerdict, tmp_path: Path
) -> None:
    # A deterministic server reuses a prefix, restores a stored one and shares the step's
    # prompt budget among neighbours, so one prompt is cut into chunks of other lengths from
    # run to run. With the groups on every product (a deterministic server's setting), a
    # row's logits and KV do not depend on its chunk's length; with ggml's kernels (and
    # with the fast configuration's groups of up to 33 rows) a chunk of a few rows takes
    # another kernel than a long one, and the tokens after it may differ.
    _needs_the_groups(build_check)

    def by_chunking(switch: str) -> list[bool]:
        runs = saved_logits(
            __file__, qwen_coder_05b_path, tmp_path / f"{switch}.npy", K_QUANT_ROW_GROUPS_ENV,
            switch, "--chunked",
        )  # fmt: skip
        whole = {cuts[-1]: runs[i] for i, cuts in enumerate(CHUNKINGS) if len(cuts) == 2}
        return [
            np.array_equal(runs[i].view(np.uint32), whole[cuts[-1]].view(np.uint32))
            for i, cuts in enumerate(CHUNKINGS)
        ]

    assert all(by_chunking(str(K_QUANT_ROW_GROUPS_EVERY)))
    assert not all(by_chunking(str(K_QUANT_ROW_GROUPS)))
    assert not all(by_chunking("0")), "ggml's kernels no longer depend on a chunk's length"


@pytest.mark.parametrize(
    "model",
    [pytest.param("qwen", marks=pytest.mark.qwen), pytest.param("gemma", marks=pytest.mark.gemma)],
)
def test_rows_of_a_pass_get_the_logits_of_one_token_steps(
    model: str, build_check: BuildVerdict, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    _needs_the_groups(build_check)
    path = request.getfixturevalue("qwen_coder_05b_path" if model == "qwen" else "gemma_path")
    assert max(PASSES) <= K_QUANT_ROW_GROUPS
    on = saved_logits(
        __file__, path, tmp_path / "on.npy", K_QUANT_ROW_GROUPS_ENV, str(K_QUANT_ROW_GROUPS)
    )
    off = saved_logits(__file__, path, tmp_path / "off.npy", K_QUANT_ROW_GROUPS_ENV, "0")
    one_token_steps = on[0]
    for index, size in enumerate(PASSES):
        assert np.array_equal(on[index].view(np.uint32), one_token_steps.view(np.uint32)), size
        if size <= 3:  # ggml's own kernels multiply such passes one row after another
            assert np.array_equal(off[index].view(np.uint32), on[index].view(np.uint32)), size


def _fingerprint(model: Path, switch: str) -> str:
    return switched_run(
        __file__, K_QUANT_ROW_GROUPS_ENV, switch, "--fingerprint", str(model), timeout=300
    )


@pytest.mark.usefixtures("build_check")
def test_a_models_fingerprint_names_the_groups_where_they_are_on(gemma_path: Path) -> None:
    # A state restored from the disk cache must equal a cold prefill's, and the groups
    # compute prompt tails of a few tokens otherwise than ggml's kernels.
    _needs_avx2()
    on = _fingerprint(gemma_path, str(K_QUANT_ROW_GROUPS))
    assert on.endswith(f" {K_QUANT_ROW_GROUPS}")
    off = _fingerprint(gemma_path, "0")
    assert off.endswith(" 0")
    assert on.split()[0] != off.split()[0]
    # A deterministic server's setting computes prompt chunks otherwise than both.
    every = _fingerprint(gemma_path, str(K_QUANT_ROW_GROUPS_EVERY))
    assert every.endswith(f" {K_QUANT_ROW_GROUPS_EVERY}")
    assert every.split()[0] not in {on.split()[0], off.split()[0]}


if __name__ == "__main__":
    if sys.argv[1] == "--fingerprint":
        from reame_core.backend.llama import LlamaBackend, k_quant_row_groups

        backend = LlamaBackend(sys.argv[2], n_ctx_seq=256, n_seq_max=1, n_threads=1)
        print(backend.info.fingerprint, k_quant_row_groups())
        backend.close()
    elif sys.argv[3:] == ["--chunked"]:
        chunked_logits(sys.argv[1], sys.argv[2])
    else:
        logits_by_pass(sys.argv[1], sys.argv[2])
