"""Reame's request router for Ray Serve: `FleetAffinity` behind Serve's request-router API.

Serve runs one router per deployment handle, in the process holding the handle (the
fleet's ingress), and calls `choose_replicas` for each request; the ranks it returns are
tried in order, each replica accepting only while under `max_ongoing_requests`. The router
learns from each request it routes (`on_request_routed`) and each that completes
(`on_request_completed`), from Serve's count of each replica's requests (its queue-length
cache), and from the replicas' own reports (`RunningReplica.routing_stats`, refreshed every
`request_routing_stats_period_s`); it forgets replicas that die (`on_replica_actor_died`)
or leave (`update_replicas`).

No FIFO mixin on purpose: with it, Serve may hand the replica chosen for one request to
another waiting request, which would throw away the choice made for the first one's prefix.
"""

from __future__ import annotations

from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from reame_core.fleet.affinity import (
    CHUNK_CHARS,
    DISK_WEIGHT,
    HOME_WEIGHT,
    FleetAffinity,
    RoutingStats,
)
from reame_core.fleet.forwarding import ForwardedRequest


class ReameRequestRouter(RequestRouter):
    """Sessions stay on their replica; other completions go where the longest prefix of
    their prompt is cached — in a slot, or on the fleet's shared disk — unless queues are
    out of balance, where it falls back to power of two choices."""

    affinity: FleetAffinity

    def initialize_state(
        self,
        imbalance: int = 2,
        chunk_chars: int = CHUNK_CHARS,
        disk_weight: float = DISK_WEIGHT,
        home_weight: float = HOME_WEIGHT,
        sole_router: bool = False,
        **_: Any,
    ) -> None:
        self.affinity = FleetAffinity(
            imbalance=imbalance,
            chunk_chars=chunk_chars,
            disk_weight=disk_weight,
            home_weight=home_weight,
            sole_router=sole_router,
        )

    def _state(self) -> FleetAffinity:
        # Serve calls `initialize_state` after construction; be whole before it too.
        if not hasattr(self, "affinity"):
            self.initialize_state()
        return self.affinity

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        affinity = self._state()
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        for replica_id, replica in by_id.items():
            stats = replica.routing_stats
            if stats and stats.get("serial") != affinity.replica(replica_id).serial:
                affinity.observe(replica_id, RoutingStats.from_dict(stats))
            ongoing = self.replica_queue_len_cache.get(replica.replica_id)
            if ongoing is not None:
                affinity.set_queue(replica_id, ongoing)
        request = _forwarded(pending_request)
        if pending_request is not None:
            # Every rank below has been offered: wait a little before offering them again.
            pending_request.routing_context.should_backoff = True
        if request is None or not request.routable:
            # /health, /metrics, /v1/models: any replica, each in turn.
            return [[by_id[r]] for r in affinity.least_recently_routed(list(by_id))]
        choice = affinity.rank(list(by_id), request.routed_text, request.session)
        return [[by_id[replica_id]] for replica_id in choice.ranked]

    def on_request_routed(
        self,
        pending_request: PendingRequest,
        replica_id: ReplicaID,
        result: Any,
    ) -> None:
        request = _forwarded(pending_request)
        if request is None:
            return
        key = getattr(pending_request.metadata, "internal_request_id", None)
        if request.routable:
            self._state().routed(
                replica_id.unique_id, request.routed_text, request.session, key, request.id
            )
        else:
            self._state().routed(replica_id.unique_id, "", request=key)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        # Older Ray Serve releases never call this: Serve's queue-length cache then settles
        # the count (`FleetAffinity.set_queue`).
        self._state().completed(replica_id.unique_id, internal_request_id)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._state().forget(replica_id.unique_id)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self._state().keep_only(r.replica_id.unique_id for r in replicas)


def _forwarded(pending_request: PendingRequest | None) -> ForwardedRequest | None:
    if pending_request is None or not pending_request.args:
        return None
    first = pending_request.args[0]
    return first if isinstance(first, ForwardedRequest) else None
