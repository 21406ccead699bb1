"""A test module run again as a child process with one of the build's switches set: ggml
reads such a switch once per process, so each setting needs a process of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np


def switched_run(script: str, variable: str, switch: str, *args: str, timeout: float = 600) -> str:
    """Run `script ARGS` with the environment variable `variable` set to `switch`; the last
    line it printed (after any log)."""
    done = subprocess.run(
        [sys.executable, script, *args],
        env={**os.environ, variable: switch},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    return lines[-1] if lines else ""


def saved_logits(
    script: str, model: Path, out: Path, variable: str, switch: str, *args: str
) -> np.ndarray:
    """Run `script MODEL OUT ARGS` (the module's `__main__` saves an array of logits to OUT)
    with the environment variable `variable` set to `switch`; the array it saved."""
    switched_run(script, variable, switch, str(model), str(out), *args)
    return np.load(out)
