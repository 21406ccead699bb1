"""Reame's build asks the kernel for transparent huge pages for llama.cpp's buffers of 2 MiB
or more (`GGML_HUGEPAGES`, scripts/patches/ggml-hugepages.patch; Reame sets it): with 4 KiB
pages a decode's speed depended on where its weights landed. Checked: with the switch the
model's buffers are in huge pages wherever the kernel gives them to memory that asks (the
weights too, unless llama.cpp computes them from the file's own mapping), and the logits do
not change. Each side in a process of its own (ggml reads the switch once).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from reame_core.autoconfig.facts import transparent_huge_pages
from reame_core.backend.llama import HUGEPAGES_ENV


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
    mapped_kib = _file_mapped_kib(model)
    backend.close()
    print(json.dumps({"huge_kib": huge_kib, "mapped_kib": mapped_kib, "logits": logits.tolist()}))


def _file_mapped_kib(model: str) -> int:
    """KiB of the model file mapped into this process (weights llama.cpp computes from the
    file mapping itself: page cache, never anonymous huge pages)."""
    kib, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and len(fields) >= 5:  # a mapping's first line
            inside = len(fields) >= 6 and fields[5] == str(Path(model).resolve())
        elif inside and fields[:1] == ["Rss:"]:
            kib += int(fields[1])
    return kib


def _run(model: Path, switch: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, __file__, str(model)],
        env={**os.environ, HUGEPAGES_ENV: switch},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_buffers_ask_for_huge_pages_and_logits_stay(smollm2_path: Path) -> None:
    mode = transparent_huge_pages()
    if not sys.platform.startswith("linux") or mode == "unknown":
        pytest.skip("transparent huge pages are a Linux feature")
    if mode == "never":
        pytest.skip("transparent huge pages are switched off on this host")
    on = _run(smollm2_path, "1")
    off = _run(smollm2_path, "0")
    assert isinstance(on["huge_kib"], int) and isinstance(on["mapped_kib"], int)
    if on["mapped_kib"] < 32 * 1024:
        # Weights repacked for this CPU's kernels (AMX, AVX-512...) leave the file mapping
        # for buffers of their own: SmolLM2's take some 90 MiB, its KV cache more.
        assert on["huge_kib"] >= 32 * 1024
    else:
        # Computed from the file mapping itself (Q4_1 with AVX2 alone): what asks is the
        # KV cache (512 cells: some 12 MiB) and the compute buffer.
        assert on["huge_kib"] >= 4 * 1024
    if mode == "madvise":
        assert isinstance(off["huge_kib"], int) and off["huge_kib"] < on["huge_kib"]
    assert on["logits"] == off["logits"]


if __name__ == "__main__":
    _child(sys.argv[1])
