"""The build check, with fake children: how a child's end is read, the fallback to loading
without extra buffer types, the one message when nothing runs, the verdict's cache, and the
entry points that run the check (runtime, `reame run`, `reame serve`). No model is loaded.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import structlog
from fake_children import (
    DECODES,
    DIES_WITH_SIGBUS_IN_LOAD,
    DIES_WITH_SIGILL_IN_DECODE,
    FAILS_IN_DECODE,
    HANGS_IN_ATTENTION,
    HANGS_IN_DECODE,
    HANGS_TIMING_ATTENTION,
    KILLED_IN_LOAD,
    ROW_EXACT,
    TIMES_FLASH_SLOW,
    FakeChildren,
    InstallChildren,
    install_children,
)

from reame_core import runtime
from reame_core.autoconfig.facts import HostFacts
from reame_core.autoconfig.plan import GIB, plan_host
from reame_core.backend import probe
from reame_core.backend.fake import FakeBackend
from reame_core.backend.probe import (
    BuildVerdict,
    ProbeSubject,
    check_build,
    ensure_build_runs,
    llama_build_identity,
    run_attempt,
)
from reame_core.cli import main as cli_main
from reame_core.cli.config import build_note
from reame_core.errors import BuildCannotRunError
from reame_core.models import ResolvedModel
from reame_core.models.registry import CARDS
from reame_core.plugins import PluginHost
from reame_core.settings import Settings

BUILD_A = ProbeSubject(build="llama-cpp-python 0.3.36\nlibllama.so 1000 1 1", cpu="EPYC\navx2")
MODEL = Path("/models/probe.gguf")


def check(
    children: FakeChildren,
    cache_dir: Path,
    subject: ProbeSubject = BUILD_A,
    **options: Any,
) -> BuildVerdict:
    return check_build(
        cache_dir, subject, MODEL, launch=children, timing=children.timing, **options
    )


@pytest.fixture
def children(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> InstallChildren:
    return install_children(monkeypatch, tmp_path)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    return Settings(model=str(model), cache_dir=tmp_path / "cache")


# ------------------------------------------------------------ one child's end


def test_a_child_that_decodes_is_ok_and_keeps_what_it_reported() -> None:
    attempt = run_attempt(FakeChildren(DECODES)(True), extra_bufts=True, timeout=30)

    assert attempt.outcome == "ok"
    assert attempt.facts["buffers"] == {"CPU_Mapped": 98.0, "CPU_REPACK": 27.0}
    assert "LLAMAFILE = 1" in attempt.facts["system_info"]


def test_once_the_build_decodes_attention_is_timed_the_way_models_will_load(
    tmp_path: Path,
) -> None:
    children = FakeChildren(DIES_WITH_SIGILL_IN_DECODE, DECODES, timing=TIMES_FLASH_SLOW)
    verdict = check(children, tmp_path)

    assert children.timed == [False, False]  # the load that decoded: row-exact path, timing
    assert verdict.attention.prompt_gain_without_flash == 4.0
    level = check(FakeChildren(DECODES), tmp_path / "level")
    assert level.attention.prompt_gain_without_flash == 1.0


def test_a_build_that_cannot_run_is_not_timed(tmp_path: Path) -> None:
    children = FakeChildren(DIES_WITH_SIGILL_IN_DECODE)
    verdict = check(children, tmp_path)

    assert children.timed == [] and verdict.timing is None and verdict.settled


def test_a_timing_cut_short_is_taken_again_at_the_next_start(tmp_path: Path) -> None:
    slow = FakeChildren(DECODES, timing=HANGS_TIMING_ATTENTION)
    first = check(slow, tmp_path, timeout=1.0)
    again = FakeChildren(DECODES, timing=TIMES_FLASH_SLOW)
    second = check(again, tmp_path)

    assert first.runs and first.attention.prompt_gain_without_flash is None and not first.settled
    assert first.timing is not None and first.timing.facts["one_row_exact_flash_f16"] is False
    assert not second.cached and second.attention.prompt_gain_without_flash == 4.0


def test_an_unanswered_row_exact_question_is_asked_again_at_the_next_start(
    tmp_path: Path,
) -> None:
    first = check(FakeChildren(DECODES, timing=HANGS_IN_ATTENTION), tmp_path, timeout=1.0)
    again = FakeChildren(DECODES, timing=ROW_EXACT)
    second = check(again, tmp_path)

    assert first.runs and not first.settled and not first.attention.row_exact_flash
    assert not second.cached and second.attention.row_exact_flash and second.settled


def test_a_build_with_the_row_exact_path_is_settled_without_timing_a_prompt(
    tmp_path: Path,
) -> None:
    """The plan takes that path for every model, so nothing more is timed: on a slow or
    busy host the check ends sooner and is not taken again at every start."""
    first = check(FakeChildren(DECODES, timing=ROW_EXACT), tmp_path)
    again = FakeChildren(DECODES, timing=TIMES_FLASH_SLOW)
    second = check(again, tmp_path)

    assert first.attention.row_exact_flash and first.attention.prompt_gain_without_flash is None
    assert first.settled and second.cached and again.timed == []


@pytest.mark.parametrize(("row_exact", "policy", "asked"), [
    (True, "passive", ["--row-exact-only"]),  # found: nothing is timed
    (False, None, []),  # not found: the timing, as the server runs OpenMP
])  # fmt: skip
def test_the_row_exact_check_lets_idle_threads_sleep_and_a_timing_does_not(
    monkeypatch: pytest.MonkeyPatch, row_exact: bool, policy: str | None, asked: list[str]
) -> None:
    """A busy neighbour on the cores stalls OpenMP threads that spin at barriers: the check
    that needs no timing lets them sleep."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    script = "from reame_core.backend.probe_child import say\n" + textwrap.dedent(f"""
        import os, sys
        say(stage="attention")
        say(policy=os.environ.get("OMP_WAIT_POLICY"), asked=sys.argv[1:])
        if sys.argv[1:]:
            say(one_row_exact_flash_f16={row_exact})
    """)

    launch = lambda _load: [sys.executable, "-c", script]  # noqa: E731

    attempt = probe.attention_attempt(launch, extra_bufts=True, timeout=30)

    assert attempt.outcome == "ok"
    assert (attempt.facts["policy"], attempt.facts["asked"]) == (policy, asked)
    assert attempt.facts["one_row_exact_flash_f16"] is row_exact  # the first answer is kept


def test_the_timing_child_runs_with_openmp_as_the_server_does() -> None:
    script = "import os; print(os.environ.get('OMP_WAIT_POLICY'))"
    for passive, expected in ((True, "passive"), (False, os.environ.get("OMP_WAIT_POLICY"))):
        done = subprocess.run(
            [sys.executable, "-c", script],
            env=probe._child_environment(passive),
            capture_output=True,
            text=True,
            check=True,
        )
        assert done.stdout.strip() == str(expected)


def test_a_child_killed_by_sigill_is_named_with_the_signal_and_the_step() -> None:
    attempt = run_attempt(
        FakeChildren(DIES_WITH_SIGILL_IN_DECODE)(True), extra_bufts=True, timeout=30
    )

    assert (attempt.outcome, attempt.signal, attempt.stage) == ("signal", "SIGILL", "decode")
    assert attempt.describe().startswith(
        "llama.cpp died with SIGILL (illegal instruction) in its first decode: this build uses "
        "CPU instructions this CPU lacks, or its AMX path"
    )
    assert "AMX buffer" in attempt.describe()


def test_a_child_killed_by_sigbus_while_loading_says_so() -> None:
    attempt = run_attempt(
        FakeChildren(DIES_WITH_SIGBUS_IN_LOAD)(True), extra_bufts=True, timeout=30
    )

    assert attempt.signal == "SIGBUS"
    assert "SIGBUS (bus error) while loading the model" in attempt.describe()


def test_a_child_that_hangs_is_stopped_at_the_timeout() -> None:
    attempt = run_attempt(FakeChildren(HANGS_IN_DECODE)(True), extra_bufts=True, timeout=1.0)

    assert (attempt.outcome, attempt.stage) == ("hung", "decode")
    assert 1.0 <= attempt.seconds < 10
    assert attempt.describe().startswith("llama.cpp hung in its first decode")


def test_a_child_that_fails_reports_the_end_of_its_error() -> None:
    attempt = run_attempt(FakeChildren(FAILS_IN_DECODE)(True), extra_bufts=True, timeout=30)

    assert attempt.outcome == "failed"
    assert attempt.describe() == "llama.cpp failed in its first decode: llama_decode returned -3"


# ------------------------------------------------------------ the fallback


def test_when_the_default_load_decodes_no_other_load_is_tried(tmp_path: Path) -> None:
    children = FakeChildren(DECODES)

    verdict = check(children, tmp_path)

    assert verdict.runs and verdict.use_extra_bufts
    assert children.started == [True]


def test_when_the_default_load_crashes_the_load_without_extra_buffers_is_chosen(
    tmp_path: Path,
) -> None:
    children = FakeChildren(DIES_WITH_SIGILL_IN_DECODE, without_extra_bufts=DECODES)

    verdict = check(children, tmp_path)

    assert children.started == [True, False]
    assert verdict.runs and verdict.fell_back and not verdict.use_extra_bufts


def test_when_the_default_load_hangs_the_load_without_extra_buffers_is_tried(
    tmp_path: Path,
) -> None:
    children = FakeChildren(HANGS_IN_DECODE, without_extra_bufts=DECODES)

    verdict = check(children, tmp_path, timeout=1.0)

    assert children.started == [True, False]
    assert verdict.runs and not verdict.use_extra_bufts


def test_an_error_is_not_a_crash_and_tries_no_other_load(tmp_path: Path) -> None:
    children = FakeChildren(FAILS_IN_DECODE, without_extra_bufts=DECODES)

    verdict = check(children, tmp_path)

    assert children.started == [True]
    assert not verdict.runs


def test_when_both_loads_crash_reame_refuses_with_the_reason_and_the_fix(
    settings: Settings, children: InstallChildren
) -> None:
    children(DIES_WITH_SIGILL_IN_DECODE)

    with pytest.raises(BuildCannotRunError) as refusal:
        ensure_build_runs(settings)

    message = str(refusal.value)
    assert "cannot run on this CPU" in message
    assert "died with SIGILL (illegal instruction) in its first decode" in message
    assert "use_extra_bufts=False) ended the same way" in message
    assert "make reinstall-llama" in message
    assert "-m pip install --force-reinstall --no-cache-dir llama-cpp-python==" in message


def test_the_fallback_is_logged_as_a_warning_with_its_cost_and_the_fix(
    settings: Settings, children: InstallChildren
) -> None:
    children(DIES_WITH_SIGILL_IN_DECODE, without_extra_bufts=DECODES)

    with structlog.testing.capture_logs() as logs:
        verdict = ensure_build_runs(settings)

    assert not verdict.use_extra_bufts
    (warning,) = [entry for entry in logs if entry["log_level"] == "warning"]
    assert "loading without extra buffer types" in warning["event"]
    assert "SIGILL" in warning["problem"]
    assert "CPU_REPACK" in warning["cost"]
    assert "make reinstall-llama" in warning["fix"]


# ------------------------------------------------------------ the cache


def test_a_second_check_reads_the_verdict_without_starting_a_child(tmp_path: Path) -> None:
    children = FakeChildren(DIES_WITH_SIGILL_IN_DECODE, without_extra_bufts=DECODES)
    first = check(children, tmp_path)

    second = check(children, tmp_path)

    assert children.started == [True, False]
    assert second.cached and not first.cached
    assert second.use_extra_bufts is False


def test_another_cpu_is_checked_anew(tmp_path: Path) -> None:
    children = FakeChildren(DECODES)
    check(children, tmp_path)

    check(children, tmp_path, ProbeSubject(BUILD_A.build, cpu="Xeon\navx2 amx_tile amx_int8"))

    assert children.started == [True, True]


def test_another_build_is_checked_anew(tmp_path: Path) -> None:
    children = FakeChildren(DECODES)
    check(children, tmp_path)

    check(
        children,
        tmp_path,
        ProbeSubject("llama-cpp-python 0.3.36\nlibllama.so 999 2 2", BUILD_A.cpu),
    )

    assert children.started == [True, True]


def test_a_reinstalled_library_is_another_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(tmp_path))
    library = tmp_path / "libllama.so"
    library.write_bytes(b"built for one CPU")
    before = llama_build_identity()

    library.unlink()
    library.write_bytes(b"built for another CPU")

    assert llama_build_identity() != before


def test_a_hang_is_not_cached(tmp_path: Path) -> None:
    children = FakeChildren(HANGS_IN_DECODE)
    check(children, tmp_path, timeout=1.0)

    check(children, tmp_path, timeout=1.0)

    assert children.started == [True, False, True, False]


def test_a_kill_from_outside_is_not_cached(tmp_path: Path) -> None:
    children = FakeChildren(KILLED_IN_LOAD)
    check(children, tmp_path)

    check(children, tmp_path)

    assert children.started == [True, False, True, False]


def test_an_unreadable_verdict_is_checked_anew(tmp_path: Path) -> None:
    children = FakeChildren(DECODES)
    check(children, tmp_path)
    (cached,) = (tmp_path / "build-checks").glob("*.json")
    cached.write_text("{ half a file")

    verdict = check(children, tmp_path)

    assert children.started == [True, True]
    assert verdict.runs and not verdict.cached


def test_a_recheck_ignores_the_cached_verdict(tmp_path: Path) -> None:
    children = FakeChildren(DECODES)
    check(children, tmp_path)

    check(children, tmp_path, recheck=True)

    assert children.started == [True, True]


def test_the_cache_folder_holds_only_whole_verdicts(tmp_path: Path) -> None:
    check(FakeChildren(DECODES), tmp_path)

    assert [path.suffix for path in (tmp_path / "build-checks").iterdir()] == [".json"]


# ------------------------------------------------------------ Reame's entry points


def test_an_injected_backend_starts_without_a_check(
    settings: Settings, children: InstallChildren
) -> None:
    started = children(DECODES).started

    running = runtime.start_runtime(
        settings, backend=FakeBackend(), plugins=PluginHost(discover=False)
    )
    running.close()

    assert started == []


def test_the_runtime_loads_the_model_the_way_the_check_decided(
    settings: Settings, children: InstallChildren, monkeypatch: pytest.MonkeyPatch
) -> None:
    children(DIES_WITH_SIGILL_IN_DECODE, without_extra_bufts=DECODES)
    host = HostFacts(
        arch="x86_64",
        physical_cores=2,
        logical_cpus=2,
        memory_total=4 * GIB,
        memory_available=3 * GIB,
        disk_free=50 * GIB,
        disk_path=Path("/tmp"),
    )
    shape = CARDS["smollm2-135m"].shape
    preparation = runtime.Preparation(
        ResolvedModel("model", Path(settings.model)), plan_host(settings, host, shape)
    )
    loads: list[bool] = []

    def load(_settings: Settings, _preparation: Any, *, use_extra_bufts: bool) -> FakeBackend:
        loads.append(use_extra_bufts)
        return FakeBackend()

    monkeypatch.setattr(runtime, "prepare", lambda *_: preparation)
    monkeypatch.setattr(runtime, "load_backend", load)

    runtime.start_runtime(settings, plugins=PluginHost(discover=False)).close()

    assert loads == [False]


def test_reame_run_exits_with_one_message_when_the_build_cannot_run(
    settings: Settings,
    children: InstallChildren,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    children(DIES_WITH_SIGILL_IN_DECODE)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))

    code = cli_main.main(["run", settings.model, "hello", "--cache-dir", str(settings.cache_dir)])

    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("reame: the installed llama.cpp build cannot run on this CPU")
    assert err.count("reame:") == 1 and "Traceback" not in err
    assert "make reinstall-llama" in err


def test_reame_serve_does_not_open_its_port_when_the_build_cannot_run(
    settings: Settings, children: InstallChildren, monkeypatch: pytest.MonkeyPatch
) -> None:
    children(DIES_WITH_SIGILL_IN_DECODE)
    monkeypatch.setattr("uvicorn.run", lambda *_args, **_kwargs: pytest.fail("port opened"))

    code = cli_main.main(["serve", settings.model, "--cache-dir", str(settings.cache_dir)])

    assert code == 1


def test_reame_config_says_whether_and_how_the_build_runs_here(tmp_path: Path) -> None:
    children = FakeChildren(DIES_WITH_SIGILL_IN_DECODE, without_extra_bufts=DECODES)

    before = build_note(None)
    after = build_note(check(children, tmp_path))

    assert "not checked on this CPU yet" in before
    assert "only without extra buffer types" in after
