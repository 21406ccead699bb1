from __future__ import annotations

import pytest
from pydantic import ValidationError

from reame_core.backend.fake import FakeBackend
from reame_core.plugins import PluginHost
from reame_core.settings import Settings


def test_conclave_is_discovered_through_its_entry_point() -> None:
    records = {record.name: record for record in PluginHost().records()}
    record = records["conclave"]
    assert record.enabled
    assert record.distribution == "reame-conclave"
    assert "reame_configure" in record.hooks


def test_conclave_does_not_claim_a_feature_it_does_not_have() -> None:
    record = next(r for r in PluginHost().records() if r.name == "conclave")
    assert "not active" in record.description


def test_conclave_can_be_disabled_per_deployment() -> None:
    record = next(r for r in PluginHost(["conclave"]).records() if r.name == "conclave")
    assert not record.enabled
    assert record.hooks == ()


def test_conclave_refuses_unknown_settings() -> None:
    host = PluginHost()
    settings = Settings(plugins={"conclave": {"no_such_option": 1}})
    with pytest.raises(ValidationError):
        host.hook.reame_configure(settings=settings, model=FakeBackend().info)
