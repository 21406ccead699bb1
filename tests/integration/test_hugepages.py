"""Reame's build asks the kernel for transparent huge pages for llama.cpp's buffers of 2 MiB
or more (`GGML_HUGEPAGES`, scripts/patches/ggml-hugepages.patch; Reame sets it): with 4 KiB
pages a decode's speed depended on where its weights landed. Checked: with the switch the
model's buffers are in huge pages wherever the kernel gives them to memory that asks (the
weights too, unless llama.cpp computes them from the file's own mapping), and the logits do
not change. Each side in a process of its own (ggml reads the switch once).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from switched import switched_run

from reame_core.autoconfig.facts import transparent_huge_pages
from reame_core.backend.llama import HUGEPAGES_ENV
from reame_core.backend.probe import BuildVerdict


def _child(model: str) -> None:
    from reame_core.backend.base import Batch
    from reame_core.backend.llama import LlamaBackend

    backend = LlamaBackend(model, n_ctx_seq=512, n_seq_max=1, n_batch=64, n_threads=2)
    batch = Batch()
    for position, token in enumerate(range(200, 240)):
        batch.add(token, position, 0, position == 39)
    logits = np.array(backend.decode(batch))
    huge_kib = 0
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            huge_kib = int(line.split()[1])
    backend.close()
    print(json.dumps({"huge_kib": huge_kib, "logits": logits.tolist()}))


def _run(model: Path, switch: str) -> dict[str, object]:
    result: dict[str, object] = json.loads(
        switched_run(__file__, HUGEPAGES_ENV, switch, str(model), timeout=300)
    )
    return result


def test_buffers_ask_for_huge_pages_and_logits_stay(
    smollm2_path: Path, build_check: BuildVerdict
) -> None:
    mode = transparent_huge_pages()
    if not sys.platform.startswith("linux") or mode == "unknown":
        pytest.skip("transparent huge pages are a Linux feature")
    if mode == "never":
        pytest.skip("transparent huge pages are switched off on this host")
    on = _run(smollm2_path, "1")
    off = _run(smollm2_path, "0")
    assert isinstance(on["huge_kib"], int)
    # Weights repacked for this CPU's kernels (AMX, AVX-512...) leave the file's mapping for
    # buffers of their own, as the build check's load logged them: SmolLM2's take some 90
    # MiB. Weights computed from the mapping itself (Q4_1 with AVX2 alone) stay in the page
    # cache, and what asks is the KV cache (512 cells: some 12 MiB) and the compute buffer.
    buffers = build_check.fact("buffers") or {}
    copied_mib = sum(size for kind, size in buffers.items() if kind != "CPU_Mapped")
    assert on["huge_kib"] >= (32 if copied_mib >= 32 else 4) * 1024
    if mode == "madvise":
        assert isinstance(off["huge_kib"], int) and off["huge_kib"] < on["huge_kib"]
    assert on["logits"] == off["logits"]


if __name__ == "__main__":
    _child(sys.argv[1])
