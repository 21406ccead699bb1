"""The router's line of requests waiting for a free slot (reame_core/fleet/seating.py)."""

from __future__ import annotations

import asyncio

import pytest

from reame_core.fleet.affinity import FleetAffinity, RoutingStats
from reame_core.fleet.seating import SlotLine


class Fleet:
    """Slots free as the router counts them: a request routed takes one, a completed one
    gives it back."""

    def __init__(self, free: int) -> None:
        self.slots = free
        self.routed: list[str] = []

    def free(self) -> int:
        return self.slots

    def route(self, line: SlotLine, key: str) -> None:
        self.slots -= 1
        self.routed.append(key)
        line.routed(key)

    def complete(self, line: SlotLine) -> None:
        self.slots += 1
        line.changed()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_free_slot_lets_a_request_through_at_once() -> None:
    async def main() -> None:
        line = SlotLine(recheck_s=60)
        fleet = Fleet(free=1)
        await asyncio.wait_for(line.seat("a", fleet.free), 1)
        assert line.seats == 1 and len(line) == 0

    asyncio.run(main())


def test_requests_wait_for_a_completion_and_leave_oldest_first() -> None:
    async def main() -> None:
        line = SlotLine(recheck_s=60)  # only a completion wakes them
        fleet = Fleet(free=0)

        async def request(key: str) -> None:
            await line.seat(key, fleet.free)
            fleet.route(line, key)

        tasks = []
        for key in "abc":
            tasks.append(asyncio.create_task(request(key)))
            await settle()
        assert fleet.routed == [] and len(line) == 3
        fleet.complete(line)
        await settle()
        assert fleet.routed == ["a"]
        fleet.complete(line)
        fleet.complete(line)
        await asyncio.wait_for(asyncio.gather(*tasks), 1)
        assert fleet.routed == ["a", "b", "c"] and len(line) == 0 and line.seats == 0

    asyncio.run(main())


def test_a_request_let_through_holds_its_seat_until_routed() -> None:
    async def main() -> None:
        line = SlotLine(recheck_s=60)
        fleet = Fleet(free=1)
        await line.seat("a", fleet.free)  # not routed yet: the count still says one free
        second = asyncio.create_task(line.seat("b", fleet.free))
        await settle()
        assert not second.done()
        fleet.route(line, "a")
        fleet.complete(line)
        await asyncio.wait_for(second, 1)

    asyncio.run(main())


def test_a_younger_request_does_not_overtake_a_waiting_one() -> None:
    async def main() -> None:
        line = SlotLine(recheck_s=60)
        fleet = Fleet(free=0)
        first = asyncio.create_task(line.seat("a", fleet.free))
        await settle()
        fleet.slots = 1  # freed, but no one told the line yet
        second = asyncio.create_task(line.seat("b", fleet.free))
        await settle()
        assert not second.done()  # the older request is first in line
        line.changed()
        await asyncio.wait_for(first, 1)
        await settle()
        assert not second.done()  # `a` holds the one free slot

    asyncio.run(main())


def test_counts_that_change_unannounced_are_seen_within_the_recheck() -> None:
    async def main() -> None:
        line = SlotLine(recheck_s=0.01)
        fleet = Fleet(free=0)
        waiting = asyncio.create_task(line.seat("a", fleet.free))
        await asyncio.sleep(0.03)
        assert not waiting.done()
        fleet.slots = 1  # Serve's count fell; no completion was heard of
        await asyncio.wait_for(waiting, 1)

    asyncio.run(main())


def test_a_cancelled_request_leaves_the_line() -> None:
    async def main() -> None:
        line = SlotLine(recheck_s=60)
        fleet = Fleet(free=0)
        first = asyncio.create_task(line.seat("a", fleet.free))
        await settle()
        second = asyncio.create_task(line.seat("b", fleet.free))
        await settle()
        first.cancel()
        await settle()
        assert len(line) == 1 and line.seats == 0
        fleet.complete(line)
        await asyncio.wait_for(second, 1)

    asyncio.run(main())


def test_a_seat_never_routed_is_given_up() -> None:
    now = [0.0]
    line = SlotLine(seat_ttl_s=1.0, clock=lambda: now[0])

    async def main() -> None:
        await line.seat("a", lambda: 1)
        assert line.seats == 1
        now[0] = 1.5
        assert line.seats == 0

    asyncio.run(main())


def test_a_request_asked_again_gives_up_its_earlier_seat() -> None:
    async def main() -> None:
        line = SlotLine(recheck_s=60)
        await line.seat("a", lambda: 1)
        await asyncio.wait_for(line.seat("a", lambda: 1), 1)  # turned away, retried
        assert line.seats == 1

    asyncio.run(main())


def report(slots: int, serial: int = 1) -> RoutingStats:
    return RoutingStats(slots=slots, serial=serial)


def test_free_slots_are_counted_once_every_replica_has_reported() -> None:
    affinity = FleetAffinity(sole_router=True)
    affinity.observe("a", report(2))
    assert affinity.free_slots(["a", "b"]) is None  # b has not said how many slots it has
    affinity.observe("b", report(2))
    assert affinity.free_slots(["a", "b"]) == 4
    affinity.routed("a", "x" * 300, request="r1")
    affinity.routed("a", "y" * 300, request="r2")
    affinity.routed("a", "z" * 300, request="r3")  # queued beyond a's slots
    affinity.routed("b", "w" * 300, request="r4")
    assert affinity.free_slots(["a", "b"]) == 1
    affinity.completed("a", "r1")
    assert affinity.free_slots(["a", "b"]) == 1  # r3 takes the slot r1 left
    affinity.completed("b", "r4")
    assert affinity.free_slots(["a", "b"]) == 2


@pytest.mark.parametrize("counted, free", [(0, 2), (1, 1), (5, 0)])
def test_serves_lower_count_frees_slots_the_router_never_heard_of(counted: int, free: int) -> None:
    affinity = FleetAffinity(sole_router=True)
    affinity.observe("a", report(2))
    affinity.routed("a", "x" * 300, request="r1")
    affinity.routed("a", "y" * 300, request="r2")
    affinity.set_queue("a", counted)
    assert affinity.free_slots(["a"]) == free
