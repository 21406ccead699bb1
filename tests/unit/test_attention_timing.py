"""Each model's attention timed once per build and CPU, with fake timing children: the build
check's model keeps its verdict's timing, any other is timed on its first run and kept, a
timing cut short is taken again, and the plan follows the model's own timing. No model is
loaded."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from fake_children import (
    DECODES,
    HANGS_IN_ATTENTION,
    HANGS_TIMING_ATTENTION,
    ROW_EXACT,
    TIMES_FLASH_SLOW,
    TIMES_FLASH_SLOW_INEXACT,
    TIMES_LEVEL,
    FakeChildren,
    InstallChildren,
    install_children,
)

from reame_core import runtime
from reame_core.backend import llama
from reame_core.backend.attention_timing import cached_timing, time_attention
from reame_core.backend.probe import (
    BuildVerdict,
    ProbeAttempt,
    ProbeSubject,
    attention_facts,
    check_build,
)
from reame_core.cli.config import config_command
from reame_core.models.registry import CARDS
from reame_core.settings import Settings


def gain(timing: ProbeAttempt | None) -> float | None:
    return attention_facts(timing).prompt_gain_without_flash


SUBJECT = ProbeSubject(build="llama-cpp-python 0.3.36\nlibllama.so 1000 1 1", cpu="Xeon\namx")


def model_file(folder: Path, name: str, size: int = 4) -> Path:
    path = folder / name
    path.write_bytes(b"G" * size)
    return path


@pytest.fixture
def checked(tmp_path: Path) -> BuildVerdict:
    """A verdict whose check timed its own model (the embedded one) 4x faster without flash
    attention, as on the Intel host with SmolLM2."""
    embedded = model_file(tmp_path, "embedded.gguf")
    children = FakeChildren(DECODES, timing=TIMES_FLASH_SLOW)
    return check_build(tmp_path, SUBJECT, embedded, launch=children, timing=children.timing)


def test_the_checked_model_keeps_the_verdicts_timing(tmp_path: Path, checked: BuildVerdict) -> None:
    children = FakeChildren(DECODES)

    timing = time_attention(tmp_path, checked, Path(checked.model), launch=children.timing)

    assert children.timed == [] and gain(timing) == 4.0


def test_another_model_is_timed_on_its_first_run_and_kept(
    tmp_path: Path, checked: BuildVerdict
) -> None:
    other = model_file(tmp_path, "qwen.gguf", size=8)
    first, second = FakeChildren(DECODES), FakeChildren(DECODES)

    timed = time_attention(tmp_path, checked, other, launch=first.timing)
    kept = time_attention(tmp_path, checked, other, launch=second.timing)

    assert first.timed == [checked.use_extra_bufts] and second.timed == []
    assert gain(timed) == gain(kept) == 1.0


def test_no_model_is_timed_on_a_build_with_the_row_exact_path(tmp_path: Path) -> None:
    embedded, other = model_file(tmp_path, "embedded.gguf"), model_file(tmp_path, "q.gguf", 8)
    check = FakeChildren(DECODES, timing=ROW_EXACT)
    verdict = check_build(tmp_path, SUBJECT, embedded, launch=check, timing=check.timing)
    children = FakeChildren(DECODES)

    timing = time_attention(tmp_path, verdict, other, launch=children.timing)

    assert children.timed == [] and attention_facts(timing).row_exact_flash


def test_no_model_is_timed_while_the_checks_row_exact_question_is_unanswered(
    tmp_path: Path,
) -> None:
    embedded, other = model_file(tmp_path, "embedded.gguf"), model_file(tmp_path, "q.gguf", 8)
    check = FakeChildren(DECODES, timing=HANGS_IN_ATTENTION)
    verdict = check_build(
        tmp_path, SUBJECT, embedded, launch=check, timing=check.timing, timeout=1.0
    )
    children = FakeChildren(DECODES)

    assert time_attention(tmp_path, verdict, other, launch=children.timing) is None
    assert children.timed == []


def test_a_model_not_timed_yet_has_no_timing_for_config(
    tmp_path: Path, checked: BuildVerdict
) -> None:
    assert cached_timing(tmp_path, checked, model_file(tmp_path, "new.gguf", size=9)) is None


def test_another_file_of_the_same_name_is_timed_again(
    tmp_path: Path, checked: BuildVerdict
) -> None:
    children = FakeChildren(DECODES)
    time_attention(tmp_path, checked, model_file(tmp_path, "m.gguf", 8), launch=children.timing)

    time_attention(tmp_path, checked, model_file(tmp_path, "m.gguf", 16), launch=children.timing)

    assert len(children.timed) == 2


def test_a_timing_cut_short_is_not_kept(tmp_path: Path, checked: BuildVerdict) -> None:
    other = model_file(tmp_path, "big.gguf", size=8)
    slow = FakeChildren(DECODES, timing=HANGS_TIMING_ATTENTION)

    cut = time_attention(tmp_path, checked, other, launch=slow.timing, timeout=1.0)

    assert cut is not None and cut.outcome == "hung" and gain(cut) is None
    assert cached_timing(tmp_path, checked, other) is None


def test_an_unreadable_timing_is_taken_again(tmp_path: Path, checked: BuildVerdict) -> None:
    other = model_file(tmp_path, "m.gguf", 8)
    children = FakeChildren(DECODES)
    time_attention(tmp_path, checked, other, launch=children.timing)
    (kept,) = (tmp_path / "build-checks").glob("*-attention-*.json")
    kept.write_text("{ half a file")

    time_attention(tmp_path, checked, other, launch=children.timing)

    assert len(children.timed) == 2


@pytest.fixture
def children(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> InstallChildren:
    return install_children(monkeypatch, tmp_path)


@pytest.mark.parametrize(
    ("timing", "flash_attn"),
    [
        (TIMES_LEVEL, True),
        (TIMES_FLASH_SLOW, False),
        (TIMES_FLASH_SLOW_INEXACT, True),
        (ROW_EXACT, True),
    ],
)
def test_the_plan_follows_the_models_own_timing(
    tmp_path: Path,
    children: InstallChildren,
    monkeypatch: pytest.MonkeyPatch,
    timing: str,
    flash_attn: bool,
) -> None:
    # The check's model (embedded.gguf) is timed 4x faster without flash attention; the
    # model about to run is timed by `timing`.
    fake = children(DECODES, timing=TIMES_FLASH_SLOW)
    settings = Settings(model=str(model_file(tmp_path, "served.gguf", 8)), cache_dir=tmp_path)
    build = runtime.ensure_build_runs(settings)
    fake.timing_script = timing
    monkeypatch.setattr(llama, "read_model_shape", lambda _path: CARDS["qwen2.5-1.5b"].shape)

    plan = runtime.prepare(settings, (), build).plan

    assert build.attention.prompt_gain_without_flash == 4.0
    assert plan.flash_attn.value is flash_attn


def test_config_of_a_model_not_timed_yet_takes_the_builds_row_exact_path(
    tmp_path: Path, children: InstallChildren
) -> None:
    """`reame config` never runs a child: a model without a timing of its own is planned
    with the row-exact path where the build check found it (a property of the build)."""
    children(DECODES, timing=ROW_EXACT)
    runtime.ensure_build_runs(Settings(cache_dir=tmp_path))
    out = io.StringIO()

    config_command(Settings(model="qwen2.5-7b", cache_dir=tmp_path), out)

    lines = {line.split()[0]: line for line in out.getvalue().splitlines() if line.strip()}
    assert "row-exact" in lines["flash_attn"]
    assert "q8_0" not in lines["kv_type"]
