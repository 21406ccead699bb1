"""The build check's real child on this machine: it loads the embedded model, decodes, and
reports what llama.cpp said on the way (system info, the weights' buffer types), then times
a prompt in both deterministic attention configurations."""

from __future__ import annotations

from pathlib import Path

from reame_core.backend.probe import child_command, run_attempt
from reame_core.backend.probe_child import ATTENTION, GENERATED


def test_the_child_decodes_the_embedded_model_the_way_reame_loads_it(
    smollm2_path: Path, use_extra_bufts: bool
) -> None:
    launch = child_command(smollm2_path)

    attempt = run_attempt(launch(use_extra_bufts), extra_bufts=use_extra_bufts, timeout=60)

    assert attempt.outcome == "ok", attempt.describe()
    assert len(attempt.facts["tokens"]) == GENERATED
    assert "CPU :" in attempt.facts["system_info"]


def test_the_timing_child_times_a_prompt_in_both_attention_configurations(
    smollm2_path: Path, use_extra_bufts: bool
) -> None:
    launch = child_command(smollm2_path, time_attention=True)

    attempt = run_attempt(
        launch(use_extra_bufts), extra_bufts=use_extra_bufts, timeout=60, passive=False
    )

    assert attempt.outcome == "ok", attempt.describe()
    seconds = attempt.facts["prefill_seconds"]
    assert set(seconds) == set(ATTENTION) and all(0 < s < 60 for s in seconds.values())


def test_without_extra_buffer_types_the_weights_stay_in_the_file_mapping(
    smollm2_path: Path,
) -> None:
    attempt = run_attempt(child_command(smollm2_path)(False), extra_bufts=False, timeout=60)

    assert attempt.outcome == "ok", attempt.describe()
    assert set(attempt.facts["buffers"]) == {"CPU_Mapped"}
