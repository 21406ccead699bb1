"""The process a trial runs in, and the parent's side of starting it.

Every trial gets a fresh interpreter: two ways of driving llama.cpp in one process
interfere (each calling thread gets its own OpenMP team, and on a 2-core host the idle
team's spinning workers steal cycles), and a fresh process is what a restarted server
sees. The child reads a `Trial` as JSON from its argument and prints its `Sample` as the
last line of stdout.

    python -m reame_core.bench.child '<trial json>'
"""

from __future__ import annotations

import subprocess
import sys

from reame_core.bench.trial import Sample, Trial


class TrialFailed(RuntimeError):
    """A trial's process failed; the message ends with the end of its stderr."""


def measure_in_child(trial: Trial, timeout: float = 900) -> Sample:
    """Run `trial` in a fresh Python process and return its sample."""
    try:
        completed = subprocess.run(
            [sys.executable, "-m", "reame_core.bench.child", trial.to_json()],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise TrialFailed(f"{trial.workload} {trial.arm}: no result after {timeout} s") from None
    lines = completed.stdout.strip().splitlines()
    if completed.returncode != 0 or not lines:
        tail = completed.stderr.strip().splitlines()[-1:] or [f"exit {completed.returncode}"]
        raise TrialFailed(f"{trial.workload} {trial.arm}: {tail[0]}")
    return Sample.from_json(lines[-1])


def main(argv: list[str]) -> int:
    from reame_core.bench.arms import run_trial
    from reame_core.logs import configure_logging

    configure_logging(json=False, level="warning")
    sample = run_trial(Trial.from_json(argv[0]))
    print(sample.to_json(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
