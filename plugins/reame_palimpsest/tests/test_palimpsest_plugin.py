from __future__ import annotations

import pytest
from pydantic import ValidationError

from reame_core.backend.fake import FakeBackend
from reame_core.plugins import PluginHost
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


def test_palimpsest_budget_defaults_to_the_host_plan() -> None:
    settings = Settings().with_plugin_defaults({"palimpsest": {"budget": 50 << 20}})

    assert settings.plugin_section("palimpsest", PalimpsestSettings).budget == 50 << 20
