"""Where a request should go in a fleet of replicas: pure routing logic, no Ray.

The router sees text, not tokens (it runs in the ingress, which has no model), so prompts
are compared through `prefix_chain`: one chained hash per `CHUNK_CHARS` characters of the
prompt's routing text, the i-th hash covering every character up to the end of chunk i.
Two prompts share chunk hashes up to the depth where their texts part, so "the longest
cached prefix" is the deepest chunk hash a replica holds — a walk down the request's own
chain, a few set lookups, whatever the size of the fleet. A chat's first turn shorter than
a chunk — a short system prompt, or the model template's default one, which a chat opening
with the user's message gets and its routing text does not show — is padded to a chunk
(`turn_aligned`): chats opening alike share those tokens, and so a chunk.

What the router knows of each replica (`ReplicaView`):
- the prompts its slots hold (`held`, as many as it has slots, most recent last): learned
  at once from each request routed there, and replaced, every few seconds, by what the
  replica itself reports (`record_routing_stats`) — except the prompts of requests no
  report has yet accounted for (`unreported`: a report names the requests the replica had
  finished when it was taken, and may reach the router seconds later, after the request
  completed); the prompts of its requests in flight;
- the work in flight there (`Backlog`): each request the router sent it, priced at the
  prompt chunks it had to compute, until it completes, drained meanwhile at the rate the
  replica was measured to compute at.

What it knows of the fleet: the prefixes written to the shared disk prefix cache
(`shared`), which any replica restores in a fraction of the time a prefill takes; a prefix
there counts `DISK_WEIGHT` as much as one resident in a slot. Each prefix's home
(`PrefixHomes`): the replica that first computed it. Slots hold only a few prompts, and a
replica's report names only those, so without a home a prefix evicted everywhere would land
on any replica, and every replica's slots would cycle through every prefix of the fleet.
With one, each replica's slots serve a stable share of the prefixes.

And which replica each session (`X-Session-ID`, `session_id`) lives on (`SessionBook`): a
session's later turns go where its KV is, as long as that replica lives and keeps it pinned;
a request that would take a live session's pinned slot pays for that conversation's
recompute.

`FleetAffinity.rank` turns this into an order of preference. Serve's request router then
sends the request to the first replica in that order with room (`max_ongoing_requests`).
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import random
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reame_core.fleet.backlog import Backlog, Work
from reame_core.fleet.sessions import SessionBook, SessionPlace, pinnable

CHUNK_CHARS = 128
# A prefix on the shared disk is worth this much of a resident one: restoring 600 tokens of
# SmolLM2 takes 0.04-0.10 s against 2 s to compute them (docs/BENCHMARKS.md).
DISK_WEIGHT = 0.9
# The disk prefix cache restores no prefix shorter than its `min_tokens` (128 by default,
# reame_diskkv): about four chunks of text. A shallower match on disk counts for nothing.
DISK_LEAST_CHUNKS = 4
# Fills a chat's short first turn up to a chunk (`turn_aligned`): a character chats do not
# use (one that does only shares a chunk by chance: a routing hint, never a cache key).
TURN_PAD = "\0"
# Sending a prefix home is worth this much of holding it: not a chunk saved now (the home
# may have evicted it too), but its later requests find it there instead of on every replica.
HOME_WEIGHT = 0.5
# Each request costs its replica at least this many chunks (its answer's decode steps).
DECODE_CHUNKS = 1.0
# A request the router did not send (another ingress's, or one it lost track of), priced
# at about half a cold 500-token prompt.
UNKNOWN_REQUEST_CHUNKS = 8.0
# Reports a routed prompt outlives its request's end unnamed (the replica never served it:
# cancelled before it ran, say) before it no longer counts as in a slot: a report taken
# after the request finished names it, and reports come every few seconds.
UNREPORTED_REPORTS = 3
# Most routed prompts a replica's view keeps until reports account for them.
UNREPORTED_MOST = 64
HASH_BYTES = 8
# Replicas ranked exactly, best first; the others follow in an order that may price some
# too low (`best_first`). Serve tries the ranks in turn, and the first takes the request
# unless it is at `max_ongoing_requests`.
EXACT_RANKS = 3


def turn_aligned(text: str, first_turn: int | None, chunk_chars: int = CHUNK_CHARS) -> str:
    """A chat's routing text with its first turn, if shorter than a chunk, padded to one
    (`TURN_PAD`): chats opening with the same short system prompt, or all those opening
    with the user's message, then share a chunk, as their prompts share those tokens —
    the second kind, the template's default system turn, where the model's template puts
    one first (SmolLM2's and Qwen2.5's do: about 20 and 30 tokens; a chunk counts for about
    30). Not a chat (None), or a first turn of a chunk or more: `text` as it is."""
    if first_turn is None or first_turn >= chunk_chars:
        return text
    return text[:first_turn] + TURN_PAD * (chunk_chars - first_turn) + text[first_turn:]


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
    """How many leading chunks of `chain` `held` contains."""
    return _deepest(len(chain), lambda i: chain[i - 1] in held)


def shared_chunks(a: Sequence[bytes], b: Sequence[bytes]) -> int:
    """How many leading chunks two chains share."""
    return _deepest(min(len(a), len(b)), lambda i: a[i - 1] == b[i - 1])


def _deepest(n: int, holds: Callable[[int], bool]) -> int:
    """The largest i <= n for which `holds(i)`, by binary search: chained hashes mean that
    if two texts share chunk i, they share every chunk before it."""
    low, high = 0, n
    while low < high:
        middle = (low + high + 1) // 2
        if holds(middle):
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

    def add(self, chain: Sequence[bytes]) -> None:
        # Deepest first, so a chain's shallow chunks (shared by more prompts) go last.
        for digest in reversed(chain):
            self._hashes[digest] = None
            self._hashes.move_to_end(digest)
        while len(self._hashes) > self.capacity:
            self._hashes.popitem(last=False)

    def matched(self, chain: Sequence[bytes]) -> int:
        return matched_chunks(chain, self._hashes)


class PrefixHomes:
    """Each prefix chunk's home replica: the first to be sent a prompt containing it. A
    later request elsewhere (its home was busy) does not move it; its home leaving does.
    At most `capacity` chunks, least recently routed forgotten first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._homes: OrderedDict[bytes, str] = OrderedDict()
        self.chunks: Counter[str] = Counter()  # chunks homed on each replica

    def claim(self, chain: Sequence[bytes], replica_id: str) -> None:
        for digest in reversed(chain):  # shallow chunks most recent, as in PrefixSet
            if digest in self._homes:
                self._homes.move_to_end(digest)
            else:
                self._homes[digest] = replica_id
                self.chunks[replica_id] += 1
        while len(self._homes) > self.capacity:
            _, home = self._homes.popitem(last=False)
            self.chunks[home] -= 1

    def home(self, chain: Sequence[bytes]) -> tuple[str | None, int]:
        """The home of the deepest homed chunk of `chain`, and that depth."""
        depth = matched_chunks(chain, self._homes)
        return (self._homes[chain[depth - 1]], depth) if depth else (None, 0)

    def release(self, replica_id: str) -> None:
        """A replica left: its prefixes are homeless until their next request."""
        for digest in [d for d, home in self._homes.items() if home == replica_id]:
            del self._homes[digest]
        self.chunks.pop(replica_id, None)


@dataclass
class RoutingStats:
    """What a replica reports about itself (`record_routing_stats`), as plain data so it
    crosses process boundaries as is."""

    queued: int = 0  # requests waiting for a slot
    running: int = 0  # requests in a slot
    slots: int = 1
    resident: list[list[bytes]] = field(default_factory=list)  # prompts its slots hold
    stored: list[bytes] = field(default_factory=list)  # chunks it wrote to the shared disk
    shared_cache: bool = False  # whether it reads and writes the fleet's disk cache
    serial: int = 0  # increases with every report
    # Recent sessions: turns it served of each, and whether its engine still holds the
    # conversation (in a slot, or `aside`).
    sessions: dict[str, tuple[int, bool]] = field(default_factory=dict)
    # The requests it finished most recently (`ForwardedRequest.id`), whatever their status.
    finished: list[str] = field(default_factory=list)
    # Whether its engine keeps a pinned conversation whose slot another request takes in
    # memory, for the session's next turn there (engine/slots.py, `spill_bytes`).
    spills: bool = False
    # Sessions among `sessions` whose conversation it keeps in memory, out of any slot.
    aside: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "queued": self.queued,
            "running": self.running,
            "slots": self.slots,
            "resident": [[h.hex() for h in chain] for chain in self.resident],
            "stored": [h.hex() for h in self.stored],
            "shared_cache": self.shared_cache,
            "serial": self.serial,
            "finished": list(self.finished),
            "spills": self.spills,
            "aside": list(self.aside),
            "sessions": {s: [turns, held] for s, (turns, held) in self.sessions.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RoutingStats:
        return cls(
            queued=int(data.get("queued", 0)),
            running=int(data.get("running", 0)),
            slots=max(1, int(data.get("slots", 1))),
            resident=[[bytes.fromhex(h) for h in chain] for chain in data.get("resident", ())],
            stored=[bytes.fromhex(h) for h in data.get("stored", ())],
            shared_cache=bool(data.get("shared_cache", False)),
            serial=int(data.get("serial", 0)),
            finished=[str(r) for r in data.get("finished", ())],
            spills=bool(data.get("spills", False)),
            aside=[str(s) for s in data.get("aside", ())],
            sessions={
                str(s): (int(turns), bool(held))
                for s, (turns, held) in dict(data.get("sessions", {})).items()
            },
        )


@dataclass(frozen=True)
class _SlotIndex:
    """A replica's prompts held and in flight (named by their tails, in order), every
    chunk hash among them counted once per prompt holding it, and each tail's copies."""

    tails_in_order: tuple[bytes, ...]
    counts: Counter[bytes]
    tails: Counter[bytes]


@dataclass
class Unreported:
    """A prompt routed to a replica that no report of the replica has accounted for yet:
    until one names `request` among those it finished, the prompt is taken to be in a slot
    there. A report may be taken before the request ran, or while it ran, and reach the
    router after it completed. Once the request has left the router's backlog (`key`),
    at most `UNREPORTED_REPORTS` more reports may pass without naming it. Without an id,
    the first report to arrive is taken to predate it, and the next to account for it."""

    chain: list[bytes]
    request: str | None = None  # `ForwardedRequest.id`
    key: Hashable | None = None  # its entry in the replica's backlog
    reports_since_done: int = 0


@dataclass
class ReplicaView:
    """The router's picture of one replica."""

    slots: int = 1
    shared_cache: bool = False
    spills: bool = False  # keeps a taken pinned conversation for its next turn (`RoutingStats`)
    serial: int = -1
    held: list[list[bytes]] = field(default_factory=list)  # least recently used first
    unreported: list[Unreported] = field(default_factory=list)  # routed first, first
    backlog: Backlog = field(default_factory=Backlog)
    others: int = 0  # requests in flight that this router did not send
    counted: int | None = None  # Serve's latest count of its requests, if any
    last_routed: int = 0  # when the router last sent it a request (a routing count)
    _index: _SlotIndex | None = field(default=None, repr=False, compare=False)

    @property
    def ongoing(self) -> int:
        return len(self.backlog) + self.others

    @property
    def full(self) -> bool:
        """Every slot taken, by the router's count and by Serve's: a request whose
        completion the router never heard of must not keep a replica full for good (Serve's
        count drops it), and Serve's count, late by a request or two, is checked against
        the router's own."""
        taken = self.ongoing if self.counted is None else min(self.ongoing, self.counted)
        return taken >= self.slots

    @property
    def load(self) -> int:
        """Requests that must finish before a new one gets a slot: 0 while one is free."""
        return max(0, self.ongoing - self.slots + 1)

    def slot_frees_after(self, now: float) -> float | None:
        """With every slot taken, when the request was sent whose end frees a slot for a new
        one here: requests end about in the order they were sent (each holds its slot
        about as long), so a new request waits for the `load`-th oldest — while that one
        is in a slot already. None when it is queued itself (its end depends on how long
        those before it hold their slots, which the router does not know), and `now` for
        a request the router did not send (nor does it know when that one ends)."""
        turn = self.load - 1
        if turn >= self.slots:
            return None
        in_flight = list(self.backlog.in_flight.values())
        return in_flight[turn].sent if turn < len(in_flight) else now

    def ahead(self, now: float) -> float:
        """Chunks of prompt work a new request waits for here: what is left of those in
        flight, cold or not (see `Backlog`)."""
        return self.backlog.remaining(now) + self.others * UNKNOWN_REQUEST_CHUNKS

    def hold(self, chain: list[bytes], pinned: Collection[bytes] = ()) -> None:
        """`chain` took a slot: the least recently used prompt beyond the slots is gone
        (not one whose tail is in `pinned`: a session's slot is taken last), and so is a
        prompt it extends (the earlier turn of the same conversation)."""
        if not chain:
            return
        self.held = [c for c in self.held if c[-1] not in chain]  # chained: c is a prefix
        self.held.append(chain)
        while len(self.held) > self.slots:
            victim = next((c for c in self.held if c[-1] not in pinned), self.held[0])
            self.held.remove(victim)

    def drop(self, chain: Sequence[bytes]) -> None:
        """A request took the slot holding `chain`."""
        self.held = [c for c in self.held if c[-1] != chain[-1]]

    def resident(self, chain: Sequence[bytes], besides: Sequence[bytes] = ()) -> int:
        """Leading chunks of `chain` in this replica's slots (held, or being computed),
        not counting the prompt `besides` itself."""
        index = self._slot_index()
        twins = index.tails[besides[-1]] if besides else 0  # copies of `besides` held
        if not twins:
            return matched_chunks(chain, index.counts)
        # Chained hashes: a chunk of `chain` within its overlap with `besides` is in every
        # copy of `besides`, so it counts only if some other prompt holds it too.
        overlap = shared_chunks(chain, besides)
        return _deepest(
            len(chain),
            lambda i: index.counts.get(chain[i - 1], 0) > (twins if i <= overlap else 0),
        )

    def _slot_index(self) -> _SlotIndex:
        """The index of the prompts held and in flight, rebuilt when they change: a
        decision asks each replica about several prompts (the request's, each pinned
        session's) between two changes."""
        prompts = [
            p
            for p in itertools.chain(self.held, (w.chain for w in self.backlog.in_flight.values()))
            if p
        ]
        tails = tuple(p[-1] for p in prompts)  # chained hashes: a tail names its prompt
        if self._index is None or self._index.tails_in_order != tails:
            self._index = _SlotIndex(tails, Counter(h for p in prompts for h in p), Counter(tails))
        return self._index

    def settle(self, ongoing: int) -> list[Work]:
        """A fresh count of the replica's requests: requests the router counts beyond it
        have finished unnoticed (the oldest, most likely), and are returned; requests
        beyond the router's are someone else's."""
        gone = []
        while len(self.backlog) > ongoing:
            gone.append(self.backlog.drop_oldest())
        self.others = ongoing - len(self.backlog)
        return gone


@dataclass(frozen=True)
class Displaced:
    """A live session whose pinned slot a request would take, the chance it does, the
    chunks its next turn would then compute again, and whether the request takes the slot
    as it arrives (rather than unpinning it, or taking it later if a slot frees there)."""

    session: str
    chance: float
    recompute: float
    at_once: bool = False


@dataclass(frozen=True)
class Choice:
    """A ranking and why: `reason` is one of session, balance, prefix, disk, home, spread."""

    ranked: list[str]
    reason: str
    reused_chars: int = 0
    costs: Mapping[str, float] = field(default_factory=dict)  # by replica priced in full


def best_first(
    items: Sequence[str],
    key: Callable[[str, float], tuple[Any, ...]],
    least: Mapping[str, float],
    price: Callable[[str], float],
    exact: int,
) -> tuple[list[str], dict[str, float]]:
    """`items` (distinct) ordered by `key(item, price(item))`, the first `exact` of them
    exactly, the rest by what is known of their price; and the prices computed. `price` is
    dear: it is asked only of items that could be among the first `exact`, given that an
    item's price is at least `least[item]` and its key grows with its price. Equal keys
    keep `items`' order."""
    # Each item's key at its least price, then its place: the order of the unpriced.
    bounds = sorted((key(item, least[item]), n, item) for n, item in enumerate(items))
    priced: dict[str, float] = {}
    heap: list[tuple[tuple[Any, ...], int, str]] = []
    ranked: list[str] = []
    j = 0
    while len(ranked) < exact and (heap or j < len(bounds)):
        # Price every item that could still come before the best priced one.
        while j < len(bounds) and (not heap or bounds[j][:2] <= heap[0][:2]):
            _, n, item = bounds[j]
            j += 1
            priced[item] = price(item)
            heapq.heappush(heap, (key(item, priced[item]), n, item))
        ranked.append(heapq.heappop(heap)[2])
    return ranked + [item for _, _, item in sorted(heap + bounds[j:])], priced


class FleetAffinity:
    """Routing state for one deployment's replicas. Not thread-safe: one router owns it
    (Serve runs a router's methods on one event loop).

    A request's cost on a replica, in chunks of prompt computed, stands for the time to its
    first token there plus what it costs others: the prompt work still ahead of it there,
    plus the chunks it must compute itself (once), plus the recompute of any live session
    whose pinned slot it would take, less `home_weight` of the prefix if the replica is
    its home. Lowest cost first among the replicas with a slot free, then the others, the
    one whose slot frees first first: a prefix held on a replica keeps its requests unless
    the work ahead there outweighs computing it elsewhere, or the replica has no slot free
    for them."""

    def __init__(
        self,
        *,
        shared_capacity: int = 65536,
        homes_capacity: int = 65536,
        max_sessions: int = 100_000,
        imbalance: int = 2,
        disk_weight: float = DISK_WEIGHT,
        home_weight: float = HOME_WEIGHT,
        chunk_chars: int = CHUNK_CHARS,
        sole_router: bool = False,
        exact_ranks: int = EXACT_RANKS,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if exact_ranks < 1:
            raise ValueError("exact_ranks must be at least 1")
        self.chunk_chars = chunk_chars
        self.exact_ranks = exact_ranks
        # Every request the replicas get comes through this router (the fleet has one
        # ingress): counts beyond its own are lag, not another router's requests.
        self.sole_router = sole_router
        self.imbalance = imbalance
        self.disk_weight = disk_weight
        self.home_weight = home_weight
        self.replicas: dict[str, ReplicaView] = {}
        self.shared = PrefixSet(shared_capacity)
        self.homes = PrefixHomes(homes_capacity)
        self.sessions = SessionBook(max_sessions)
        self._rng = rng or random.Random()
        self._clock = clock
        self._routings = 0
        self._completions_seen = False

    # ------------------------------------------------------------ membership

    def replica(self, replica_id: str) -> ReplicaView:
        view = self.replicas.get(replica_id)
        if view is None:
            view = self.replicas[replica_id] = ReplicaView()
        return view

    def keep_only(self, live: Iterable[str]) -> None:
        """Forget replicas not in `live`, and the sessions that lived on them."""
        alive = set(live)
        for replica_id in [r for r in self.replicas if r not in alive]:
            self.forget(replica_id)

    def forget(self, replica_id: str) -> None:
        self.replicas.pop(replica_id, None)
        self.homes.release(replica_id)
        self.sessions.forget_replica(replica_id)

    # ---------------------------------------------------------------- reports

    def observe(self, replica_id: str, stats: RoutingStats) -> None:
        """A replica's own report: it replaces what the router guessed its slots hold,
        except for the prompts of requests it does not name as finished (it may have been
        taken before they ran, or while they ran: `Unreported`)."""
        view = self.replica(replica_id)
        if stats.serial <= view.serial:  # seen, or older than one seen
            return
        view.serial = stats.serial
        view.slots, view.shared_cache, view.spills = stats.slots, stats.shared_cache, stats.spills
        aside = set(stats.aside)
        for session, (turns, held) in stats.sessions.items():
            self._engine_says(replica_id, session, turns, held, session in aside)
        view.held = []
        pinned = self._pinned_tails(replica_id)
        finished = set(stats.finished)
        unreported = []
        for entry in view.unreported:
            if entry.request in finished:
                continue
            if entry.key not in view.backlog.in_flight:
                entry.reports_since_done += 1
                if entry.reports_since_done > UNREPORTED_REPORTS:
                    continue
            unreported.append(entry)
        for chain in [*stats.resident, *(u.chain for u in unreported)]:
            view.hold(chain, pinned)
        view.unreported = [u for u in unreported if u.request is not None]
        # The count may predate requests sent since: it adds requests, never drops them.
        view.others = self._others(view, stats.queued + stats.running)
        if stats.shared_cache:
            self.shared.add(stats.stored)

    def _engine_says(
        self, replica_id: str, session: str, turns: int, held: bool, aside: bool = False
    ) -> None:
        """A replica's engine holds `session`'s conversation or not, after serving `turns`
        turns of it: in a slot, or (`aside`) in memory since another request took its
        slot. Believed only of a session living there with no turn in flight, once the
        router has seen as many of its turns complete there: a report taken before its
        last turn ended says nothing of that turn's slot."""
        place = self.sessions.get(session)
        if place is None or place.replica != replica_id or place.turns_in_flight:
            return
        if place.served_here != turns:
            return
        if not held:
            if place.kept:
                self._lose(session)
            return
        if aside and not (place.kept and place.set_aside):
            self._lose(session, set_aside=True)
        # Held in a slot does not undo a set-aside the router foresaw: the report may
        # predate the request that took the slot.
        place.kept = True

    def set_queue(self, replica_id: str, queued_and_running: int) -> None:
        """A fresher count of a replica's requests (Serve's queue-length cache, which
        counts each request sent and each completed, and takes the replica's own count
        now and then — one that may predate requests sent since). Once Serve has reported
        a completion, it reports them all: the count then only reveals requests that are
        not this router's. Before, it also settles which of this router's have finished."""
        view = self.replica(replica_id)
        view.counted = queued_and_running
        if not self._completions_seen:
            now = self._clock()
            for work in view.settle(queued_and_running):
                self.sessions.turn_over(work.session, now)
        view.others = self._others(view, queued_and_running)

    def _others(self, view: ReplicaView, counted: int) -> int:
        """Requests in flight on `view`'s replica that this router did not send, from a
        count of all of them there. A sole router sent them all: the count's excess is a
        request completed since it was taken, and Serve's count of a replica's requests,
        adjusted as they are sent and finish and replaced by the replica's own now and
        then, was seen here to stay one above for over a second."""
        return 0 if self.sole_router else max(0, counted - len(view.backlog))

    # ---------------------------------------------------------------- routing

    def rank(self, candidates: Sequence[str], text: str, session: str | None = None) -> Choice:
        """Candidates in order of preference for a request with routing text `text`."""
        if not candidates:
            return Choice([], "none")
        live = list(candidates)
        now = self._clock()
        host = self._session_host(session, live)
        if host is not None:
            rest = sorted((r for r in live if r != host), key=lambda r: self.replica(r).ahead(now))
            return Choice([host, *rest], "session")
        loads = {r: self.replica(r).load for r in live}
        if max(loads.values()) - min(loads.values()) > self.imbalance:
            # One replica is far behind: caches matter less than its queue. Power of two
            # choices: two at random, the shorter queue first.
            pair = self._rng.sample(live, min(2, len(live)))
            pair.sort(key=lambda r: loads[r])
            rest = sorted((r for r in live if r not in pair), key=lambda r: loads[r])
            return Choice(pair + rest, "balance")
        chain = prefix_chain(text, self.chunk_chars)
        on_disk = self._on_disk(chain)
        home, home_depth = self.homes.home(chain)
        cached = {r: self._cached(self.replica(r), chain, on_disk) for r in live}
        # Each cost but the sessions a request would displace, which is the dear part to
        # price (every pinned session's conversation against the replica's slots): a
        # lower bound, priced in full only for the replicas that could rank first.
        least = {
            r: self.replica(r).ahead(now)
            + (len(chain) - cached[r] + DECODE_CHUNKS)
            - (self._home_bonus(self.replica(r), home_depth, on_disk) if r == home else 0.0)
            for r in live
        }

        def price(r: str) -> float:
            displaced = self._displaced(r, chain, session, now)
            return least[r] + sum(d.chance * d.recompute for d in displaced)

        def preference(r: str, cost: float) -> tuple[bool, bool, float, float, int, int]:
            # A replica with a slot free before one without: a request that waits for a
            # slot waits for a whole request to finish, and takes a slot the sessions
            # living there will want. Among those without, where the request would take
            # the slot of one running now, the one whose slot frees first: that wait is
            # what remains of an answer's decoding, as a rule longer than a prompt's work;
            # then those with a queue longer than their slots, by cost. Equal costs: for a
            # new prefix, the replica home to the fewest (new prefixes spread over the
            # fleet); then the one least recently sent a request (prompts too short to
            # cache go round the fleet).
            view = self.replica(r)
            frees = view.slot_frees_after(now) if view.full else 0.0
            homes = self.homes.chunks[r] if chain else 0
            queued = frees is None
            return (view.full, queued, frees or 0.0, cost, homes, view.last_routed)

        order, cost = best_first(live, preference, least, price, self.exact_ranks)
        top = order[0]
        resident = self.replica(top).resident(chain)
        if cached[top] > 0:
            reason = "prefix" if resident >= cached[top] else "disk"
        else:
            reason = "home" if top == home and home_depth else "spread"
        return Choice(order, reason, int(cached[top] * self.chunk_chars), cost)

    def _session_host(self, session: str | None, live: Sequence[str]) -> str | None:
        """The replica whose slots still hold `session`'s conversation, if it is among
        `live`. A session whose slot was taken goes where its cost is lowest, like any
        request: its conversation is no longer anywhere."""
        place = self.sessions.get(session)
        if place is None or not place.kept or place.replica not in live:
            return None
        if place.set_aside:  # in the engine's memory there, out of any slot
            return place.replica
        view = self.replica(place.replica)
        return place.replica if view.resident(place.chain) >= len(place.chain) else None

    def _on_disk(self, chain: Sequence[bytes]) -> int:
        """Chunks of `chain` a replica sharing the disk cache could restore from it."""
        matched = self.shared.matched(chain)
        return matched if matched >= DISK_LEAST_CHUNKS else 0

    def _cached(self, view: ReplicaView, chain: Sequence[bytes], on_disk: int) -> float:
        """Chunks of `chain` the replica need not compute: held in a slot, or restored."""
        restorable = on_disk * self.disk_weight if view.shared_cache else 0.0
        return max(float(view.resident(chain)), restorable)

    def _home_bonus(self, view: ReplicaView, home_depth: int, on_disk: int) -> float:
        """What keeping a prefix home is worth: its chunks that the other replicas could
        not restore from the shared disk (there, every replica is nearly as good)."""
        restorable = on_disk if view.shared_cache else 0
        return self.home_weight * max(0, home_depth - restorable)

    def _displaced(
        self, replica_id: str, chain: Sequence[bytes], session: str | None, now: float
    ) -> list[Displaced]:
        """The live sessions whose pinned slot on `replica_id` a request with prompt
        `chain` (a turn of `session`, if given) would take, as the engine hands out slots:
        - with no unpinned slot free, an idle pinned slot if any: the least recent such
          session's, at once;
        - else, with none free at all, it waits for the next slot freed, as likely a
          session's as any other;
        - and a turn of a session new there, where every pin is taken, unpins the least
          recent session once done, whichever slot it ran in.
        A replica that `spills` keeps a pinned conversation whose slot is taken in memory
        (as long as its store holds it: the replica's reports say when not), and its
        session's next turn there loads it back: only the unpinning costs it."""
        view = self.replica(replica_id)
        pinned = self.sessions.pinned(replica_id, view.slots)
        mine = any(s == session for s, _ in pinned)
        others = [(s, p) for s, p in pinned if s != session]
        if not others:
            return []
        chances: dict[str, tuple[SessionPlace, float]] = {}
        unpinned_busy = view.ongoing - sum(p.turns_in_flight for _, p in pinned)
        if unpinned_busy >= view.slots - len(pinned):
            idle = [(s, p) for s, p in others if not p.turns_in_flight]
            if idle:  # its slot is taken at once: that frees a pin too
                s, p = idle[-1]
                recompute = 0.0 if view.spills else self._recompute(view, p, chain, now)
                return [Displaced(s, 1.0, recompute, at_once=True)]
            if not view.spills:
                for s, p in others:
                    chances[s] = (p, 1.0 / max(1, view.ongoing))
        if session is not None and not mine and len(pinned) >= pinnable(view.slots):
            s, p = others[-1]
            chances[s] = (p, 1.0)
        return [
            Displaced(s, chance, self._recompute(view, p, chain, now))
            for s, (p, chance) in chances.items()
        ]

    def _recompute(
        self, view: ReplicaView, place: SessionPlace, taker: Sequence[bytes], now: float
    ) -> float:
        """Chunks a session's next turn computes again once its slot is gone: its
        conversation, less what stays cached of it — in the prompt that took its slot,
        in another slot, or on the shared disk; nothing if it is not coming back."""
        if not self.sessions.live(place, now):
            return 0.0
        conversation = list(place.chain)  # unpacked once: it is read chunk by chunk below
        kept = max(
            shared_chunks(conversation, taker),
            view.resident(conversation, besides=conversation),
            self._on_disk(conversation) * self.disk_weight if view.shared_cache else 0,
        )
        return max(0.0, len(conversation) - kept)

    def _pinned_tails(self, replica_id: str) -> set[bytes]:
        view = self.replica(replica_id)
        pinned = self.sessions.pinned(replica_id, view.slots)
        return {p.chain[-1] for _, p in pinned if p.chain}

    def least_recently_routed(self, candidates: Sequence[str]) -> list[str]:
        return sorted(candidates, key=lambda r: self.replica(r).last_routed)

    def routed(
        self,
        replica_id: str,
        text: str,
        session: str | None = None,
        request: Hashable | None = None,
        reported_as: str | None = None,
    ) -> None:
        """Record that a request went to `replica_id`: its prompt will be in that
        replica's slots (until a report naming it finished, as `reported_as`, says
        otherwise), its work in flight there until `completed(replica_id, request)`,
        its prefix homed there if it had no home, any session whose pinned slot it takes
        no longer kept there, and its session lives there from now on."""
        view = self.replica(replica_id)
        now = self._clock()
        self._routings += 1
        view.last_routed = self._routings
        chain = prefix_chain(text, self.chunk_chars)
        for displaced in self._displaced(replica_id, chain, session, now):
            if displaced.at_once:
                self._lose(displaced.session, set_aside=view.spills)
        cached = self._cached(view, chain, self._on_disk(chain))
        work = Work(chain, len(chain) - cached + DECODE_CHUNKS, session, sent=now)
        key = request if request is not None else ("unnamed", self._routings)
        for forgotten in view.backlog.add(key, work, now):
            self.sessions.turn_over(forgotten.session, now)
        if session is not None:
            self.sessions.turn(session, replica_id, chain, now)
        if chain:
            view.hold(chain, self._pinned_tails(replica_id))
            view.unreported.append(Unreported(chain, reported_as, key))
            del view.unreported[:-UNREPORTED_MOST]
            self.homes.claim(chain, replica_id)

    def _lose(self, session: str, set_aside: bool = False) -> None:
        """A request took `session`'s pinned slot: its conversation left that replica,
        or, `set_aside`, left the slot for the engine's memory there (`spills`)."""
        place = self.sessions.get(session)
        if place is None:
            return
        if set_aside:
            place.set_aside = True
        else:
            place.kept = False
        if place.chain:
            view = self.replica(place.replica)
            view.drop(place.chain)
            view.unreported = [u for u in view.unreported if u.chain[-1] != place.chain[-1]]

    def completed(self, replica_id: str, request: Hashable) -> None:
        """The request finished: its work leaves the replica's backlog, its prompt stays in
        a slot there."""
        self._completions_seen = True
        now = self._clock()
        view = self.replicas.get(replica_id)
        work = view.backlog.complete(request, now) if view is not None else None
        if view is not None and work is not None:
            self.sessions.turn_over(work.session, now)
            view.hold(work.chain, self._pinned_tails(replica_id))
