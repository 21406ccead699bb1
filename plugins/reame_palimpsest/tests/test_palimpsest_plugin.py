from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from reame_core.backend.fake import FakeBackend
from reame_core.cli import main as cli_main
from reame_core.plugins import PluginHost
from reame_core.request import GenerationRequest, SamplingParams
from reame_core.runtime import start_runtime
from reame_core.settings import Settings
from reame_palimpsest.plugin import PalimpsestSettings


def test_palimpsest_is_discovered_through_its_entry_point() -> None:
    records = {record.name: record for record in PluginHost().records()}
    record = records["palimpsest"]
    assert record.enabled
    assert record.distribution == "reame-palimpsest"
    assert "reame_configure" in record.hooks


def test_palimpsest_does_not_claim_a_feature_it_does_not_have() -> None:
    record = next(r for r in PluginHost().records() if r.name == "palimpsest")
    assert "not active" in record.description


def test_palimpsest_can_be_disabled_per_deployment() -> None:
    record = next(r for r in PluginHost(["palimpsest"]).records() if r.name == "palimpsest")
    assert not record.enabled
    assert record.hooks == ()


def test_palimpsest_refuses_unknown_settings() -> None:
    host = PluginHost()
    settings = Settings(plugins={"palimpsest": {"no_such_option": 1}})
    with pytest.raises(ValidationError):
        host.hook.reame_configure(settings=settings, model=FakeBackend().info)


def test_palimpsest_accepts_the_documented_budget_setting() -> None:
    host = PluginHost()
    settings = Settings(plugins={"palimpsest": {"budget": "100MB"}})
    host.hook.reame_configure(settings=settings, model=FakeBackend().info)

    section = settings.plugin_section("palimpsest", PalimpsestSettings)
    assert section.budget == 100_000_000


def test_palimpsest_writes_nothing_so_asks_for_no_disk() -> None:
    record = next(r for r in PluginHost().records() if r.name == "palimpsest")

    assert "reame_disk_need" not in record.hooks


def test_a_config_file_with_a_palimpsest_budget_still_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "reame.toml"
    config.write_text('[plugins.palimpsest]\nbudget = "100MB"\n')

    assert cli_main.main(["run", "--explain", "--config", str(config)]) == 0
    assert "palimpsest" not in capsys.readouterr().out
    runtime = start_runtime(Settings.load(config), backend=FakeBackend(), plugins=PluginHost())
    try:
        prompt = FakeBackend().tokenize("Hello", add_special=True, parse_special=False)
        finished = runtime.engine.generate(GenerationRequest(prompt, SamplingParams(max_tokens=4)))
    finally:
        runtime.close()

    assert finished.error is None
