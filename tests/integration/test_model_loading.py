"""Loading a model leaves no OpenMP workers behind on the thread that loaded it.

ggml's AMX path repacks weights in OpenMP parallel loops, and the thread that runs one keeps
a team of workers as long as it lives. With more threads under OpenMP than cores, libgomp
barely spins at a barrier before sleeping, and the engine's decodes on their own thread then
wait on futexes at every barrier (six times slower on the 2-vCPU Intel Xeon with AMX). Each
check runs in a fresh interpreter: in this one, earlier tests may already have given the
main thread a team. Where a load runs no parallel loop (no AMX), nothing is left either.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

COUNT_THREADS = """
import json, os, sys
from reame_core.backend.llama import LlamaBackend
before = len(os.listdir("/proc/self/task"))
backend = LlamaBackend(sys.argv[1], use_extra_bufts=sys.argv[2] == "1")
print(json.dumps({"before": before, "after": len(os.listdir("/proc/self/task"))}))
"""


def test_loading_a_model_leaves_the_loading_thread_without_openmp_workers(
    smollm2_path: Path, use_extra_bufts: bool
) -> None:
    completed = subprocess.run(
        [sys.executable, "-c", COUNT_THREADS, str(smollm2_path), "1" if use_extra_bufts else "0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    counts = json.loads(completed.stdout.strip().splitlines()[-1])

    assert counts["after"] == counts["before"], counts
