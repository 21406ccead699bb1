"""Where a request should go in a fleet of replicas: pure routing logic, no Ray.

The router sees text, not tokens (it runs in the ingress, which has no model), so prompts
are compared through `prefix_chain`: one chained hash per `CHUNK_CHARS` characters of the
prompt's routing text, the i-th hash covering every character up to the end of chunk i.
Two prompts share chunk hashes up to the depth where their texts part, so "the longest
cached prefix" is the deepest chunk hash a replica holds — a walk down the request's own
chain, a few set lookups, whatever the size of the fleet.

What the router knows of each replica (`ReplicaView`):
- the prefixes its slots hold (`resident`): learned at once from each request routed there,
  and replaced, every few seconds, by what the replica itself reports (`record_routing_stats`);
- its queue, from the reports and the requests routed since.

What it knows of the fleet: the prefixes written to the shared disk prefix cache
(`shared`), which any replica restores in a fraction of the time a prefill takes; a prefix
there counts `DISK_WEIGHT` as much as one resident in a slot.

And which replica each session (`X-Session-ID`, `session_id`) lives on: a session's later
turns go where its KV is, as long as that replica lives.

`FleetAffinity.rank` turns this into an order of preference. Serve's request router then
sends the request to the first replica in that order with room (`max_ongoing_requests`).
"""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

CHUNK_CHARS = 128
DISK_WEIGHT = 0.8  # a prefix on the shared disk is worth this much of a resident one
# A request ahead in a replica's queue costs as much as computing this many chunks of prompt
# (about 250 tokens). So a busy replica holding a prefix keeps its requests unless another is
# idle and either can restore the prefix from the shared disk (worth DISK_WEIGHT of holding
# it: the idle one wins for prefixes under 40 chunks) or the prefix is under 8 chunks. With
# 32, measured (docs/BENCHMARKS.md, "Fleet routing"), requests left the replica holding
# their prefix when nothing could restore it elsewhere.
WAIT_COST_CHUNKS = 8
_UNREPORTED = 256  # routed prompts remembered until the replica's next report
HASH_BYTES = 8


def prefix_chain(text: str, chunk_chars: int = CHUNK_CHARS) -> list[bytes]:
    """One chained hash per full chunk of `text` (a partial last chunk is not hashed: a
    prefix shorter than a chunk is not worth routing for)."""
    chain = b"reame-route"
    hashes = []
    # Chunks of characters, not bytes, so that cutting never splits a character; the
    # encoded bytes of each chunk go into the hash.
    for start in range(0, len(text) - chunk_chars + 1, chunk_chars):
        piece = text[start : start + chunk_chars].encode("utf-8", "surrogatepass")
        chain = hashlib.blake2b(chain + piece, digest_size=HASH_BYTES).digest()
        hashes.append(chain)
    return hashes


def matched_chunks(chain: Sequence[bytes], held: Mapping[bytes, Any] | set[bytes]) -> int:
    """How many leading chunks of `chain` `held` contains (binary search: chained hashes
    mean that if chunk i is held, every chunk before it was part of the same text)."""
    low, high = 0, len(chain)
    while low < high:
        middle = (low + high + 1) // 2
        if chain[middle - 1] in held:
            low = middle
        else:
            high = middle - 1
    return low


class PrefixSet:
    """Chunk hashes in least-recently-used order, at most `capacity` of them."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._hashes: OrderedDict[bytes, None] = OrderedDict()

    def __contains__(self, item: object) -> bool:
        return item in self._hashes

    def __len__(self) -> int:
        return len(self._hashes)

    def add(self, chain: Iterable[bytes]) -> None:
        for digest in chain:
            self._hashes[digest] = None
            self._hashes.move_to_end(digest)
        while len(self._hashes) > self.capacity:
            self._hashes.popitem(last=False)

    def replace(self, chain: Iterable[bytes]) -> None:
        self._hashes.clear()
        self.add(chain)

    def matched(self, chain: Sequence[bytes]) -> int:
        return matched_chunks(chain, self._hashes)


@dataclass
class RoutingStats:
    """What a replica reports about itself (`record_routing_stats`), as plain data so it
    crosses process boundaries as is."""

    queued: int = 0  # requests waiting for a slot
    running: int = 0  # requests in a slot
    slots: int = 1
    resident: list[bytes] = field(default_factory=list)  # chunk hashes its slots hold
    stored: list[bytes] = field(default_factory=list)  # ...it wrote to the shared disk cache
    shared_cache: bool = False  # whether it reads and writes the fleet's disk cache
    serial: int = 0  # increases with every report

    def as_dict(self) -> dict[str, Any]:
        return {
            "queued": self.queued,
            "running": self.running,
            "slots": self.slots,
            "resident": [h.hex() for h in self.resident],
            "stored": [h.hex() for h in self.stored],
            "shared_cache": self.shared_cache,
            "serial": self.serial,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RoutingStats:
        return cls(
            queued=int(data.get("queued", 0)),
            running=int(data.get("running", 0)),
            slots=max(1, int(data.get("slots", 1))),
            resident=[bytes.fromhex(h) for h in data.get("resident", ())],
            stored=[bytes.fromhex(h) for h in data.get("stored", ())],
            shared_cache=bool(data.get("shared_cache", False)),
            serial=int(data.get("serial", 0)),
        )


@dataclass
class ReplicaView:
    """The router's picture of one replica."""

    resident: PrefixSet
    queued: int = 0
    running: int = 0
    slots: int = 1
    shared_cache: bool = False
    serial: int = -1
    routed_since_report: list[list[bytes]] = field(default_factory=list)
    last_routed: int = 0  # when the router last sent it a request (a routing count)

    @property
    def load(self) -> int:
        """Requests that must finish before a new one gets a slot: 0 while one is free."""
        return max(0, self.queued + self.running - self.slots + 1)


@dataclass(frozen=True)
class Choice:
    """A ranking and why: `reason` is one of session, prefix, disk, balance, spread."""

    ranked: list[str]
    reason: str
    reused_chars: int = 0


class FleetAffinity:
    """Routing state for one deployment's replicas. Not thread-safe: one router owns it
    (Serve runs a router's methods on one event loop)."""

    def __init__(
        self,
        *,
        resident_capacity: int = 4096,
        shared_capacity: int = 65536,
        max_sessions: int = 100_000,
        imbalance: int = 2,
        wait_cost_chunks: float = WAIT_COST_CHUNKS,
        disk_weight: float = DISK_WEIGHT,
        chunk_chars: int = CHUNK_CHARS,
        rng: random.Random | None = None,
    ) -> None:
        self.chunk_chars = chunk_chars
        self.imbalance = imbalance
        self.wait_cost_chunks = wait_cost_chunks
        self.disk_weight = disk_weight
        self._resident_capacity = resident_capacity
        self._max_sessions = max_sessions
        self.replicas: dict[str, ReplicaView] = {}
        self.shared = PrefixSet(shared_capacity)
        self.sessions: OrderedDict[str, str] = OrderedDict()
        self._rng = rng or random.Random()
        self._routings = 0

    # ------------------------------------------------------------ membership

    def replica(self, replica_id: str) -> ReplicaView:
        view = self.replicas.get(replica_id)
        if view is None:
            view = self.replicas[replica_id] = ReplicaView(PrefixSet(self._resident_capacity))
        return view

    def keep_only(self, live: Iterable[str]) -> None:
        """Forget replicas not in `live`, and the sessions that lived on them."""
        alive = set(live)
        for replica_id in [r for r in self.replicas if r not in alive]:
            self.forget(replica_id)

    def forget(self, replica_id: str) -> None:
        self.replicas.pop(replica_id, None)
        for session in [s for s, r in self.sessions.items() if r == replica_id]:
            del self.sessions[session]

    # ---------------------------------------------------------------- reports

    def observe(self, replica_id: str, stats: RoutingStats) -> None:
        """A replica's own report: it replaces what the router guessed, except for the
        requests routed since (the report may predate them)."""
        view = self.replica(replica_id)
        if stats.serial == view.serial:
            return
        view.serial = stats.serial
        view.queued, view.running, view.slots = stats.queued, stats.running, stats.slots
        view.shared_cache = stats.shared_cache
        view.resident.replace(stats.resident)
        for chain in view.routed_since_report:
            view.resident.add(chain)
        view.routed_since_report.clear()
        if stats.shared_cache:
            self.shared.add(stats.stored)

    def set_queue(self, replica_id: str, queued_and_running: int) -> None:
        """A fresher count of a replica's requests (Serve's queue-length probes)."""
        view = self.replica(replica_id)
        view.running = min(queued_and_running, view.slots)
        view.queued = queued_and_running - view.running

    # ---------------------------------------------------------------- routing

    def rank(self, candidates: Sequence[str], text: str, session: str | None = None) -> Choice:
        """Candidates in order of preference for a request with routing text `text`."""
        if not candidates:
            return Choice([], "none")
        live = list(candidates)
        if session is not None and self.sessions.get(session) in live:
            home = self.sessions[session]
            self.sessions.move_to_end(session)
            rest = sorted((r for r in live if r != home), key=lambda r: self.replica(r).load)
            return Choice([home, *rest], "session")
        loads = {r: self.replica(r).load for r in live}
        if max(loads.values()) - min(loads.values()) > self.imbalance:
            # One replica is far behind: caches matter less than its queue. Power of two
            # choices: two at random, the shorter queue first.
            pair = self._rng.sample(live, min(2, len(live)))
            pair.sort(key=lambda r: loads[r])
            rest = sorted((r for r in live if r not in pair), key=lambda r: loads[r])
            return Choice(pair + rest, "balance")
        chain = prefix_chain(text, self.chunk_chars)
        on_disk = self.shared.matched(chain)
        scores: dict[str, float] = {}
        for replica_id in live:
            view = self.replica(replica_id)
            resident = view.resident.matched(chain)
            restorable = on_disk * self.disk_weight if view.shared_cache else 0.0
            scores[replica_id] = max(float(resident), restorable)
        best = max(scores.values())
        if best <= 0:
            # Nothing cached anywhere: the least loaded; for a new prefix, then the replica
            # holding the fewest (new prefixes spread over the fleet); then the one least
            # recently sent a request (a prompt too short to cache goes round the fleet).
            def spread(r: str) -> tuple[int, int, int]:
                view = self.replica(r)
                return (loads[r], len(view.resident) if chain else 0, view.last_routed)

            return Choice(sorted(live, key=spread), "spread")
        # Prefer the cache, but not behind a long queue.
        cost = {r: loads[r] * self.wait_cost_chunks - scores[r] for r in live}
        order = sorted(live, key=lambda r: (cost[r], self._rng.random()))
        top = order[0]
        resident_top = self.replica(top).resident.matched(chain)
        reason = "prefix" if resident_top >= scores[top] else "disk"
        return Choice(order, reason, int(scores[top] * self.chunk_chars))

    def least_recently_routed(self, candidates: Sequence[str]) -> list[str]:
        return sorted(candidates, key=lambda r: self.replica(r).last_routed)

    def routed(self, replica_id: str, text: str, session: str | None = None) -> None:
        """Record that a request went to `replica_id`: its prompt will be in that
        replica's slots, and its session lives there from now on."""
        view = self.replica(replica_id)
        self._routings += 1
        view.last_routed = self._routings
        chain = prefix_chain(text, self.chunk_chars)
        if chain:
            view.resident.add(chain)
            view.routed_since_report.append(chain)
            del view.routed_since_report[:-_UNREPORTED]
        if session is not None:
            self.sessions[session] = replica_id
            self.sessions.move_to_end(session)
            while len(self.sessions) > self._max_sessions:
                self.sessions.popitem(last=False)
