"""Loading a model leaves no OpenMP workers behind on the thread that loaded it.

ggml's AMX path repacks weights in OpenMP parallel loops, and the thread that runs one keeps
a team of workers as long as it lives. With more threads under OpenMP than cores, libgomp
barely spins at a barrier before sleeping, and the engine's decodes on their own thread then
wait on futexes at every barrier (six times slower on the 2-vCPU Intel Xeon with AMX). The
check runs in a fresh interpreter: in this one, earlier tests may already have given the
main thread a team. It needs a load that runs those loops: AMX weights (a CPU with AMX, the
default load); elsewhere it is skipped.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# A thread that ends lets libgomp dismiss its workers a moment later: counted for a second.
COUNT_THREADS = """
import json, os, sys, time
from reame_core.backend.llama import LlamaBackend
count = lambda: len(os.listdir("/proc/self/task"))
before = count()
backend = LlamaBackend(sys.argv[1])
deadline = time.monotonic() + 1.0
while count() > before and time.monotonic() < deadline:
    time.sleep(0.05)
print(json.dumps({"before": before, "after": count()}))
"""


def amx() -> bool:
    try:
        return "amx_tile" in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


def test_loading_a_model_leaves_the_loading_thread_without_openmp_workers(
    smollm2_path: Path, use_extra_bufts: bool
) -> None:
    if not (amx() and use_extra_bufts):
        pytest.skip("no load here runs OpenMP loops: they repack weights for AMX")
    completed = subprocess.run(
        [sys.executable, "-c", COUNT_THREADS, str(smollm2_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    counts = json.loads(completed.stdout.strip().splitlines()[-1])

    assert counts["after"] == counts["before"], counts
