"""The build check's real child on this machine: it loads the embedded model, decodes, and
reports what llama.cpp said on the way (system info, the weights' buffer types); its timing
run finds the row-exact attention path of Reame's build, or without it times a prompt in
both deterministic attention configurations."""

from __future__ import annotations

from pathlib import Path

import pytest

from reame_core.backend.probe import attention_attempt, child_command, run_attempt
from reame_core.backend.probe_child import ATTENTION, GENERATED, ROW_EXACT_ENV


def test_the_child_decodes_the_embedded_model_the_way_reame_loads_it(
    smollm2_path: Path, use_extra_bufts: bool
) -> None:
    launch = child_command(smollm2_path)

    attempt = run_attempt(launch(use_extra_bufts), extra_bufts=use_extra_bufts, timeout=60)

    assert attempt.outcome == "ok", attempt.describe()
    assert len(attempt.facts["tokens"]) == GENERATED
    assert "CPU :" in attempt.facts["system_info"]


def test_the_timing_child_finds_the_row_exact_path_and_times_nothing(
    smollm2_path: Path, use_extra_bufts: bool
) -> None:
    launch = child_command(smollm2_path, time_attention=True)

    attempt = attention_attempt(launch, extra_bufts=use_extra_bufts, timeout=120)

    assert attempt.outcome == "ok", attempt.describe()
    assert attempt.facts["one_row_exact_flash_f16"] is True
    assert "prefill_seconds" not in attempt.facts


def test_without_the_row_exact_path_the_child_times_both_attention_configurations(
    smollm2_path: Path, use_extra_bufts: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ROW_EXACT_ENV, "0")  # as a stock llama.cpp build computes
    launch = child_command(smollm2_path, time_attention=True)

    attempt = attention_attempt(launch, extra_bufts=use_extra_bufts, timeout=120)

    assert attempt.outcome == "ok", attempt.describe()
    assert attempt.facts["one_row_exact_flash_f16"] is False
    seconds = attempt.facts["prefill_seconds"]
    assert set(seconds) == set(ATTENTION) and all(0 < s < 60 for s in seconds.values())
    assert isinstance(attempt.facts["one_row_exact_without_flash"], bool)


def test_without_extra_buffer_types_the_weights_stay_in_the_file_mapping(
    smollm2_path: Path,
) -> None:
    attempt = run_attempt(child_command(smollm2_path)(False), extra_bufts=False, timeout=60)

    assert attempt.outcome == "ok", attempt.describe()
    assert set(attempt.facts["buffers"]) == {"CPU_Mapped"}
