"""Sequence regions (scripts/patches/llama-kv-seq-regions.patch, `LLAMA_KV_SEQ_REGIONS`): in
the deterministic configuration each sequence keeps its cells in a region of its own in one
KV buffer, so one decode can give sequences different numbers of tokens, where per-sequence
streams cut it into micro-batches of equal tokens per sequence, each a pass over the weights.
A sequence's logits must not depend on that: every row of a sequence verifying a draft beside
neighbours that decode one token, or several, equals the same rows computed with the
sequence alone in the batch, and equals them computed with per-sequence streams (a process
of its own: Reame reads the user's setting as it loads). Checked on SmolLM2 (whose rows the
CPU backend computes alike in any batch, DESIGN "Determinism") and, where its weights are in
ggml's AMX buffer, on Qwen2.5-Coder-0.5B Q4_K_M.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from switched import saved_logits

from reame_core.backend.base import Batch
from reame_core.backend.llama import KV_REGIONS_ENV, LlamaBackend
from reame_core.backend.probe import BuildVerdict

pytestmark = pytest.mark.model

PROMPTS = (  # one per slot, of different lengths
    "Invoice 4471 from Castello Trading: twelve kettles, 240 EUR, due on 3 March 2025.",
    "The annual general meeting of the Greenway Cycling Club takes place on 21 November.",
    "def area(radius):\n    return 3.14159 * radius * radius\n",
    "Dear team, the warehouse in Graz closes early on Friday for the inventory count.",
)
OURS = 2  # the slot whose rows are compared
DRAFT = 5  # tokens it feeds in the compared step: a verified draft
NEIGHBOURS = {0: 1, 1: 3, 3: 1}  # tokens each neighbour feeds in that step


def _tokens(backend: LlamaBackend, text: str) -> list[int]:
    return backend.vocab.tokenize(text, add_special=False, parse_special=False)


def _step_rows(backend: LlamaBackend, slots: dict[int, int]) -> np.ndarray:
    """Prefill each slot's prompt (each in a call of its own), then one decode in which
    slot s feeds `slots[s]` tokens (its prompt's last ones, cut off before), in slot order,
    every row's logits kept; the rows of slot `OURS`."""
    for seq_id in range(backend.info.n_seq_max):
        backend.seq_rm(seq_id, -1, -1)
    prompts = {s: _tokens(backend, PROMPTS[s]) for s in slots}
    for seq_id, count in slots.items():
        batch = Batch()
        for position, token in enumerate(prompts[seq_id][:-count]):
            batch.add(token, position, seq_id, False)
        backend.decode(batch)
    step = Batch()
    ours: list[int] = []
    for seq_id, count in sorted(slots.items()):
        tokens = prompts[seq_id]
        for position in range(len(tokens) - count, len(tokens)):
            if seq_id == OURS:
                ours.append(len(step))
            step.add(tokens[position], position, seq_id, True)
    logits = backend.decode(step)
    return np.array(logits[ours], copy=True)


def _rows_with_neighbours(model: str, out: str, use_extra_bufts: bool) -> None:
    """Child: our slot's rows beside its neighbours, in this process's KV layout."""
    backend = _open(Path(model), use_extra_bufts)
    np.save(out, _step_rows(backend, {OURS: DRAFT, **NEIGHBOURS}))
    backend.close()


def _open(model: Path, use_extra_bufts: bool) -> LlamaBackend:
    """The deterministic configuration with the row-exact attention path (f16 keys and
    values), which regions serve."""
    return LlamaBackend(
        model,
        n_ctx_seq=512,
        n_seq_max=4,
        n_batch=128,
        n_threads=2,
        type_k="f16",
        type_v="f16",
        use_extra_bufts=use_extra_bufts,
    )


def _check(model: Path, use_extra_bufts: bool, tmp_path: Path) -> None:
    backend = _open(model, use_extra_bufts)
    try:
        assert backend.regions  # the build has them, and the deterministic f16 path is on
        # Uneven tokens per sequence: one pass, not one per micro-batch of equal tokens.
        assert backend.passes([(0, 1), (1, 3), (OURS, DRAFT), (3, 1)]) == [10]
        alone = _step_rows(backend, {OURS: DRAFT})
        together = _step_rows(backend, {OURS: DRAFT, **NEIGHBOURS})
    finally:
        backend.close()
    assert np.array_equal(alone, together)
    streams = saved_logits(
        __file__, model, tmp_path / "streams.npy", KV_REGIONS_ENV, "0", str(int(use_extra_bufts))
    )
    assert np.array_equal(alone, streams)


def test_smollm2_rows_do_not_depend_on_neighbours_of_other_lengths(
    smollm2_path: Path, use_extra_bufts: bool, row_exact_flash: None, tmp_path: Path
) -> None:
    _check(smollm2_path, use_extra_bufts, tmp_path)


def test_qwen_rows_do_not_depend_on_neighbours_of_other_lengths(
    qwen_coder_05b_path: Path, amx_weights: None, row_exact_flash: None, tmp_path: Path
) -> None:
    _check(qwen_coder_05b_path, True, tmp_path)


@pytest.fixture
def row_exact_flash(build_check: BuildVerdict) -> None:
    if not build_check.attention.row_exact_flash:
        pytest.skip("regions serve the row-exact flash attention path, which this build lacks")


def test_a_sliding_window_keeps_streams(gemma_path: Path, use_extra_bufts: bool) -> None:
    backend = _open(gemma_path, use_extra_bufts)
    try:
        assert not backend.regions
        assert len(backend.passes([(0, 1), (1, 3)])) == 2  # micro-batches of equal tokens
    finally:
        backend.close()


if __name__ == "__main__":
    _rows_with_neighbours(sys.argv[1], sys.argv[2], sys.argv[3] == "1")
