"""`reame pull / ls / rm / config` and `reame run --explain` against a fake hub."""

from __future__ import annotations

import io

import pytest
from fakehub import FakeHub

from reame_core.cli import main as cli_main
from reame_core.cli import run as cli_run
from reame_core.models.registry import CARDS

QWEN = CARDS["qwen2.5-1.5b"]


def test_pull_ls_and_rm_round_trip(fake_hub: FakeHub, capsys: pytest.CaptureFixture[str]) -> None:
    fake_hub.add(QWEN.repo, QWEN.file, b"gguf bytes")

    assert cli_main.main(["pull", "qwen2.5-1.5b"]) == 0
    assert "qwen2.5-1.5b: downloaded" in capsys.readouterr().out
    assert cli_main.main(["pull", "qwen2.5-1.5b"]) == 0
    assert "already up to date" in capsys.readouterr().out

    assert cli_main.main(["ls"]) == 0
    listing = capsys.readouterr().out
    assert "qwen2.5-1.5b" in listing and "Q4_K_M" in listing

    assert cli_main.main(["rm", "qwen2.5-1.5b"]) == 0
    assert "Removed qwen2.5-1.5b" in capsys.readouterr().out
    assert cli_main.main(["ls"]) == 0
    assert "qwen2.5-1.5b" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["pull", "qwen2.5-1.5"], "reame: Unknown model 'qwen2.5-1.5'. Did you mean qwen2.5-1.5b"),
        (["pull", "hf:../escape"], "reame: 'hf:../escape' is not a valid hub reference"),
        (["rm", "qwen2.5-7b"], "reame: qwen2.5-7b is not downloaded"),
        (["rm", "smollm2-135m"], "reame: smollm2-135m is embedded"),
        (["run", "qwen2.5-1.5", "hello"], "reame: Unknown model 'qwen2.5-1.5'"),
    ],
)
def test_model_errors_are_one_line_on_stderr_and_exit_1(
    model_caches: object,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(""))

    assert cli_main.main(argv) == 1

    err = capsys.readouterr().err
    assert err.startswith(message)
    assert err.count("\n") == 1
    assert "Traceback" not in err


def test_offline_pull_of_a_missing_model_names_it_and_the_cache(
    model_caches: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    assert cli_main.main(["pull", "qwen2.5-1.5b"]) == 1

    err = capsys.readouterr().err
    assert "qwen2.5-1.5b is not downloaded and offline mode is on" in err
    assert "models--Qwen--Qwen2.5-1.5B-Instruct-GGUF" in err


def test_config_explains_each_value_for_a_model_not_downloaded(
    model_caches: object, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main.main(["config", "qwen2.5-7b", "--threads", "3"]) == 0

    out = capsys.readouterr().out
    assert "not downloaded yet; sized from bartowski/Qwen2.5-7B-Instruct-GGUF" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert "3 (set): set in the settings" in lines["threads"]
    for setting in ("ctx", "parallel", "batch", "kv_type", "flash_attn", "memory"):
        assert setting in lines


def test_run_explain_prints_the_plan_and_starts_nothing(
    model_caches: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_runtime(*args: object, **kwargs: object) -> None:
        raise AssertionError("--explain must not start a runtime")

    monkeypatch.setattr(cli_run, "start_runtime", no_runtime)

    assert cli_main.main(["run", "qwen2.5-3b", "--explain", "--ctx", "2048"]) == 0

    out = capsys.readouterr().out
    assert "model    qwen2.5-3b" in out
    assert "2048 (set)" in out
