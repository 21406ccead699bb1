"""The reporting hooks' contract: a plugin's description is its line in the plugin listing,
its counters are in the metrics."""

from __future__ import annotations

from collections.abc import Callable

from installed_plugins import InstalledPlugins
from litestar import Litestar
from litestar.testing import TestClient

from reame_core.plugins import PluginHost

Serve = Callable[[PluginHost], TestClient[Litestar]]


def test_description_is_the_plugins_line_in_the_listing(install_plugins: InstalledPlugins) -> None:
    plugins = install_plugins("reporter")

    (record,) = [r for r in plugins.records() if r.name == "reporter"]

    assert record.description == install_plugins.module("reporter").DESCRIPTION
    assert (record.distribution, record.version) == ("reame-contract-plugins", "0.0")


def test_collected_counters_are_in_the_metrics(
    install_plugins: InstalledPlugins, serve: Serve
) -> None:
    client = serve(install_plugins("reporter"))

    metrics = client.get("/metrics").text

    assert "reame_contract_answers 42.0" in metrics


def test_disk_faults_are_one_counter_labelled_by_store_and_kind(
    install_plugins: InstalledPlugins, serve: Serve
) -> None:
    client = serve(install_plugins("reporter"))

    metrics = client.get("/metrics").text

    assert 'reame_disk_faults_total{kind="torn_page",store="contract_store"} 3.0' in metrics
    assert "reame_disk_faults_contract_store" not in metrics
