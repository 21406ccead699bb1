"""How a fleet is laid out: replicas, threads per replica, router, shared directory.
Plain data and arithmetic, importable without Ray."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import TypeAdapter

RouterName = Literal["reame", "pow2", "prefix"]


@dataclass(frozen=True)
class FleetPlan:
    replicas: int
    threads: int  # per replica: its `num_cpus` as well
    router: RouterName = "reame"
    fleet_dir: Path | None = None  # shared prefix cache and archive; None: each its own

    @property
    def slots(self) -> int:
        """Slots a replica is expected to plan (two per thread, as the host plan does)."""
        return 2 * self.threads


def plan_fleet(
    replicas: int,
    cores_per_node: int,
    nodes: int = 1,
    *,
    threads: int | None = None,
    router: RouterName = "reame",
    fleet_dir: Path | None = None,
) -> FleetPlan:
    """Threads per replica: the given count, or the node's cores shared among the replicas
    it will hold (llama.cpp threads spinning on a shared core collapse its speed)."""
    if threads is None:
        per_node = math.ceil(replicas / max(1, nodes))
        threads = max(1, cores_per_node // per_node)
    return FleetPlan(replicas, threads, router, fleet_dir)


def replica_settings(settings: Mapping[str, Any], plan: FleetPlan) -> dict[str, Any]:
    """Settings for every replica: the fleet's, with the replica's thread count and, with a
    fleet directory, the disk prefix cache and the archive in it. The disk cache then also
    keeps each conversation so far (unless the settings say otherwise), so a session's next
    turn restores it on whichever replica serves it."""
    values = dict(settings)
    values["threads"] = plan.threads
    if plan.fleet_dir is not None:
        plugins = {name: dict(section) for name, section in values.get("plugins", {}).items()}
        disk = plugins.setdefault("diskkv", {})
        disk["dir"] = str(plan.fleet_dir / "kv")
        disk.setdefault("conversations", True)
        plugins.setdefault("palimpsest", {})["dir"] = str(plan.fleet_dir / "palimpsest")
        values["plugins"] = plugins
    return values


def stores_conversations(values: Mapping[str, Any]) -> bool:
    """Whether replicas with these settings (`replica_settings`) keep each conversation so
    far in the shared disk cache. The value is read as the plugin's settings read it: from
    the environment it is a string ("false" is false)."""
    disk = values.get("plugins", {}).get("diskkv", {})
    return bool(disk.get("dir")) and TypeAdapter(bool).validate_python(
        disk.get("conversations", False)
    )
