"""One replica of the fleet: a Reame engine and the `reame serve` application around it,
answering the requests the ingress forwards, and reporting what the router needs to know.

Ray Serve makes it a deployment (`app.py`); it is a plain class so that it reads, and
runs, without Ray. The model loads in the constructor: Serve sends a replica nothing
before that returns, so no request ever meets a loading engine.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from typing import Any

import structlog

from reame_core.fleet.affinity import CHUNK_CHARS, RoutingStats, prefix_chain
from reame_core.fleet.forwarding import (
    REPLICA_HEADER,
    ForwardedRequest,
    ReplyStart,
    exchange,
)
from reame_core.fleet.sessions import pinnable
from reame_core.runtime import Runtime, start_runtime
from reame_core.server.app import create_app
from reame_core.server.service import ServerState
from reame_core.settings import Settings

log = structlog.get_logger(__name__)

# Prompts of recent requests this replica reports as written to the shared disk cache,
# each report: enough for the routers to learn them within a few reports, small enough to
# send every few seconds.
REPORTED_STORED = 64
# Sessions whose turns this replica served that it reports on, the most recent.
REPORTED_SESSIONS = 256
# Requests this replica finished that it names in each report, the most recent: a router
# takes a request's prompt to be in a slot until a report names it (`Unreported`), and
# reports come every few seconds, so this only needs to cover the requests of a few.
REPORTED_FINISHED = 64


class ServedPrefixes:
    """A replica's record of the prompts it computed: the last `slots` of them are what its
    slots hold, except that the engine keeps the slots of its most recent sessions pinned
    (`pinnable`), so their conversations stay while other prompts pass; with a shared
    disk cache, the recent ones are there for every replica to restore. And the turns it
    served of each recent session, reported with whether the engine's slots still hold
    that conversation (the engine's word, not this record's guess). `conversations`: the
    disk cache keeps a session's whole prompt, not only its first turn."""

    def __init__(
        self,
        slots: int,
        shared_cache: bool,
        chunk_chars: int = CHUNK_CHARS,
        conversations: bool = False,
    ) -> None:
        self.slots = slots
        self.shared_cache = shared_cache
        self.conversations = conversations
        self.chunk_chars = chunk_chars
        self._resident: OrderedDict[bytes, list[bytes]] = OrderedDict()
        self._recent_stored: OrderedDict[bytes, list[bytes]] = OrderedDict()
        # session -> turns served here, its last prompt's tail; the most recent last
        self._turns: OrderedDict[str, tuple[int, bytes]] = OrderedDict()
        self._finished: deque[str] = deque(maxlen=REPORTED_FINISHED)
        # Sessions the engine held in no slot at the last report (set aside, or lost):
        # no longer pinned, until their next turn here takes a slot again.
        self._out_of_slots: set[str] = set()
        self._reported_sessions = max(REPORTED_SESSIONS, pinnable(slots))
        self._serial = 0
        self._lock = threading.Lock()

    def served(
        self, text: str, stored_chars: int | None = None, session: str | None = None
    ) -> None:
        """A prompt computed here, a turn of `session` if given; the disk prefix cache
        keeps its first `stored_chars` (all of it by default, and for a session where it
        keeps conversations)."""
        chain = prefix_chain(text, self.chunk_chars)
        if not chain:
            return
        if stored_chars is None or (self.conversations and session is not None):
            stored = chain
        else:  # a first turn padded to a chunk (`turn_aligned`) is shorter: none stored
            stored = chain[: stored_chars // self.chunk_chars]
        with self._lock:
            if session is not None:
                self._out_of_slots.discard(session)
                turns = self._turns.pop(session, (0, b""))[0]
                self._turns[session] = (turns + 1, chain[-1])
                while len(self._turns) > self._reported_sessions:
                    self._turns.popitem(last=False)
            _remember(self._resident, chain, self.slots, keep=self._pinned_tails())
            if self.shared_cache and stored:
                _remember(self._recent_stored, stored, REPORTED_STORED)

    def finished(self, request_id: str) -> None:
        """A request ended here, served or not (after `served`, if it was): reports taken
        from now on account for it."""
        with self._lock:
            self._finished.append(request_id)

    def _pinned_tails(self) -> set[bytes]:
        """The last prompts of the sessions the engine keeps pinned: its most recent,
        less those it held in no slot at the last report."""
        recent = itertools.islice(reversed(self._turns.items()), pinnable(self.slots))
        return {tail for session, (_, tail) in recent if session not in self._out_of_slots}

    def report(
        self,
        queued: int,
        running: int,
        in_slots: Collection[str] | None = None,
        spills: bool = False,
        aside: Collection[str] = (),
    ) -> RoutingStats:
        """What the routers need. The sessions whose conversation the engine holds now
        correct the record (None: unknown): `in_slots`, in a slot, and `aside`, kept in
        memory since another request took their slot (`spills`: the engine keeps such
        conversations, engine/slots.py); a session in neither lost its slot to another
        request."""
        with self._lock:
            self._serial += 1
            resident = list(self._resident.values())
            sessions: dict[str, tuple[int, bool]] = {}
            set_aside: list[str] = []
            if in_slots is not None:
                self._out_of_slots = set()
                gone = set()  # their last prompts
                for session, (turns, tail) in self._turns.items():
                    kept_aside = session in aside
                    held = kept_aside or session in in_slots
                    sessions[session] = (turns, held)
                    if kept_aside:
                        set_aside.append(session)
                    if kept_aside or not held:
                        self._out_of_slots.add(session)
                        gone.add(tail)
                resident = [chain for chain in resident if chain[-1] not in gone]
            return RoutingStats(
                queued=queued,
                running=running,
                slots=self.slots,
                resident=resident,
                sessions=sessions,
                stored=[h for chain in self._recent_stored.values() for h in chain],
                shared_cache=self.shared_cache,
                serial=self._serial,
                finished=list(self._finished),
                spills=spills,
                aside=set_aside,
            )


def _remember(
    memory: OrderedDict[bytes, list[bytes]],
    chain: list[bytes],
    most: int,
    keep: set[bytes] | frozenset[bytes] = frozenset(),
) -> None:
    # A prompt extending a remembered one (the next turn of a conversation) replaces it.
    for shorter in [key for key in memory if key in chain]:
        del memory[shorter]
    memory[chain[-1]] = chain
    while len(memory) > most:
        victim = next((key for key in memory if key not in keep), None)
        if victim is None:
            memory.popitem(last=False)
        else:
            del memory[victim]


class ReameReplica:
    """Constructed by Ray Serve in the replica's actor with the fleet's settings (the
    values set explicitly, as `Settings` fields). `shared_cache`: the prefix store plugins
    keep their files in the fleet's shared directory; `conversations`: there, the disk
    cache keeps a session's whole prompt, not only its first turn. `name` tags replies
    (`X-Reame-Replica`). `start` starts the runtime (tests give one over a fake backend)."""

    def __init__(
        self,
        settings: Mapping[str, Any],
        *,
        shared_cache: bool = False,
        conversations: bool = False,
        name: str | None = None,
        start: Callable[[Settings], Runtime] = start_runtime,
    ) -> None:
        self.settings = Settings.load(None, **settings)
        self.name = name or _replica_name()
        self.server = ServerState(self.settings, api_keys=self.settings.all_api_keys())
        self.app = create_app(self.server)
        runtime = start(self.settings)
        self.server.runtime = runtime
        info = runtime.backend.info
        # Shared only if some plugin restores stored prefixes at all.
        shared = shared_cache and runtime.plugins.has_implementations("reame_prefix_lookup")
        self.prefixes = ServedPrefixes(
            info.n_seq_max, shared_cache=shared, conversations=conversations
        )
        log.info("fleet replica ready", replica=self.name, slots=info.n_seq_max)

    async def __call__(self, request: ForwardedRequest) -> AsyncIterator[ReplyStart | bytes]:
        status = 0
        tag = (REPLICA_HEADER.encode(), self.name.encode())
        try:
            async for part in exchange(self.app, request):
                if isinstance(part, ReplyStart):
                    status = part.status
                    part = ReplyStart(part.status, (*part.headers, tag))
                yield part
            if request.routable and status == 200:
                self.prefixes.served(request.routed_text, request.stored_chars, request.session)
        finally:
            if request.routable:
                self.prefixes.finished(request.id)

    def record_routing_stats(self) -> dict[str, Any]:
        """Ray Serve asks every `request_routing_stats_period_s`; the routers read it."""
        in_flight = self.server.in_flight
        running = min(in_flight, self.prefixes.slots)
        runtime = self.server.runtime
        if runtime is None:
            return self.prefixes.report(in_flight - running, running).as_dict()
        slots = runtime.engine.slots
        in_slots, aside = slots.holdings()
        return self.prefixes.report(
            in_flight - running, running, in_slots, spills=slots.spill_bytes > 0, aside=aside
        ).as_dict()

    def check_health(self) -> None:
        """Ray Serve restarts a replica whose health check raises."""
        if self.server.runtime is None:
            raise RuntimeError(self.server.load_error or "the engine is not running")

    def __del__(self) -> None:
        runtime, self.server.runtime = self.server.runtime, None
        if runtime is not None:
            runtime.close()


def _replica_name() -> str:
    try:
        from ray import serve

        return str(serve.get_replica_context().replica_id.unique_id)
    except Exception:  # outside a Serve replica (tests, embedding)
        import os

        return f"pid-{os.getpid()}"
