"""`reame doctor` on fake children: the build's features, the CPU, the check's verdict and
where the weights went, and its exit code."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from fake_children import (
    DECODES,
    DIES_WITH_SIGILL_IN_DECODE,
    HANGS_TIMING_ATTENTION,
    ROW_EXACT,
    TIMES_FLASH_SLOW,
    InstallChildren,
    install_children,
)

from reame_core.backend import probe
from reame_core.cli.doctor import doctor_command
from reame_core.settings import Settings


@pytest.fixture
def children(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> InstallChildren:
    return install_children(monkeypatch, tmp_path)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    return Settings(model=str(model), cache_dir=tmp_path / "cache")


def test_doctor_prints_the_build_features_that_matter(
    settings: Settings, children: InstallChildren
) -> None:
    children(DECODES)
    out = io.StringIO()

    assert doctor_command(settings, out) == 0

    report = out.getvalue()
    assert "AVX512 yes" in report and "LLAMAFILE yes" in report and "AMX_INT8 no" in report


def test_doctor_prints_the_cpu_and_its_flags(settings: Settings, children: InstallChildren) -> None:
    children(DECODES)
    out = io.StringIO()

    doctor_command(settings, out)

    assert "\ncpu " in out.getvalue() and "flags: " in out.getvalue()


def test_doctor_prints_a_fresh_verdict_and_each_attempt(
    settings: Settings, children: InstallChildren
) -> None:
    children(DECODES)
    out = io.StringIO()

    doctor_command(settings, out)

    assert "checked just now" in out.getvalue()
    assert "default load: llama.cpp loaded the model and decoded" in out.getvalue()


def test_doctor_prints_the_buffer_types_of_both_models_weights(
    settings: Settings, children: InstallChildren
) -> None:
    children(DECODES)
    out = io.StringIO()

    doctor_command(settings, out)

    lines = out.getvalue().splitlines()
    assert "embedded.gguf: CPU_Mapped 98.0 MiB, CPU_REPACK 27.0 MiB" in lines[-2]
    assert "model.gguf: CPU_Mapped 98.0 MiB, CPU_REPACK 27.0 MiB" in lines[-1]


def test_doctor_says_when_reame_falls_back_and_what_it_costs(
    settings: Settings, children: InstallChildren
) -> None:
    children(DIES_WITH_SIGILL_IN_DECODE, without_extra_bufts=DECODES)
    out = io.StringIO()

    assert doctor_command(settings, out) == 0

    report = out.getvalue()
    assert "default load: llama.cpp died with SIGILL" in report
    assert "use_extra_bufts=False: llama.cpp loaded the model and decoded" in report
    assert "Reame loads without extra buffer types: no CPU_REPACK" in report


def test_doctor_says_the_verdict_came_from_the_cache(
    settings: Settings, children: InstallChildren
) -> None:
    started = children(DECODES).started
    doctor_command(settings, io.StringIO())
    out = io.StringIO()

    doctor_command(settings, out)

    assert "cached, checked" in out.getvalue()
    # The check once; the configured model (another file) at each report.
    assert started == [True, True, True]


def test_doctor_exits_non_zero_with_the_fix_when_the_build_cannot_run(
    settings: Settings, children: InstallChildren
) -> None:
    children(DIES_WITH_SIGILL_IN_DECODE)
    out = io.StringIO()

    assert doctor_command(settings, out) == 1
    assert "make reinstall-llama" in out.getvalue()


def test_doctor_prints_the_attention_timing_and_the_default_it_gives(
    settings: Settings, children: InstallChildren
) -> None:
    children(DECODES, timing=TIMES_FLASH_SLOW)
    out = io.StringIO()

    doctor_command(settings, out)

    assert (
        "attention a 256-token prompt: 4.00 s with flash attention and q8_0 keys, 1.00 s "
        "without (a lone row exact without it); flash attention off for embedded.gguf (each "
        "model is timed on its first run)"
    ) in out.getvalue()
    assert "row-exact flash attention (f16 keys): not found" in out.getvalue()


def test_doctor_says_where_the_build_has_the_row_exact_path(
    settings: Settings, children: InstallChildren
) -> None:
    children(DECODES, timing=ROW_EXACT)
    out = io.StringIO()

    doctor_command(settings, out)

    assert (
        "row-exact flash attention (f16 keys): found; flash attention on, for every model"
    ) in out.getvalue()


def test_doctor_says_when_the_attention_timing_did_not_finish(
    settings: Settings, children: InstallChildren, monkeypatch: pytest.MonkeyPatch
) -> None:
    children(DECODES, timing=HANGS_TIMING_ATTENTION)
    check = probe.check_build
    monkeypatch.setattr(probe, "check_build", lambda *a, **k: check(*a, **k, timeout=1.0))
    out = io.StringIO()

    doctor_command(settings, out)

    assert (
        "attention not finished: llama.cpp hung while checking or timing attention"
    ) in out.getvalue()
