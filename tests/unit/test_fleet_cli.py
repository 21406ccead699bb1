"""`reame serve --ray`: the flags reach the fleet launcher; fleet flags without --ray are
refused rather than ignored. Ray itself is not started here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reame_core.cli.main import main
from reame_core.fleet.plan import FleetPlan, plan_fleet, replica_settings, stores_conversations


def test_fleet_flags_without_ray_are_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--replicas", "3"]) == 1
    assert "need --ray" in capsys.readouterr().err


def test_serve_ray_hands_the_fleet_flags_to_the_launcher(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("ray")
    from reame_core.fleet import launch

    seen: dict[str, Any] = {}

    def serve_fleet(settings: Any, **options: Any) -> int:
        seen.update(options, port=settings.port, threads=settings.threads)
        return 0

    monkeypatch.setattr(launch, "serve_fleet", serve_fleet)
    argv = ["serve", "--ray", "--replicas", "3", "--port", "9000", "--threads", "1"]
    assert main([*argv, "--fleet-dir", str(tmp_path), "--router", "pow2"]) == 0
    assert seen == {
        "replicas": 3,
        "address": None,
        "fleet_dir": tmp_path,
        "router": "pow2",
        "port": 9000,
        "threads": 1,
    }


def test_replicas_share_a_nodes_cores_without_oversubscribing_them() -> None:
    assert plan_fleet(2, cores_per_node=2).threads == 1
    assert plan_fleet(1, cores_per_node=8).threads == 8
    assert plan_fleet(8, cores_per_node=16, nodes=4).threads == 8
    assert plan_fleet(5, cores_per_node=2).threads == 1
    assert plan_fleet(2, cores_per_node=8, threads=3).threads == 3


def test_replica_settings_put_both_stores_in_the_fleet_directory(tmp_path: Path) -> None:
    plan = FleetPlan(replicas=2, threads=1, fleet_dir=tmp_path)
    values = replica_settings({"model": "m", "plugins": {"diskkv": {"budget": "1GB"}}}, plan)
    assert values["threads"] == 1 and values["model"] == "m"
    disk = {"budget": "1GB", "dir": str(tmp_path / "kv"), "conversations": True}
    assert values["plugins"]["diskkv"] == disk
    assert values["plugins"]["palimpsest"] == {"dir": str(tmp_path / "palimpsest")}
    assert stores_conversations(values)
    alone = replica_settings({"model": "m"}, FleetPlan(replicas=2, threads=1))
    assert "plugins" not in alone and not stores_conversations(alone)


def test_a_fleet_keeps_conversations_on_its_disk_unless_told_not_to(tmp_path: Path) -> None:
    plan = FleetPlan(replicas=2, threads=1, fleet_dir=tmp_path)
    values = replica_settings({"plugins": {"diskkv": {"conversations": False}}}, plan)
    assert values["plugins"]["diskkv"]["conversations"] is False
    assert not stores_conversations(values)
    from_environment = replica_settings({"plugins": {"diskkv": {"conversations": "false"}}}, plan)
    assert not stores_conversations(from_environment)


def test_every_router_name_points_at_an_importable_class() -> None:
    pytest.importorskip("ray")
    from ray._common.utils import import_attr

    from reame_core.fleet import app as fleet_app

    for path in fleet_app.ROUTERS.values():
        assert isinstance(import_attr(path), type)
