"""The fleet router's decisions, as pure logic: no Ray, no model."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reame_core.fleet.affinity import (
    CHUNK_CHARS,
    TURN_PAD,
    UNKNOWN_REQUEST_CHUNKS,
    UNREPORTED_REPORTS,
    FleetAffinity,
    PrefixSet,
    ReplicaView,
    RoutingStats,
    best_first,
    matched_chunks,
    prefix_chain,
    shared_chunks,
    turn_aligned,
)
from reame_core.fleet.backlog import Backlog, Work
from reame_core.fleet.forwarding import forwarded, routing_text
from reame_core.fleet.replica import ServedPrefixes
from reame_core.fleet.sessions import (
    RETURN_FACTOR,
    RETURN_FLOOR,
    SESSION_TTL,
    PackedChain,
    SessionBook,
)

SYSTEM_A = "You extract invoice fields as JSON. " * 40
SYSTEM_B = "You classify support tickets by urgency. " * 40


class Clock:
    """Time that moves only when a test says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fleet(*replicas: str, slots: int = 4, **options: object) -> FleetAffinity:
    options.setdefault("clock", Clock())
    affinity = FleetAffinity(rng=random.Random(7), **options)  # type: ignore[arg-type]
    for replica in replicas:
        affinity.observe(replica, RoutingStats(slots=slots, serial=1))
    return affinity


def settle(affinity: FleetAffinity) -> None:
    """Every request in flight has finished."""
    for replica in affinity.replicas:
        affinity.set_queue(replica, 0)


def test_prompts_sharing_a_beginning_share_the_chain_up_to_where_they_part() -> None:
    a = prefix_chain(SYSTEM_A + "Invoice 1")
    b = prefix_chain(SYSTEM_A + "Invoice 2, a longer one")
    shared = len(SYSTEM_A) // CHUNK_CHARS
    assert a[:shared] == b[:shared]
    assert prefix_chain("x" * (CHUNK_CHARS - 1)) == []


def test_a_packed_chain_reads_as_the_list_it_packs() -> None:
    chain = prefix_chain(SYSTEM_A + "Invoice 1")
    packed = PackedChain(chain)
    assert len(packed) == len(chain) and list(packed) == chain and packed == chain
    assert packed[0] == chain[0] and packed[-1] == chain[-1] and packed[2:5] == chain[2:5]
    assert shared_chunks(packed, chain) == len(chain)
    assert len(PackedChain([])) == 0 and list(PackedChain([])) == []
    with pytest.raises(IndexError):
        packed[len(chain)]
    with pytest.raises(ValueError):
        PackedChain([b"12345678", b"123"])


# Prompts over a small alphabet of chunks, so that they share beginnings often.
_prompts = st.lists(st.text(alphabet="ab", min_size=0, max_size=6), min_size=0, max_size=6)


@given(held=_prompts, in_flight=_prompts, asked=st.text(alphabet="ab", max_size=6),
       besides=st.one_of(st.none(), st.integers(0, 11)))  # fmt: skip
@settings(max_examples=300, deadline=None)
def test_resident_is_the_deepest_prefix_any_other_prompt_shares(
    held: list[str], in_flight: list[str], asked: str, besides: int | None
) -> None:
    """`ReplicaView.resident` answers from an index of the prompts held and in flight;
    checked against its definition, prompt by prompt, with copies of `besides` skipped."""
    chains = [prefix_chain(t, chunk_chars=1) for t in held + in_flight]
    view = ReplicaView(slots=len(held) or 1, held=chains[: len(held)])
    for i, chain in enumerate(chains[len(held) :]):
        view.backlog.add(("r", i), Work(chain, 1.0), now=0.0)
    skip = chains[besides] if besides is not None and besides < len(chains) else []
    chain = prefix_chain(asked, chunk_chars=1)
    expected = max(
        (shared_chunks(chain, p) for p in chains if p and (not skip or p[-1] != skip[-1])),
        default=0,
    )
    assert view.resident(chain, besides=skip) == expected
    view.held = view.held[:1]  # a change the index must notice
    kept = view.held + [w.chain for w in view.backlog.in_flight.values()]
    expected = max(
        (shared_chunks(chain, p) for p in kept if p and (not skip or p[-1] != skip[-1])),
        default=0,
    )
    assert view.resident(chain, besides=skip) == expected


def test_chain_differs_from_the_first_differing_chunk_on() -> None:
    a = prefix_chain("a" * 300 + "b" * 300)
    b = prefix_chain("a" * 300 + "c" * 300)
    assert a[:2] == b[:2]
    assert a[2] != b[2] and a[3] != b[3]


def test_matched_chunks_finds_the_deepest_held_chunk() -> None:
    chain = prefix_chain(SYSTEM_A)
    assert matched_chunks(chain, set(chain[:5])) == 5
    assert matched_chunks(chain, set()) == 0
    assert matched_chunks(chain, set(chain)) == len(chain)


def test_prefix_set_forgets_the_least_recently_used_first_deepest_chunks_first() -> None:
    held = PrefixSet(capacity=3)
    held.add([b"a", b"b"])  # b extends a: a prompt sharing b shares a
    held.add([b"c"])
    held.add([b"a"])
    held.add([b"d"])
    assert b"b" not in held and b"a" in held and b"c" in held and b"d" in held


def test_a_request_goes_to_the_replica_holding_its_prefix() -> None:
    affinity = fleet("r1", "r2")
    affinity.routed("r2", SYSTEM_A + "Invoice 1")
    affinity.routed("r1", SYSTEM_B + "Ticket 1")
    choice = affinity.rank(["r1", "r2"], SYSTEM_A + "Invoice 2")
    assert choice.ranked[0] == "r2"
    assert choice.reason == "prefix"
    assert choice.reused_chars >= len(SYSTEM_A) - CHUNK_CHARS


def test_new_prefixes_spread_over_the_fleet() -> None:
    affinity = fleet("r1", "r2")
    first = affinity.rank(["r1", "r2"], SYSTEM_A).ranked[0]
    affinity.routed(first, SYSTEM_A)
    second = affinity.rank(["r1", "r2"], SYSTEM_B)
    assert second.reason == "spread"
    assert second.ranked[0] != first


def test_prompts_too_short_to_cache_go_round_the_fleet() -> None:
    affinity = fleet("r1", "r2", "r3")
    affinity.routed("r1", SYSTEM_A)  # r1 holds a prefix, the others none
    settle(affinity)
    chosen = []
    for _ in range(6):
        replica = affinity.rank(["r1", "r2", "r3"], "Hi.").ranked[0]
        affinity.routed(replica, "Hi.")
        chosen.append(replica)
    assert chosen == ["r2", "r3", "r1", "r2", "r3", "r1"]


def test_a_session_stays_on_its_replica_whatever_the_prefixes() -> None:
    affinity = fleet("r1", "r2")
    affinity.routed("r1", SYSTEM_A, session="chat-7")
    affinity.routed("r2", SYSTEM_B + "turn 2")
    choice = affinity.rank(["r1", "r2"], SYSTEM_B + "turn 2", session="chat-7")
    assert choice.ranked[0] == "r1" and choice.reason == "session"


def test_a_session_moves_when_its_replica_dies() -> None:
    affinity = fleet("r1", "r2")
    affinity.routed("r1", SYSTEM_A, session="chat-7")
    affinity.forget("r1")
    choice = affinity.rank(["r2"], SYSTEM_A, session="chat-7")
    assert choice.ranked == ["r2"] and choice.reason != "session"
    assert "chat-7" not in affinity.sessions


def test_replicas_that_left_are_forgotten_with_their_sessions() -> None:
    affinity = fleet("r1", "r2")
    affinity.routed("r1", SYSTEM_A, session="s")
    affinity.keep_only(["r2"])
    assert set(affinity.replicas) == {"r2"} and not affinity.sessions


def test_a_cached_prefix_is_worth_waiting_for_only_if_it_is_long() -> None:
    long_prompt, short_prompt = SYSTEM_A * 3, "y" * 640  # 33 chunks, 5 chunks
    affinity = fleet("r1", "r2")
    affinity.routed("r1", long_prompt, request="a")
    affinity.routed("r1", short_prompt + "x" * 200, request="b")
    affinity.completed("r1", "a")
    affinity.completed("r1", "b")
    affinity.routed("r1", "z" * 2600, request="cold")  # 20 chunks to compute, in flight
    # Waiting behind them beats computing 33 chunks elsewhere, not computing 5.
    assert affinity.rank(["r1", "r2"], long_prompt + "more").ranked[0] == "r1"
    assert affinity.rank(["r1", "r2"], short_prompt + "more").ranked[0] == "r2"


def test_a_hit_waits_behind_requests_that_hit_too() -> None:
    affinity = fleet("r1", "r2")
    affinity.routed("r1", SYSTEM_A + "Invoice 1", request="first")
    affinity.completed("r1", "first")
    for n in range(3):  # three more invoices in flight on r1, each computing a chunk
        affinity.routed("r1", SYSTEM_A + f"Invoice {n}", request=n)
    choice = affinity.rank(["r1", "r2"], SYSTEM_A + "Invoice 9")
    assert choice.ranked[0] == "r1" and choice.reason == "prefix"


def test_a_long_queue_outweighs_a_cached_prefix() -> None:
    affinity = fleet("r1", "r2")
    affinity.routed("r1", SYSTEM_A * 4)
    affinity.observe("r1", RoutingStats(queued=6, running=4, slots=4, serial=3))
    choice = affinity.rank(["r1", "r2"], SYSTEM_A * 4 + "more")
    assert choice.reason == "balance"
    assert choice.ranked[0] == "r2"


def test_an_idle_replica_that_can_restore_beats_a_busy_one_holding_the_prefix() -> None:
    affinity = FleetAffinity(rng=random.Random(1))
    prompt = SYSTEM_A * 3  # 33 chunks: restoring them is worth 29.7, 3.3 less than holding
    chain = prefix_chain(prompt)
    affinity.observe("r1", RoutingStats(slots=4, shared_cache=True, serial=1))
    affinity.observe(
        "r1",
        RoutingStats(
            running=4, slots=4, shared_cache=True, resident=[chain], stored=chain, serial=2
        ),
    )
    affinity.observe("r2", RoutingStats(slots=4, shared_cache=True, serial=1))
    choice = affinity.rank(["r1", "r2"], prompt + "more")
    assert choice.ranked[0] == "r2" and choice.reason == "disk"


def test_non_completions_go_round_the_fleet() -> None:
    affinity = fleet("r1", "r2")
    order = affinity.least_recently_routed(["r1", "r2"])
    affinity.routed(order[0], "")
    assert affinity.least_recently_routed(["r1", "r2"])[0] == order[1]


def test_imbalanced_queues_fall_back_to_power_of_two_choices() -> None:
    affinity = fleet("r1", "r2", "r3", "r4", imbalance=2)
    affinity.observe("r1", RoutingStats(queued=5, running=4, slots=4, serial=2))
    seen = set()
    for _ in range(40):
        choice = affinity.rank(["r1", "r2", "r3", "r4"], SYSTEM_A)
        assert choice.reason == "balance"
        assert choice.ranked[0] != "r1"
        seen.add(choice.ranked[0])
    assert len(seen) > 1  # two at random each time, not always the same


def test_a_prefix_on_the_shared_disk_counts_for_every_replica_that_shares_it() -> None:
    affinity = FleetAffinity(rng=random.Random(1))
    affinity.observe("r1", RoutingStats(slots=4, shared_cache=True, serial=1))
    affinity.observe("r2", RoutingStats(slots=4, shared_cache=True, serial=1))
    affinity.observe("r3", RoutingStats(slots=4, shared_cache=False, serial=1))
    # r1 computed it and wrote it to the shared disk; r1 is busy now.
    affinity.observe(
        "r1",
        RoutingStats(
            queued=1, running=4, slots=4, shared_cache=True,
            stored=prefix_chain(SYSTEM_A), serial=2,
        ),
    )  # fmt: skip
    choice = affinity.rank(["r1", "r2", "r3"], SYSTEM_A + "Invoice 9")
    assert choice.ranked[0] == "r2"
    assert choice.reason == "disk"
    assert choice.ranked.index("r2") < choice.ranked.index("r3")


def test_a_match_on_disk_too_short_to_restore_counts_for_nothing() -> None:
    affinity = fleet("r1", "r2", slots=2)
    friendly = ("system", "You are a friendly assistant.")
    conversation = chat_text(friendly, ("user", "Bake bread? " * 40))
    # A session's conversation on disk: a new chat shares only its padded first turn.
    affinity.observe(
        "r1", RoutingStats(slots=2, serial=2, shared_cache=True, stored=prefix_chain(conversation))
    )
    affinity.observe("r2", RoutingStats(slots=2, serial=2, shared_cache=True))
    affinity.routed("r2", conversation, request=1)
    affinity.completed("r2", 1)
    settle(affinity)
    choice = affinity.rank(["r1", "r2"], chat_text(friendly, ("user", "Grow lettuce? " * 40)))
    assert choice.ranked[0] == "r2" and choice.reason == "prefix"
    assert choice.costs["r1"] - choice.costs["r2"] >= 1.0


def test_a_resident_prefix_beats_the_same_prefix_on_disk() -> None:
    affinity = FleetAffinity(rng=random.Random(1))
    chain = prefix_chain(SYSTEM_A)
    for replica in ("r1", "r2"):
        affinity.observe(replica, RoutingStats(slots=4, shared_cache=True, serial=1))
    affinity.observe(
        "r2", RoutingStats(slots=4, shared_cache=True, resident=[chain], stored=chain, serial=2)
    )
    for _ in range(10):
        assert affinity.rank(["r1", "r2"], SYSTEM_A + "q").ranked[0] == "r2"


def test_a_report_replaces_guesses_but_keeps_requests_routed_since() -> None:
    affinity = fleet("r1")
    affinity.routed("r1", SYSTEM_A, request=1)
    affinity.completed("r1", 1)
    view = affinity.replica("r1")
    affinity.observe("r1", RoutingStats(slots=4, serial=2))  # may predate the request
    assert view.resident(prefix_chain(SYSTEM_A)) == len(prefix_chain(SYSTEM_A))
    affinity.observe("r1", RoutingStats(slots=4, serial=3))  # evicted since
    assert view.resident(prefix_chain(SYSTEM_A)) == 0


def test_a_requests_prompt_stays_until_a_report_names_the_request_finished() -> None:
    # Reports reach the router seconds after the replica takes them: one taken while the
    # request ran may arrive after it completed, and after another report.
    affinity = fleet("r1", "r2", slots=2)
    conversation = SYSTEM_A + "user: first question"
    affinity.routed("r1", conversation, session="chat", request=1, reported_as="f-1")
    affinity.observe("r1", RoutingStats(slots=2, serial=2))  # taken before it ran
    affinity.completed("r1", 1)
    affinity.observe("r1", RoutingStats(slots=2, serial=3, finished=["f-0"]))  # while it ran
    next_turn = conversation + "assistant: ok\nuser: more"
    assert affinity.rank(["r1", "r2"], next_turn, "chat").reason == "session"
    # A report taken after it finished is believed: the slot was taken since.
    affinity.observe("r1", RoutingStats(slots=2, serial=4, finished=["f-0", "f-1"]))
    assert affinity.replica("r1").resident(prefix_chain(conversation)) == 0
    assert affinity.rank(["r1", "r2"], next_turn, "chat").reason != "session"


def test_a_sessions_prompt_outlives_requests_routed_after_it_until_reported() -> None:
    # Under a backlog more requests are routed behind the session's turn than the replica
    # has slots; a report taken while the turn ran still arrives after it completed.
    affinity = fleet("r1", "r2", slots=2)
    conversation = SYSTEM_A + "user: first question"
    affinity.routed("r1", conversation, session="chat", request=1, reported_as="f-1")
    for n in (2, 3, 4):
        affinity.routed("r1", f"prompt {n} " * 40, request=n, reported_as=f"f-{n}")
    affinity.completed("r1", 1)
    affinity.observe("r1", RoutingStats(slots=2, serial=2))
    next_turn = conversation + "assistant: ok\nuser: more"
    assert affinity.rank(["r1", "r2"], next_turn, "chat").reason == "session"


def test_a_prompt_no_report_names_counts_only_a_few_reports_after_its_request_ended() -> None:
    # Cancelled before the replica ran it: no report will name it.
    affinity = fleet("r1", slots=2)
    affinity.routed("r1", SYSTEM_A, request=1, reported_as="f-1")
    view = affinity.replica("r1")
    for serial in range(2, 5):  # in flight: kept whatever the reports say
        affinity.observe("r1", RoutingStats(slots=2, serial=serial))
    assert len(view.unreported) == 1
    affinity.completed("r1", 1)
    kept = []
    for serial in range(5, 6 + UNREPORTED_REPORTS):
        affinity.observe("r1", RoutingStats(slots=2, serial=serial))
        kept.append(view.resident(prefix_chain(SYSTEM_A)) > 0)
    assert kept == [True] * UNREPORTED_REPORTS + [False]
    assert view.unreported == []


def test_a_report_older_than_one_seen_is_ignored() -> None:
    affinity = fleet("r1", slots=2)
    affinity.observe("r1", RoutingStats(slots=2, serial=5, resident=[prefix_chain(SYSTEM_A)]))
    affinity.observe("r1", RoutingStats(slots=2, serial=4))  # taken earlier, arrived late
    assert affinity.replica("r1").resident(prefix_chain(SYSTEM_A)) > 0


def test_a_replica_holds_only_as_many_prompts_as_it_has_slots() -> None:
    affinity = fleet("r1", slots=2)
    for prompt in (SYSTEM_A, SYSTEM_B, "C" * 1000):
        affinity.routed("r1", prompt)
    settle(affinity)
    view = affinity.replica("r1")
    assert view.resident(prefix_chain(SYSTEM_A)) == 0
    assert view.resident(prefix_chain(SYSTEM_B)) > 0


def test_a_later_turn_replaces_the_earlier_one_in_its_slot() -> None:
    affinity = fleet("r1", slots=2)
    affinity.routed("r1", SYSTEM_A)
    affinity.routed("r1", SYSTEM_A + "user: hello, and a question long enough to fill a chunk")
    affinity.routed("r1", SYSTEM_B)
    settle(affinity)
    assert affinity.replica("r1").resident(prefix_chain(SYSTEM_A)) > 0


def test_a_prefix_keeps_going_home_after_reports_no_longer_list_it() -> None:
    affinity = fleet("r1", "r2", slots=2)
    affinity.routed("r1", SYSTEM_A)
    affinity.routed("r2", SYSTEM_B)
    settle(affinity)
    for serial in (2, 3):  # both replicas' slots have moved on to other prompts
        for replica in ("r1", "r2"):
            others = [prefix_chain(f"{replica} {serial} {n} " * 30) for n in range(2)]
            affinity.observe(replica, RoutingStats(slots=2, resident=others, serial=serial))
    for _ in range(5):
        choice = affinity.rank(["r1", "r2"], SYSTEM_A + "Invoice 3")
        assert choice.ranked[0] == "r1" and choice.reason == "home"
        assert affinity.rank(["r1", "r2"], SYSTEM_B + "Ticket 3").ranked[0] == "r2"


def test_a_prefix_sent_elsewhere_while_its_home_was_busy_keeps_its_home() -> None:
    affinity = fleet("r1", "r2", slots=2)
    affinity.routed("r1", SYSTEM_A, request="a")
    settle(affinity)
    for serial in (2, 3):
        affinity.observe("r1", RoutingStats(slots=2, resident=[], serial=serial))
    affinity.routed("r1", "Q" * 1500, request="cold")  # r1 computes another long prompt
    choice = affinity.rank(["r1", "r2"], SYSTEM_A + "Invoice 4")
    assert choice.ranked[0] == "r2"  # not worth waiting for: r1 must compute it anyway
    affinity.routed("r2", SYSTEM_A + "Invoice 4", request="spilled")
    settle(affinity)
    for serial in (2, 3):
        affinity.observe("r2", RoutingStats(slots=2, resident=[], serial=serial))
    assert affinity.rank(["r1", "r2"], SYSTEM_A + "Invoice 5").ranked[0] == "r1"


def test_new_prefixes_get_the_replica_home_to_the_fewest() -> None:
    affinity = fleet("r1", "r2", "r3")
    affinity.routed("r1", SYSTEM_A)
    affinity.routed("r2", SYSTEM_B)
    settle(affinity)
    choice = affinity.rank(["r1", "r2", "r3"], "A new task entirely. " * 30)
    assert choice.ranked[0] == "r3" and choice.reason == "spread"


def test_a_home_is_not_worth_it_where_every_replica_restores_from_disk() -> None:
    affinity = FleetAffinity(rng=random.Random(1))
    chain = prefix_chain(SYSTEM_A)
    for replica in ("r1", "r2"):
        affinity.observe(replica, RoutingStats(slots=2, shared_cache=True, serial=1))
    affinity.routed("r1", SYSTEM_A, request="first")
    settle(affinity)
    for serial in (2, 3):  # stored on the shared disk, and no longer in a slot of r1
        affinity.observe(
            "r1", RoutingStats(slots=2, shared_cache=True, stored=chain, serial=serial)
        )
    affinity.routed("r1", "Q" * 400, request="other")  # a short request in flight on r1
    choice = affinity.rank(["r1", "r2"], SYSTEM_A + "Invoice 5")
    assert choice.ranked[0] == "r2" and choice.reason == "disk"


def test_balance_beats_a_home_when_its_replica_is_far_behind() -> None:
    affinity = fleet("r1", "r2", slots=2)
    affinity.routed("r1", SYSTEM_A)
    settle(affinity)
    affinity.observe("r1", RoutingStats(slots=2, queued=4, running=2, serial=2))
    choice = affinity.rank(["r1", "r2"], SYSTEM_A + "Invoice 6")
    assert choice.reason == "balance" and choice.ranked[0] == "r2"


def test_a_session_sticks_to_its_replica_over_home_and_backlog() -> None:
    affinity = fleet("r1", "r2", slots=2)
    affinity.routed("r2", SYSTEM_B)  # SYSTEM_B's home is r2
    affinity.routed("r1", SYSTEM_B + "user: first turn", session="chat-9")
    affinity.routed("r1", "Q" * 1500)  # and r1 is busy computing something else
    choice = affinity.rank(["r1", "r2"], SYSTEM_B + "user: first turn, second", "chat-9")
    assert choice.ranked == ["r1", "r2"] and choice.reason == "session"


def test_stats_cross_process_boundaries_as_plain_data() -> None:
    stats = RoutingStats(
        1,
        2,
        4,
        [prefix_chain(SYSTEM_A)],
        prefix_chain(SYSTEM_B),
        True,
        9,
        {"chat": (3, False)},
        ["f-1", "f-2"],
        True,
    )
    data = json.loads(json.dumps(stats.as_dict()))
    assert RoutingStats.from_dict(data) == stats


def test_a_replica_reports_what_its_slots_hold_and_what_it_stored() -> None:
    served = ServedPrefixes(slots=2, shared_cache=True)
    longer = SYSTEM_A + "and the next turn of the conversation " * 5
    served.served(SYSTEM_A)
    served.served(longer)
    served.served(SYSTEM_B)
    served.served("short")
    report = served.report(queued=0, running=1)
    assert report.slots == 2 and report.running == 1
    # The longer turn replaced the shorter one; the short prompt has no chunk to report.
    assert report.resident == [prefix_chain(longer), prefix_chain(SYSTEM_B)]
    assert matched_chunks(prefix_chain(SYSTEM_A), set(report.stored)) == len(prefix_chain(SYSTEM_A))
    assert served.report(0, 0).serial > report.serial


def test_a_replica_reports_as_stored_only_what_the_disk_cache_keeps() -> None:
    served = ServedPrefixes(slots=2, shared_cache=True)
    served.served(SYSTEM_A + "the question", stored_chars=len(SYSTEM_A))
    report = served.report(0, 0)
    assert len(report.stored) == len(SYSTEM_A) // CHUNK_CHARS
    assert report.resident == [prefix_chain(SYSTEM_A + "the question")]


def test_a_replica_without_a_shared_cache_reports_nothing_stored() -> None:
    served = ServedPrefixes(slots=2, shared_cache=False)
    served.served(SYSTEM_A)
    assert served.report(0, 0).stored == []


def test_routing_text_reads_messages_in_order_with_their_roles() -> None:
    body = json.dumps(
        {
            "messages": [
                {"role": "system", "content": "S"},
                {"role": "user", "content": [{"type": "text", "text": "U"}]},
            ],
            "session_id": "abc",
        }
    ).encode()
    routed = routing_text(body)
    assert (routed.text, routed.session) == ("system\nS\nuser\nU\n", "abc")
    assert routed.stored_chars == routed.first_turn == len("system\nS\n")  # the first turn
    # Opening with the user, a chat opens with the template's default system turn.
    routed = routing_text(json.dumps({"messages": [{"role": "user", "content": "U"}]}).encode())
    assert (routed.text, routed.stored_chars, routed.first_turn) == ("user\nU\n", 0, 0)
    routed = routing_text(b'{"prompt": ["first", "second"]}')
    assert (routed.text, routed.session, routed.stored_chars) == ("first", None, 5)
    assert routed.first_turn is None
    assert routing_text(b"not json").text == ""


def chat_text(*messages: tuple[str, str]) -> str:
    """A chat's routing text as Reame's router reads it."""
    body = json.dumps({"messages": [{"role": r, "content": c} for r, c in messages]})
    return forwarded("POST", "/v1/chat/completions", b"", [], body.encode()).routed_text


def test_chats_share_a_chunk_for_a_short_first_turn_they_share() -> None:
    friendly = ("system", "You are a friendly assistant.")
    first, second = ("user", "Bake bread? " * 20), ("user", "Grow lettuce? " * 20)
    [a, *_], [b, *_] = (
        prefix_chain(chat_text(friendly, first)),
        prefix_chain(chat_text(friendly, second)),
    )
    assert a == b
    [a, *_], [b, *_] = prefix_chain(chat_text(first)), prefix_chain(chat_text(second))
    assert a == b  # the template's default system turn
    assert prefix_chain(chat_text(friendly, first))[0] != a
    # A first turn of a chunk or more, and a completion, are chained as they are.
    long_system = ("system", SYSTEM_A)
    assert chat_text(long_system, first) == f"system\n{SYSTEM_A}\nuser\n{first[1]}\n"
    body = json.dumps({"prompt": "Once upon a time"}).encode()
    assert forwarded("POST", "/v1/completions", b"", [], body).routed_text == "Once upon a time"
    assert turn_aligned("system\nS\nuser\nU\n", 9, chunk_chars=16) == (
        "system\nS\n" + TURN_PAD * 7 + "user\nU\n"
    )


def test_a_chat_opening_with_the_user_goes_where_another_such_chat_is_held() -> None:
    affinity = fleet("r1", "r2", slots=2)
    rewrite = chat_text(("user", "Fix the spelling in this email. " * 8))
    affinity.routed("r1", chat_text(("system", SYSTEM_A), ("user", "the invoice")), request=1)
    affinity.routed("r2", rewrite, request=2)
    affinity.completed("r1", 1)
    affinity.completed("r2", 2)
    settle(affinity)
    another = chat_text(("user", "Add type hints to this function. " * 8))
    choice = affinity.rank(["r1", "r2"], another)
    assert choice.ranked[0] == "r2" and choice.reason == "prefix"
    assert choice.reused_chars == CHUNK_CHARS


def test_forwarded_takes_the_session_header_before_the_body_field() -> None:
    body = json.dumps({"prompt": "hello", "session_id": "body"}).encode()
    request = forwarded("POST", "/v1/completions", b"", [(b"X-Session-ID", b"head")], body)
    assert request.session == "head" and request.prompt == "hello" and request.routable
    health = forwarded("GET", "/health", b"", [], b"")
    assert not health.routable and health.prompt == "/health"


def test_a_request_counts_its_own_compute_once() -> None:
    affinity = fleet("r1", "r2")
    affinity.routed("r1", SYSTEM_A, request="first")
    affinity.completed("r1", "first")
    affinity.routed("r1", "z" * 2560, request="cold")  # 20 chunks to compute, in flight
    # On r1: 21 chunks ahead, 1 of its own, less half of its 11 homed chunks; on r2: its
    # 11 chunks and an answer. Counting its own twice made waiting on r1 look cheaper.
    choice = affinity.rank(["r1", "r2"], SYSTEM_A + "Invoice 2")
    assert choice.ranked[0] == "r2"


def test_work_ahead_drains_at_the_rate_the_replica_was_measured_at() -> None:
    clock = Clock()
    affinity = fleet("r1", "r2", clock=clock)
    affinity.routed("r1", "y" * 512, request="warm")  # 4 chunks and an answer: 5
    clock.now += 0.5
    affinity.completed("r1", "warm")  # 10 chunks a second
    affinity.routed("r1", "z" * 2560, request="cold")  # 21 chunks of work
    clock.now += 2.0  # about 1 left
    choice = affinity.rank(["r1", "r2"], "y" * 512 + "more")
    assert choice.ranked[0] == "r1" and choice.reason == "prefix"


def test_nothing_drains_before_a_completion_was_timed() -> None:
    backlog = Backlog()
    backlog.add("a", Work([], 10.0), now=0.0)
    assert backlog.remaining(now=60.0) == 10.0
    backlog.add("b", Work([], 6.0), now=60.0)
    backlog.complete("a", now=100.0)  # 10 chunks done in 100 s of work
    assert backlog.rate == 0.1
    assert backlog.remaining(now=120.0) == 4.0


def test_a_request_keeps_off_an_idle_sessions_pinned_slot() -> None:
    affinity = fleet("r1", "r2", slots=2)
    conversation = SYSTEM_A + "user: " + "a long message of the session " * 60
    affinity.routed("r1", conversation, session="chat", request="turn 1")
    affinity.completed("r1", "turn 1")  # pinned, idle, its next turn to come
    affinity.routed("r1", "q" * 300, request="x")  # r1's other slot is busy
    affinity.routed("r2", "p" * 800, request="y")  # r2 has more work, and a free slot
    choice = affinity.rank(["r1", "r2"], "Hello there. " * 30)
    assert choice.ranked[0] == "r2"  # on r1 it would take the session's slot


def test_a_request_sent_onto_an_idle_sessions_slot_costs_the_session_its_place() -> None:
    affinity = fleet("r1", "r2", slots=2)
    conversation = SYSTEM_A + "user: first question"
    affinity.routed("r1", conversation, session="chat", request="turn 1")
    affinity.completed("r1", "turn 1")
    affinity.routed("r1", "q" * 300, request="x")
    affinity.routed("r1", "Another prompt entirely. " * 20, request="takes the pinned slot")
    choice = affinity.rank(["r1", "r2"], conversation + "assistant: ok\nuser: more", "chat")
    assert choice.reason != "session"
    assert choice.ranked[0] == "r2"  # its conversation is nowhere now; r1 is busy


def test_taking_a_slot_whose_conversation_the_engine_keeps_costs_the_session_nothing() -> None:
    # The engine copies a pinned conversation out before another request takes its slot,
    # and loads it back on the session's next turn there (`spills`).
    affinity = fleet("r1", "r2", slots=2)
    for replica in ("r1", "r2"):
        affinity.observe(replica, RoutingStats(slots=2, serial=2, spills=True))
    conversation = SYSTEM_A + "user: " + "a long message of the session " * 60
    affinity.routed("r1", conversation, session="chat", request="turn 1")
    affinity.completed("r1", "turn 1")
    prompt = SYSTEM_B + "user: hello"

    def extra(session: str | None = None) -> float:  # r1's cost beyond a one-shot's
        with_session = affinity.rank(["r1", "r2"], prompt, session=session).costs["r1"]
        return with_session - affinity.rank(["r1", "r2"], prompt).costs["r1"]

    # With r1's other slot free, a new session's turn would unpin "chat" once done, and an
    # unpinned slot is taken without a copy: that costs the conversation.
    assert extra("new") > 0
    affinity.routed("r1", "q" * 300, request="x")  # now r1's other slot is busy
    assert extra("new") == 0  # it would take the pinned slot at once: a copy is kept
    affinity.routed("r1", prompt, request="takes the pinned slot")
    next_turn = conversation + "assistant: ok\nuser: more"
    assert affinity.rank(["r1", "r2"], next_turn, "chat").ranked[0] == "r1"
    assert affinity.rank(["r1", "r2"], next_turn, "chat").reason == "session"
    # Its slot no longer pinned, a new session's turn unpins nothing.
    affinity.completed("r1", "x")
    assert extra("new") == 0
    assert affinity.replica("r1").resident(prefix_chain(conversation)) == 0  # not in a slot
    # Until the engine says its memory dropped it.
    affinity.observe(
        "r1", RoutingStats(slots=2, serial=3, spills=True, sessions={"chat": (1, False)})
    )
    assert affinity.rank(["r1", "r2"], next_turn, "chat").reason != "session"


def test_a_new_session_goes_where_it_unpins_no_live_conversation() -> None:
    affinity = fleet("r1", "r2", slots=2)
    conversation = SYSTEM_B + "user: " + "a long message of the session " * 120
    affinity.routed("r1", conversation, session="old", request="turn 1")
    affinity.completed("r1", "turn 1")
    # SYSTEM_B is resident on r1, and homed there; but r1 pins one session, and a new
    # one's turn would unpin the old conversation, 28 chunks to compute again.
    choice = affinity.rank(["r1", "r2"], SYSTEM_B + "user: hello", session="new")
    assert choice.ranked[0] == "r2"
    affinity.routed("r2", SYSTEM_B + "user: hello", session="new")
    assert affinity.rank(["r1", "r2"], conversation + "more", session="old").reason == "session"


def test_a_session_idle_past_its_lifetime_protects_no_slot() -> None:
    clock = Clock()
    affinity = fleet("r1", "r2", slots=2, clock=clock)
    conversation = SYSTEM_A + "user: " + "a long message of the session " * 60
    affinity.routed("r1", conversation, session="chat", request="turn 1")
    affinity.completed("r1", "turn 1")
    affinity.routed("r1", "q" * 300, request="x")
    affinity.routed("r2", "p" * 800, request="y")
    clock.now += SESSION_TTL + 1
    assert affinity.rank(["r1", "r2"], "Hello there. " * 30).ranked[0] == "r1"


def test_a_pinned_conversation_stays_in_the_view_while_other_prompts_pass() -> None:
    affinity = fleet("r1", slots=2)
    conversation = SYSTEM_A + "user: first question"
    affinity.routed("r1", conversation, session="chat", request="turn 1")
    affinity.completed("r1", "turn 1")
    for n, prompt in enumerate((SYSTEM_B, "C" * 1000, "D" * 1000)):
        affinity.routed("r1", prompt, request=n)
        affinity.completed("r1", n)
    view = affinity.replica("r1")
    assert view.resident(prefix_chain(conversation)) == len(prefix_chain(conversation))
    assert view.resident(prefix_chain(SYSTEM_B)) == 0


def test_a_replica_pins_only_its_most_recent_sessions() -> None:
    book = SessionBook(ttl=60.0)
    for n, session in enumerate(("a", "b", "c")):
        book.turn(session, "r1", [bytes([n])], now=float(n))
        book.turn_over(session, now=float(n))
    assert [s for s, _ in book.pinned("r1", slots=4)] == ["c", "b"]
    assert book.live(book.places["b"], now=61.0) and not book.live(book.places["b"], now=61.5)


def test_a_session_unpinned_for_a_newer_one_is_not_pinned_again_when_that_ones_slot_goes() -> None:
    book = SessionBook()
    for n, session in enumerate(("a", "b", "c")):
        book.turn(session, "r1", [bytes([n])], now=float(n))
        book.turn_over(session, now=float(n))
    book.places["c"].kept = False  # a request took c's slot; the engine pins "b" alone
    assert [s for s, _ in book.pinned("r1", slots=4)] == ["b"]
    book.places["b"].set_aside = True  # and b's, kept in memory
    assert book.pinned("r1", slots=4) == []


def test_a_session_is_expected_back_by_its_own_rhythm() -> None:
    book = SessionBook(ttl=SESSION_TTL)
    # A pipeline: its turns follow each other within half a second, then it is done.
    for start in (0.0, 1.5, 3.0):
        book.turn("pipeline", "r1", [b"p"], now=start)
        book.turn_over("pipeline", now=start + 1.0)
    place = book.places["pipeline"]
    assert place.longest_wait == 0.5
    assert book.live(place, now=4.0 + RETURN_FLOOR)
    assert not book.live(place, now=4.0 + RETURN_FLOOR + 0.1)
    # A person who took 20 s to answer is given four times that.
    book.turn("person", "r1", [b"q"], now=0.0)
    book.turn_over("person", now=2.0)
    assert book.live(book.places["person"], now=2.0 + SESSION_TTL)  # no rhythm yet
    book.turn("person", "r1", [b"q"], now=22.0)
    book.turn_over("person", now=24.0)
    assert book.live(book.places["person"], now=24.0 + RETURN_FACTOR * 20.0)
    assert not book.live(book.places["person"], now=24.1 + RETURN_FACTOR * 20.0)


def test_a_finished_pipeline_no_longer_keeps_new_sessions_off_its_replica() -> None:
    clock = Clock()
    affinity = fleet("r1", "r2", slots=2, clock=clock)
    conversation = SYSTEM_B + "user: " + "a long message of the session " * 120
    for turn in range(3):  # back to back
        affinity.routed("r1", conversation + "more " * turn, session="old", request=turn)
        clock.now += 1.0
        affinity.completed("r1", turn)
    # r2 holds SYSTEM_B and works on it, a slot still free
    affinity.routed("r2", SYSTEM_B + "user: hi", request="x")
    new = SYSTEM_B + "user: hello"
    assert affinity.rank(["r1", "r2"], new, session="new").ranked[0] == "r2"
    clock.now += RETURN_FLOOR + 1.0  # "old" has stopped: its pin is worth nothing now
    assert affinity.rank(["r1", "r2"], new, session="new").ranked[0] == "r1"


def test_a_new_session_pays_for_the_pin_it_takes_where_it_must_wait_for_a_slot() -> None:
    affinity = fleet("r1", "r2", slots=2)
    conversation = SYSTEM_A + "user: " + "a long message of the session " * 60
    affinity.routed("r1", conversation, session="chat", request="turn")  # pinned, running
    affinity.routed("r1", "q" * 300, request="x")  # no slot free on r1
    prompt = SYSTEM_B + "user: hello"
    one_shot = affinity.rank(["r1", "r2"], prompt).costs["r1"]
    first_turn = affinity.rank(["r1", "r2"], prompt, session="new").costs["r1"]
    # Either may take the slot "chat" frees (one chance in two); the first turn of "new",
    # once done, also unpins "chat", its most recent session no longer.
    recompute = len(prefix_chain(conversation))
    assert first_turn - one_shot == recompute / 2


def test_a_replica_reports_its_pinned_conversation_while_other_prompts_pass() -> None:
    served = ServedPrefixes(slots=2, shared_cache=False)
    conversation = SYSTEM_A + "user: first question"
    served.served(conversation, session="chat")
    served.served(SYSTEM_B)
    served.served("C" * 1000)
    assert served.report(0, 0).resident == [prefix_chain(conversation), prefix_chain("C" * 1000)]


def test_a_stale_count_does_not_end_requests_once_completions_are_reported() -> None:
    affinity = fleet("r1", "r2")
    affinity.routed("r1", "warm " * 100, request="warm")
    affinity.completed("r1", "warm")  # Serve reports completions
    affinity.routed("r1", "z" * 2560, request="cold")  # 21 chunks of work
    affinity.set_queue("r1", 0)  # a count taken before the request arrived
    view = affinity.replica("r1")
    assert view.ahead(0.0) == 21.0 and view.others == 0
    affinity.set_queue("r1", 3)  # two requests of another router
    assert view.ahead(0.0) == 21.0 + 2 * UNKNOWN_REQUEST_CHUNKS


def test_a_sole_router_reads_counts_beyond_its_own_as_lag() -> None:
    affinity = fleet("r1", "r2", sole_router=True)
    affinity.routed("r1", "warm " * 100, request="warm")
    affinity.completed("r1", "warm")  # Serve reports completions
    affinity.set_queue("r1", 1)  # Serve's count, still counting the finished request
    affinity.observe("r2", RoutingStats(running=2, slots=4, serial=2))  # a report's, too
    assert affinity.replica("r1").ahead(0.0) == 0.0 and affinity.replica("r1").others == 0
    assert affinity.replica("r2").ahead(0.0) == 0.0 and affinity.replica("r2").others == 0
    choice = affinity.rank(["r1", "r2"], "warm " * 100 + "again")
    assert choice.ranked[0] == "r1" and choice.reason == "prefix"


def test_a_session_unpinned_by_a_newer_one_stays_while_its_slot_holds_it() -> None:
    affinity = fleet("r1", "r2", slots=2)
    old = SYSTEM_A + "user: first question"
    affinity.routed("r1", old, session="old", request=1)
    affinity.completed("r1", 1)
    affinity.routed("r1", SYSTEM_B + "user: hello", session="new", request=2)
    affinity.completed("r1", 2)  # the engine unpins "old"; its slot still holds it
    assert affinity.rank(["r1", "r2"], old + "more", session="old").reason == "session"
    for n, prompt in enumerate(("C" * 1000, "D" * 1000)):
        affinity.routed("r1", prompt, request=3 + n)
        affinity.completed("r1", 3 + n)
    assert affinity.rank(["r1", "r2"], old + "more", session="old").reason != "session"


def test_a_replica_reports_its_sessions_as_its_engine_holds_them() -> None:
    served = ServedPrefixes(slots=2, shared_cache=False)
    kept, lost = SYSTEM_A + "user: first question", SYSTEM_B + "user: hello"
    served.served(kept, session="kept")
    served.served(kept + "user: and then", session="kept")
    served.served(lost, session="lost")
    report = served.report(0, 0, in_slots={"kept"})
    assert report.sessions == {"kept": (2, True), "lost": (1, False)}
    assert report.resident == [prefix_chain(kept + "user: and then")]
    assert served.report(0, 0).sessions == {}  # an engine that does not say


def test_a_replica_reports_a_conversation_set_aside_as_held_but_in_no_slot() -> None:
    served = ServedPrefixes(slots=2, shared_cache=False)
    aside, in_slot = SYSTEM_A + "user: first question", SYSTEM_B + "user: hello"
    served.served(aside, session="aside")
    served.served(in_slot, session="in slot")
    report = served.report(0, 0, in_slots={"in slot"}, spills=True, aside=frozenset({"aside"}))
    assert report.sessions == {"aside": (1, True), "in slot": (1, True)}
    assert report.aside == ["aside"]
    assert report.resident == [prefix_chain(in_slot)]
    assert RoutingStats.from_dict(report.as_dict()) == report


def test_a_replica_keeps_no_slot_in_its_record_for_a_session_its_engine_set_aside() -> None:
    served = ServedPrefixes(slots=2, shared_cache=False)  # one pinnable slot
    chat = SYSTEM_A + "user: first question"
    served.served(chat, session="chat")
    served.report(0, 0, in_slots=set(), spills=True, aside=frozenset({"chat"}))
    served.served("C" * 1000)
    served.served("D" * 1000)  # the slots hold C and D: the chat is in memory, not pinned
    report = served.report(0, 0, in_slots=set(), spills=True, aside=frozenset({"chat"}))
    assert report.resident == [prefix_chain("C" * 1000), prefix_chain("D" * 1000)]
    served.served(chat + "user: and then", session="chat")  # its next turn takes a slot
    served.served("E" * 1000)  # and keeps it pinned
    report = served.report(0, 0, in_slots={"chat"}, spills=True)
    assert report.resident == [prefix_chain(chat + "user: and then"), prefix_chain("E" * 1000)]


def test_a_session_the_engine_set_aside_unpins_its_slot_in_the_routers_picture() -> None:
    # Another router's request (or one the router priced otherwise) took the pinned slot.
    affinity = fleet("r1", "r2", slots=2)
    affinity.observe("r1", RoutingStats(slots=2, serial=2, spills=True))
    conversation = SYSTEM_A + "user: " + "a long message of the session " * 60
    affinity.routed("r1", conversation, session="chat", request=1, reported_as="f-1")
    affinity.completed("r1", 1)
    prompt = SYSTEM_B + "user: hello"

    def extra() -> float:  # what a new session's turn on r1 costs beyond a one-shot's
        with_session = affinity.rank(["r1", "r2"], prompt, session="new").costs["r1"]
        return with_session - affinity.rank(["r1", "r2"], prompt).costs["r1"]

    assert extra() > 0  # it would unpin "chat" once done
    # A report taken as its turn ended, before the replica named the request finished.
    aside = RoutingStats(
        slots=2, serial=3, spills=True, sessions={"chat": (1, True)}, aside=["chat"]
    )
    affinity.observe("r1", aside)
    assert extra() == 0
    assert affinity.replica("r1").resident(prefix_chain(conversation)) == 0
    next_turn = conversation + "assistant: ok\nuser: more"
    assert affinity.rank(["r1", "r2"], next_turn, "chat").reason == "session"
    # Its next turn takes a slot again; a report of before that turn ended says nothing.
    affinity.routed("r1", next_turn, session="chat", request=2)
    affinity.observe("r1", dataclasses.replace(aside, serial=4))
    assert extra() > 0
    affinity.completed("r1", 2)
    affinity.observe("r1", dataclasses.replace(aside, serial=5))  # the turn before's word
    assert extra() > 0


def test_a_session_given_up_for_lost_that_the_engine_set_aside_is_routed_to_it() -> None:
    affinity = fleet("r1", "r2", slots=2)
    conversation = SYSTEM_A + "user: first question"
    affinity.routed("r1", conversation, session="chat", request=1, reported_as="f-1")
    affinity.completed("r1", 1)
    affinity.observe("r1", RoutingStats(slots=2, serial=2, sessions={"chat": (1, False)}))
    next_turn = conversation + "assistant: ok\nuser: more"
    assert affinity.rank(["r1", "r2"], next_turn, "chat").reason != "session"
    affinity.observe(
        "r1",
        RoutingStats(slots=2, serial=3, spills=True, sessions={"chat": (1, True)}, aside=["chat"]),
    )
    assert affinity.rank(["r1", "r2"], next_turn, "chat").ranked[0] == "r1"
    assert affinity.rank(["r1", "r2"], next_turn, "chat").reason == "session"


def test_a_session_whose_slot_the_engine_gave_away_is_routed_by_cost() -> None:
    affinity = fleet("r1", "r2", slots=2)
    conversation = SYSTEM_A + "user: first question"
    affinity.routed("r1", conversation, session="chat", request=1, reported_as="f-1")
    affinity.completed("r1", 1)
    next_turn = conversation + "assistant: ok\nuser: more"
    assert affinity.rank(["r1", "r2"], next_turn, "chat").reason == "session"
    report = RoutingStats(slots=2, serial=2, sessions={"chat": (1, False)})
    affinity.observe("r1", report)
    assert affinity.rank(["r1", "r2"], next_turn, "chat").reason != "session"
    # And the other way: the engine still holds a conversation the router gave up on.
    affinity.observe(
        "r1",
        RoutingStats(
            slots=2, serial=3, sessions={"chat": (1, True)}, resident=[prefix_chain(conversation)]
        ),
    )
    assert affinity.rank(["r1", "r2"], next_turn, "chat").reason == "session"


def test_a_report_older_than_a_sessions_last_turn_says_nothing_of_it() -> None:
    affinity = fleet("r1", "r2", slots=2)
    conversation = SYSTEM_A + "user: first question"
    affinity.routed("r1", conversation, session="chat", request=1, reported_as="f-1")
    affinity.completed("r1", 1)
    affinity.routed("r1", conversation + "user: two", session="chat", request=2)
    # Taken before turn 2 ended (one turn served), or while it runs: not believed.
    affinity.observe("r1", RoutingStats(slots=2, serial=2, sessions={"chat": (1, False)}))
    affinity.completed("r1", 2)
    affinity.observe(
        "r1",
        RoutingStats(
            slots=2,
            serial=3,
            sessions={"chat": (1, False)},
            resident=[prefix_chain(conversation + "user: two")],
        ),
    )
    assert (
        affinity.rank(["r1", "r2"], conversation + "user: two, three", "chat").reason == "session"
    )


def test_a_replica_with_a_slot_free_comes_before_one_holding_the_prefix_without() -> None:
    affinity = fleet("r1", "r2", slots=2)
    affinity.routed("r1", SYSTEM_A, request="warm")
    affinity.completed("r1", "warm")
    for n in range(2):  # two hits in flight take both of r1's slots
        affinity.routed("r1", SYSTEM_A + f"Invoice {n}", request=n)
    choice = affinity.rank(["r1", "r2"], SYSTEM_A + "Invoice 9")
    # Cheaper on r1 by the chunks it holds, but there it would wait for a whole request.
    assert choice.costs["r1"] < choice.costs["r2"]
    assert choice.ranked == ["r2", "r1"]
    affinity.completed("r1", 0)
    assert affinity.rank(["r1", "r2"], SYSTEM_A + "Invoice 9").ranked[0] == "r1"


def test_a_request_whose_completion_never_came_does_not_keep_a_replica_full() -> None:
    affinity = fleet("r1", "r2", slots=2, sole_router=True)
    affinity.routed("r1", SYSTEM_A, request="warm")
    affinity.completed("r1", "warm")
    for n in range(2):  # their completions go missing
        affinity.routed("r1", SYSTEM_A + f"Invoice {n}", request=n)
    assert affinity.rank(["r1", "r2"], SYSTEM_A + "Invoice 9").ranked[0] == "r2"
    affinity.set_queue("r1", 0)  # Serve counts nothing there
    assert affinity.rank(["r1", "r2"], SYSTEM_A + "Invoice 9").ranked[0] == "r1"


def test_with_every_slot_taken_a_request_waits_where_a_slot_frees_first() -> None:
    clock = Clock()
    affinity = fleet("r1", "r2", slots=2, clock=clock, sole_router=True)
    affinity.routed("r2", SYSTEM_A, request="warm")
    affinity.completed("r2", "warm")
    for n, replica in enumerate(["r1", "r1", "r2", "r2"]):  # r1's two were sent first
        affinity.routed(replica, SYSTEM_B + f"Ticket {n}", request=n)
        clock.now += 1
    choice = affinity.rank(["r1", "r2"], SYSTEM_A + "Invoice 9")
    # Cheaper on r2, which holds the prefix, but r1's oldest request ends first.
    assert choice.costs["r2"] < choice.costs["r1"]
    assert choice.ranked == ["r1", "r2"]
    # One more waits on r1: the next there frees after r1's second, sent before r2's first.
    affinity.routed("r1", SYSTEM_B + "Ticket 4", request=4)
    assert affinity.rank(["r1", "r2"], SYSTEM_A + "Invoice 9").ranked == ["r1", "r2"]
    # One more again: r1's queue is longer than its slots, so it goes after r2.
    affinity.routed("r1", SYSTEM_B + "Ticket 5", request=5)
    assert affinity.rank(["r1", "r2"], SYSTEM_A + "Invoice 9").ranked == ["r2", "r1"]


def test_behind_a_queue_longer_than_the_slots_a_request_goes_by_cost() -> None:
    clock = Clock()
    affinity = fleet("r1", "r2", slots=2, clock=clock, sole_router=True)
    affinity.routed("r2", SYSTEM_A, request="warm")
    affinity.completed("r2", "warm")
    for n, replica in enumerate(["r1", "r1", "r2", "r2", "r1", "r1", "r2", "r2"]):
        affinity.routed(replica, SYSTEM_B + f"Ticket {n}", request=n)
        clock.now += 1
    # Both queue two beyond their slots: when a slot frees is not known, the prefix counts.
    choice = affinity.rank(["r1", "r2"], SYSTEM_A + "Invoice 9")
    assert choice.ranked == ["r2", "r1"]
    # With r1's queue shorter, its slot frees after a request running now: r1 first.
    affinity.completed("r1", 0)
    affinity.completed("r1", 1)
    affinity.routed("r1", SYSTEM_B + "Ticket 8", request=8)
    assert affinity.rank(["r1", "r2"], SYSTEM_A + "Invoice 9").ranked == ["r1", "r2"]


_KEYS = st.tuples(st.booleans(), st.integers(0, 3), st.integers(0, 2))


@given(
    costs=st.lists(st.tuples(_KEYS, st.integers(0, 5), st.integers(0, 5)), min_size=1, max_size=9),
    exact=st.integers(1, 10),
)
@settings(max_examples=300, deadline=None)
def test_best_first_ranks_the_first_exactly_pricing_only_what_could_come_first(
    costs: list[tuple[tuple[bool, int, int], int, int]], exact: int
) -> None:
    items = [f"r{n}" for n in range(len(costs))]
    head = {item: c[0] for item, c in zip(items, costs, strict=True)}
    least = {item: float(c[1]) for item, c in zip(items, costs, strict=True)}
    full = {item: float(c[1] + c[2]) for item, c in zip(items, costs, strict=True)}
    asked: list[str] = []

    def price(item: str) -> float:
        asked.append(item)
        return full[item]

    def key(item: str, cost: float) -> tuple[object, ...]:
        return (*head[item], cost)

    ranked, priced = best_first(items, key, least, price, exact)
    everything = sorted(items, key=lambda i: key(i, full[i]))  # stable: items' order on ties
    assert ranked[:exact] == everything[:exact]
    assert sorted(ranked) == sorted(items)
    assert priced == {item: full[item] for item in asked} and len(asked) == len(set(asked))
    # Priced only what could have come before the last exactly ranked.
    last = ranked[min(exact, len(items)) - 1]
    bound = (key(last, full[last]), items.index(last))
    assert all((key(i, least[i]), items.index(i)) <= bound for i in asked)
    if exact >= len(items):
        assert ranked == everything


def _busy_fleet(seed: int) -> FleetAffinity:
    """A fleet of a few replicas after a random stretch of traffic: prompts sharing
    beginnings, sessions of several turns, requests completing or not."""
    rng = random.Random(seed)
    clock = Clock()
    replicas = [f"r{n}" for n in range(rng.randint(2, 7))]
    affinity = fleet(*replicas, slots=rng.choice((2, 4)), clock=clock, exact_ranks=3)
    conversations: dict[str, str] = {}
    in_flight: list[tuple[str, int]] = []
    for request in range(rng.randint(0, 40)):
        clock.now += rng.random() * 3
        replica = rng.choice(replicas)
        if rng.random() < 0.4:
            session = f"chat-{rng.randint(0, 5)}"
            start = conversations.get(session, rng.choice((SYSTEM_A, SYSTEM_B)))
            conversations[session] = start + f"user: turn {request}. " * rng.randint(1, 9)
            affinity.routed(replica, conversations[session], session=session, request=request)
        else:
            text = rng.choice((SYSTEM_A, SYSTEM_B, "")) + "document " * rng.randint(0, 300)
            affinity.routed(replica, text, request=request)
        in_flight.append((replica, request))
        while in_flight and rng.random() < 0.5:
            affinity.completed(*in_flight.pop(rng.randrange(len(in_flight))))
    return affinity


@pytest.mark.parametrize("seed", range(60))
def test_a_fleet_ranks_its_first_replicas_as_if_it_priced_every_one(seed: int) -> None:
    affinity = _busy_fleet(seed)
    live = list(affinity.replicas)
    rng = random.Random(-seed)
    for _ in range(5):
        text = rng.choice((SYSTEM_A, SYSTEM_B, "")) + "document " * rng.randint(0, 300)
        session = rng.choice((None, "chat-1", "new chat"))
        lazily = affinity.rank(live, text, session)
        affinity.exact_ranks = len(live)
        fully = affinity.rank(live, text, session)
        affinity.exact_ranks = 3
        assert lazily.reason == fully.reason
        if lazily.reason in ("session", "balance"):
            continue
        assert lazily.ranked[:3] == fully.ranked[:3]
        assert {r: fully.costs[r] for r in lazily.costs} == lazily.costs
