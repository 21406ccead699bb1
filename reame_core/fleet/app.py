"""The fleet as a Ray Serve application: an ingress deployment in front of `replicas`
replicas of `ReameReplica`, routed by a request router (Reame's by default).

Two ways to start it:
    reame serve --ray [--replicas N] [--address ray://...] [--fleet-dir DIR]
    serve run reame_core.fleet.app:build replicas=2 fleet_dir=/shared/reame

Each replica asks Ray for as many CPUs as it runs threads (`num_cpus`), so Ray places no
more replicas on a node than its cores can decode for; the host plan inside each replica
then picks its slots, context and KV from that thread count.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ray import serve
from ray.serve import Application

from reame_core.fleet.ingress import FleetIngress
from reame_core.fleet.plan import FleetPlan, plan_fleet, replica_settings, stores_conversations
from reame_core.fleet.replica import ReameReplica

__all__ = ["ROUTERS", "FleetPlan", "build", "build_fleet", "plan_fleet"]
ROUTERS: dict[str, str] = {
    "reame": "reame_core.fleet.router:ReameRequestRouter",
    "pow2": "ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter",
    # Ray Serve LLM's prefix-tree router; it reads the `prompt` of what the ingress forwards.
    # Imported from its own module: `ray.serve.llm` needs pyarrow, the router does not.
    "prefix": "ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router"
    ":PrefixCacheAffinityRouter",
}
# How often replicas report to the routers (`record_routing_stats`). Between reports the
# router learns from its own choices, so a few seconds is enough.
STATS_PERIOD_S = 2.0
# Requests a replica takes beyond its slots before the router looks elsewhere.
QUEUE_PER_SLOT = 1


def build_fleet(settings: Mapping[str, Any], plan: FleetPlan) -> Application:
    """The application: `settings` are the `Settings` values set explicitly (they travel
    to every replica, on any node)."""
    slots = int(settings.get("parallel") or plan.slots)
    replica = serve.deployment(
        name="reame-replica",
        num_replicas=plan.replicas,
        ray_actor_options={"num_cpus": plan.threads},
        max_ongoing_requests=slots * (1 + QUEUE_PER_SLOT),
        health_check_period_s=2.0,
        health_check_timeout_s=10.0,
        graceful_shutdown_timeout_s=5.0,
        request_router_config={
            "request_router_class": ROUTERS[plan.router],
            # The fleet's one ingress holds the only handle: its router sends every request.
            "request_router_kwargs": {"sole_router": True} if plan.router == "reame" else {},
            "request_routing_stats_period_s": STATS_PERIOD_S,
            "request_routing_stats_timeout_s": 10 * STATS_PERIOD_S,
        },
    )(ReameReplica)
    # The ingress only forwards: it takes no CPU from the replicas' share.
    ingress = serve.deployment(name="reame-ingress", ray_actor_options={"num_cpus": 0})(
        FleetIngress
    )
    values = replica_settings(settings, plan)
    shared = plan.fleet_dir is not None
    return ingress.bind(
        replica.bind(values, shared_cache=shared, conversations=stores_conversations(values))
    )


def build(args: Mapping[str, str]) -> Application:
    """`serve run reame_core.fleet.app:build key=value ...`: replicas, threads, router
    (reame, pow2, prefix), fleet_dir, model; other settings from REAME_* and REAME_CONFIG."""
    import os

    from reame_core.settings import Settings

    known = {"replicas", "threads", "router", "fleet_dir", "model"}
    unknown = set(args) - known
    if unknown:
        raise ValueError(f"unknown arguments {sorted(unknown)}; known: {sorted(known)}")
    settings = Settings.load(
        os.environ.get("REAME_CONFIG"), **({"model": args["model"]} if "model" in args else {})
    )
    router = args.get("router", "reame")
    if router not in ROUTERS:
        raise ValueError(f"router must be one of {sorted(ROUTERS)}")
    plan = plan_fleet(
        int(args.get("replicas", 2)),
        os.cpu_count() or 1,
        threads=int(args["threads"]) if "threads" in args else None,
        router=router,  # type: ignore[arg-type]
        fleet_dir=Path(args["fleet_dir"]) if "fleet_dir" in args else None,
    )
    return build_fleet(explicit_settings(settings), plan)


def explicit_settings(settings: Any) -> dict[str, Any]:
    """The values set explicitly (file, environment, flags), as plain data."""
    return dict(settings.model_dump(mode="json", exclude_unset=True))
