"""`reame run MODEL` end to end, as a user runs it: a separate process, a hub, nothing set up.

The fake hub serves the embedded SmolLM2 GGUF under the qwen2.5-1.5b repository and file
name, so the whole path runs for real: download into the Hugging Face cache, checksum,
GGUF header read, host plan, model load, chat template, generation.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from fakehub import FakeHub

from reame_core.backend.llama import read_model_shape
from reame_core.models.registry import CARDS

QWEN = CARDS["qwen2.5-1.5b"]


def reame(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reame_core.cli.main", *args],
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_run_downloads_configures_and_answers_then_runs_offline(
    fake_hub: FakeHub, smollm2_path: Path
) -> None:
    served = fake_hub.add(QWEN.repo, QWEN.file, smollm2_path)

    first = reame("run", "qwen2.5-1.5b", "What is the capital of France?", "--max-tokens", "12")

    assert first.returncode == 0, first.stderr
    assert first.stdout.strip()
    assert [t.body_bytes for t in fake_hub.transfers()] == [served.size]

    requests = len(fake_hub.log)
    offline = reame("run", "qwen2.5-1.5b", "Name a colour.", "--max-tokens", "6",
                    env={"HF_HUB_OFFLINE": "1"})  # fmt: skip

    assert offline.returncode == 0, offline.stderr
    assert offline.stdout.strip()
    assert len(fake_hub.log) == requests

    listing = reame("ls")
    assert "qwen2.5-1.5b" in listing.stdout
    assert "never" not in listing.stdout.split("qwen2.5-1.5b", 1)[1].splitlines()[0]


def test_explain_plans_from_the_downloaded_file(fake_hub: FakeHub, smollm2_path: Path) -> None:
    fake_hub.add(QWEN.repo, QWEN.file, smollm2_path)
    assert reame("pull", "qwen2.5-1.5b").returncode == 0

    explained = reame("run", "qwen2.5-1.5b", "--explain")

    assert explained.returncode == 0, explained.stderr
    assert "models--Qwen--Qwen2.5-1.5B-Instruct-GGUF" in explained.stdout
    # The file's own header (SmolLM2's 8192 trained tokens), not the qwen2.5-1.5b card.
    assert "trained on 8192" in explained.stdout


def test_run_without_a_model_uses_the_embedded_one_offline(model_caches: Path) -> None:
    result = reame("run", "Say hello.", "--max-tokens", "6", env={"HF_HUB_OFFLINE": "1"})

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()


def test_the_registry_card_of_the_embedded_model_matches_its_file(smollm2_path: Path) -> None:
    card = CARDS["smollm2-135m"]
    shape = read_model_shape(smollm2_path)

    assert replace(shape, file_bytes=card.shape.file_bytes) == card.shape
    assert abs(shape.file_bytes - card.size_bytes) < 0.02 * card.size_bytes
