"""`reame serve --ray`: join a Ray cluster (or start one on this machine), run the fleet
application on it, and serve until interrupted."""

from __future__ import annotations

import os
import time
from pathlib import Path

import ray
import structlog
from ray import serve

from reame_core.errors import ReameError
from reame_core.fleet.app import build_fleet, explicit_settings
from reame_core.fleet.plan import FleetPlan, RouterName, plan_fleet
from reame_core.settings import Settings

log = structlog.get_logger(__name__)
APP_NAME = "reame"


def start_fleet(
    settings: Settings,
    *,
    replicas: int,
    address: str | None = None,
    fleet_dir: Path | None = None,
    router: RouterName = "reame",
) -> FleetPlan:
    """Deploy the fleet and return once every replica has loaded its model."""
    if address is None:
        cores = len(os.sched_getaffinity(0))
        ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False)
        nodes, cores_per_node = 1, cores
    else:
        ray.init(address=address, log_to_driver=False)
        alive = [n for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
        nodes = max(1, len(alive))
        cores_per_node = int(min(n["Resources"].get("CPU", 1) for n in alive)) if alive else 1
    plan = plan_fleet(
        replicas,
        cores_per_node,
        nodes,
        threads=settings.threads,
        router=router,
        fleet_dir=fleet_dir,
    )
    if fleet_dir is not None:
        fleet_dir.mkdir(parents=True, exist_ok=True)
    serve.start(http_options={"host": settings.host, "port": settings.port})
    serve.run(build_fleet(explicit_settings(settings), plan), name=APP_NAME, route_prefix="/")
    return plan


def serve_fleet(
    settings: Settings,
    *,
    replicas: int,
    address: str | None = None,
    fleet_dir: Path | None = None,
    router: RouterName = "reame",
) -> int:
    try:
        plan = start_fleet(
            settings, replicas=replicas, address=address, fleet_dir=fleet_dir, router=router
        )
    except (RuntimeError, ConnectionError) as error:
        raise ReameError(f"the fleet could not start: {error}") from error
    log.info(
        "fleet serving",
        url=f"http://{settings.host}:{settings.port}",
        replicas=plan.replicas,
        threads_per_replica=plan.threads,
        router=plan.router,
        fleet_dir=str(plan.fleet_dir) if plan.fleet_dir else "none (each replica its own caches)",
    )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()
