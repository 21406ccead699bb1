"""Qwen2.5-Coder-0.5B fetched from its PyPI part packages runs under its alias, offline."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REAME = Path(sys.executable).parent / "reame"


def test_the_fetched_model_answers_under_its_alias_with_no_network(
    qwen_coder_05b_path: Path, tmp_path: Path
) -> None:
    # A fresh Reame cache holding only the fetched file, where fetch-models puts it: the
    # alias must find it there, hash it once, and never ask the (unreachable) hub.
    cache = tmp_path / "reame-cache"
    (cache / "models").mkdir(parents=True)
    (cache / "models" / qwen_coder_05b_path.name).symlink_to(qwen_coder_05b_path)
    environment = {
        **os.environ,
        "REAME_CACHE_DIR": str(cache),
        "HF_HUB_CACHE": str(tmp_path / "empty-hf-cache"),
        "HF_ENDPOINT": "http://127.0.0.1:9",
        "HF_HUB_OFFLINE": "1",
    }

    done = subprocess.run(
        [
            str(REAME),
            "run",
            "qwen2.5-coder-0.5b",
            "Write a hello world program in Python.",
            "--max-tokens",
            "48",
            "--temperature",
            "0",
        ],
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    assert 'print("Hello, World!")' in done.stdout
