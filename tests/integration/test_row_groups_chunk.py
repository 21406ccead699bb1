"""ggml hands a product of two rows or more to its threads in chunks of 16 weight rows. Reame's
build hands the products of 2 to 12 rows that its row groups take (Q4_1, Q8_0, Q5_0, Q6_K) in
chunks of `ROW_GROUPS_CHUNK` rows instead (scripts/patches/ggml-row-groups-chunk.patch,
`GGML_ROW_GROUPS_CHUNK`). A speed-up only: which thread computes a row changes, not how.
Checked on SmolLM2 (Q4_1 and Q8_0) and Qwen2.5-Coder-0.5B (Q5_0, Q8_0 and Q6_K besides
repacked Q4_K): every row of a pass of 1 to 13 tokens (past the switch's 12) gets the logits
of a one-token step, and the same logits with the switch on and off (each in a process of
its own: ggml reads it once per process).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from row_groups import assert_passes_are_one_token_steps_either_way, needs_avx2
from test_row_kernels import PASSES, logits_by_pass

from reame_core.backend.llama import ROW_GROUPS_CHUNK, ROW_GROUPS_CHUNK_ENV
from reame_core.backend.probe import BuildVerdict


@pytest.mark.parametrize("model", ["smollm2", pytest.param("qwen", marks=pytest.mark.qwen)])
def test_rows_of_every_pass_get_the_logits_of_one_token_steps_in_either_chunks(
    model: str, build_check: BuildVerdict, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    needs_avx2()
    if "AMX" in (build_check.fact("buffers") or {}):
        pytest.skip("the weights are in ggml's AMX buffers here, off the row groups")
    assert max(PASSES) > 8  # past the Q8_0 groups, which stop at 8 rows
    path = request.getfixturevalue("smollm2_path" if model == "smollm2" else "qwen_coder_05b_path")
    assert_passes_are_one_token_steps_either_way(
        __file__, path, tmp_path, ROW_GROUPS_CHUNK_ENV, str(ROW_GROUPS_CHUNK)
    )


if __name__ == "__main__":
    logits_by_pass(sys.argv[1], sys.argv[2])
