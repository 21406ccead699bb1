"""The model's weights read into memory or mapped from the file (`--weights`): the same
logits either way; read, nothing of the file stays mapped and the weights ask for huge pages
with ggml's other buffers; mapped, the weights llama.cpp does not repack are computed from the
file's own pages. Each way in a process of its own, as a server loads one model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from reame_core.autoconfig.facts import transparent_huge_pages
from reame_core.backend.probe import BuildVerdict
from reame_core.models.shape import Weights


def _child(model: str, weights: Weights) -> None:
    from reame_core.backend.base import Batch
    from reame_core.backend.llama import LlamaBackend

    backend = LlamaBackend(
        model, n_ctx_seq=512, n_seq_max=1, n_batch=64, n_threads=2, weights=weights
    )
    batch = Batch()
    for position, token in enumerate(range(200, 240)):
        batch.add(token, position, 0, True)
    logits = np.array(backend.decode(batch))
    sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
    from common import memory_mib  # the benchmarks' reading of /proc/self/smaps

    memory = memory_mib(str(Path(model).resolve()))
    print(
        json.dumps({"weights": backend.info.extra["weights"], **memory, "logits": logits.tolist()})
    )
    backend.close()


def _run(model: Path, weights: str) -> dict[str, object]:
    completed = subprocess.run(
        [sys.executable, __file__, str(model), weights],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result: dict[str, object] = json.loads(completed.stdout.strip().splitlines()[-1])
    return result


def test_weights_read_or_mapped_compute_the_same_logits(
    smollm2_path: Path, build_check: BuildVerdict
) -> None:
    read = _run(smollm2_path, "read")
    mapped = _run(smollm2_path, "mapped")

    assert (read["weights"], mapped["weights"]) == ("read", "mapped")
    assert read["logits"] == mapped["logits"]  # 40 rows, bit for bit
    assert read["file_mappings"] == 0
    assert mapped["file_mappings"] >= 1
    # What llama.cpp does not repack for this CPU stays in the file's pages when mapped
    # (SmolLM2's Q4_1 and Q8_0 with AVX2 alone: some 90 MiB) and leaves them when read.
    buffers = build_check.fact("buffers") or {}
    from_file_mib = buffers.get("CPU_Mapped", 0)
    assert isinstance(mapped["file_mapped_mib"], float)
    assert mapped["file_mapped_mib"] >= from_file_mib / 2
    mode = transparent_huge_pages()
    if sys.platform.startswith("linux") and mode in ("madvise", "always") and from_file_mib >= 32:
        assert isinstance(read["anon_huge_pages_mib"], float)
        assert isinstance(mapped["anon_huge_pages_mib"], float)
        assert read["anon_huge_pages_mib"] - mapped["anon_huge_pages_mib"] >= from_file_mib / 2
    elif mode not in ("madvise", "always"):
        pytest.skip(f"weights read land in huge pages only where the host gives them ({mode})")


if __name__ == "__main__":
    _child(sys.argv[1], "read" if sys.argv[2] == "read" else "mapped")
