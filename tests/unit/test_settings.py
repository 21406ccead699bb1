"""Settings: defaults < TOML file < REAME_* environment < CLI flags, and plugin sections."""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from reame_core.builtins.draft_model import DraftModel
from reame_core.engine.engine import Engine
from reame_core.engine.governor import Governor
from reame_core.settings import Settings


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in os.environ if name.startswith("REAME_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "reame.toml"
    path.write_text(
        'parallel = 2\nctx = 1024\n\n[plugins.diskkv]\npath = "/var/cache/reame"\nmax_gb = 2.5\n'
    )
    return path


class DiskOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = "~/.cache/reame"
    max_gb: float = 10.0


def test_defaults_need_no_file_or_environment() -> None:
    settings = Settings.load()

    assert settings.model == "smollm2-135m"
    # Left to host auto-configuration (reame_core.autoconfig).
    assert (settings.threads, settings.ctx, settings.parallel, settings.batch) == (None,) * 4
    assert settings.kv_type is None
    assert settings.prefill_chunk == 128
    assert settings.deterministic
    assert settings.disable_plugins == []
    assert settings.plugins == {}


def test_environment_overrides_a_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REAME_PARALLEL", "8")

    assert Settings.load().parallel == 8


def test_config_file_overrides_defaults(config: Path) -> None:
    settings = Settings.load(config_file=config)

    assert (settings.parallel, settings.ctx) == (2, 1024)
    assert settings.batch is None


def test_environment_overrides_the_config_file(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REAME_PARALLEL", "8")

    settings = Settings.load(config_file=config)

    assert settings.parallel == 8
    assert settings.ctx == 1024


def test_cli_flags_override_the_environment(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REAME_PARALLEL", "8")

    settings = Settings.load(config_file=config, parallel=16)

    assert settings.parallel == 16


def test_unset_cli_flags_do_not_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REAME_PARALLEL", "8")

    assert Settings.load(parallel=None).parallel == 8


def test_config_file_named_by_reame_config_is_read(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REAME_CONFIG", str(config))

    assert Settings.load().ctx == 1024


def test_loading_a_config_file_leaves_the_environment_as_it_was(config: Path) -> None:
    Settings.load(config_file=config)

    assert "REAME_CONFIG" not in os.environ


def test_disable_plugins_from_the_environment_is_a_comma_separated_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REAME_DISABLE_PLUGINS", "a,b")

    settings = Settings.load()

    assert settings.disable_plugins == ["a", "b"]


def test_disable_plugins_flag_accepts_a_comma_separated_string() -> None:
    assert Settings.load(disable_plugins="a, b,").disable_plugins == ["a", "b"]


def test_plugin_section_is_validated_by_the_plugin_model(config: Path) -> None:
    options = Settings.load(config_file=config).plugin_section("diskkv", DiskOptions)

    assert options == DiskOptions(path="/var/cache/reame", max_gb=2.5)


def test_missing_plugin_section_gives_the_plugin_defaults() -> None:
    assert Settings.load().plugin_section("diskkv", DiskOptions) == DiskOptions()


def test_invalid_plugin_section_raises_a_validation_error(tmp_path: Path) -> None:
    path = tmp_path / "reame.toml"
    path.write_text('[plugins.diskkv]\nmax_gb = "lots"\n')
    settings = Settings.load(config_file=path)

    with pytest.raises(ValidationError, match="max_gb"):
        settings.plugin_section("diskkv", DiskOptions)


def test_unknown_key_in_the_config_file_raises_a_validation_error(tmp_path: Path) -> None:
    path = tmp_path / "reame.toml"
    path.write_text("paralel = 2\n")

    with pytest.raises(ValidationError, match="paralel"):
        Settings.load(config_file=path)


def test_unknown_flag_raises_a_validation_error() -> None:
    with pytest.raises(ValidationError, match="paralel"):
        Settings.load(paralel=2)


def test_out_of_range_value_raises_a_validation_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REAME_PARALLEL", "0")

    with pytest.raises(ValidationError, match="parallel"):
        Settings.load()


class BudgetOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    budget: int = 0


def test_auto_defaults_fill_the_plugin_fields_left_unset() -> None:
    settings = Settings.load().with_plugin_defaults({"diskkv": {"budget": 5 << 30}})

    assert settings.plugin_section("diskkv", BudgetOptions).budget == 5 << 30


def test_an_explicit_plugin_value_wins_over_the_auto_default(config: Path) -> None:
    config.write_text("[plugins.diskkv]\nbudget = 1024\n")
    settings = Settings.load(config_file=config)

    auto = settings.with_plugin_defaults({"diskkv": {"budget": 5 << 30}})

    assert auto.plugin_section("diskkv", BudgetOptions).budget == 1024


def test_auto_defaults_are_offered_only_to_plugins_that_declare_the_field() -> None:
    settings = Settings.load().with_plugin_defaults({"diskkv": {"budget": 5 << 30}})

    assert settings.plugin_section("diskkv", DiskOptions) == DiskOptions()


def test_the_cache_directory_follows_xdg_unless_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert Settings.load().cache_path == tmp_path / "xdg" / "reame"

    monkeypatch.setenv("REAME_CACHE_DIR", str(tmp_path / "mine"))
    assert Settings.load().cache_path == tmp_path / "mine"


def test_the_engines_parts_default_to_the_settings_draft_limit() -> None:
    # An engine, governor or draft model built without the setting (tests, an embedding
    # application) drafts as far as a server would.
    default = Settings().draft_max
    for built in (Engine, Governor):
        assert inspect.signature(built).parameters["draft_max"].default == default, built
    assert DraftModel()._longest == default
