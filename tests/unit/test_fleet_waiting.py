"""The router's line of requests waiting for a slot: pure logic, no Ray."""

from __future__ import annotations

from reame_core.fleet.waiting import STALE_S, WaitLine


def test_a_request_alone_is_offered_every_replica_it_ranked() -> None:
    line = WaitLine()
    assert line.turn("a", 1.0, ["r2", "r1"], now=0.0) == ["r2", "r1"]


def test_a_younger_request_waits_while_an_older_one_would_take_the_same_replicas() -> None:
    line = WaitLine()
    assert line.turn("old", 1.0, ["r1", "r2"], now=0.0) == ["r1", "r2"]
    assert line.turn("new", 2.0, ["r2", "r1"], now=0.0) == []
    # Asking again does not move either: the order is arrival, not the last ask.
    assert line.turn("old", 1.0, ["r1", "r2"], now=0.1) == ["r1", "r2"]
    assert line.turn("new", 2.0, ["r2", "r1"], now=0.1) == []
    line.seated("old")
    assert line.turn("new", 2.0, ["r2", "r1"], now=0.2) == ["r2", "r1"]


def test_a_session_waiting_for_its_replica_leaves_the_others_to_younger_requests() -> None:
    line = WaitLine()
    line.turn("turn", 1.0, ["r1"], now=0.0)  # a session's turn: only its replica
    assert line.turn("new", 2.0, ["r1", "r2"], now=0.0) == ["r2"]


def test_an_older_request_asking_later_still_goes_first() -> None:
    line = WaitLine()
    line.turn("new", 2.0, ["r1", "r2"], now=0.0)
    assert line.turn("old", 1.0, ["r1", "r2"], now=0.01) == ["r1", "r2"]
    assert line.turn("new", 2.0, ["r1", "r2"], now=0.02) == []


def test_equal_arrivals_go_in_the_order_first_seen() -> None:
    line = WaitLine()
    line.turn("first", 1.0, ["r1"], now=0.0)
    assert line.turn("second", 1.0, ["r1"], now=0.0) == []
    assert line.turn("first", 1.0, ["r1"], now=0.01) == ["r1"]


def test_a_request_that_stopped_asking_no_longer_holds_the_line() -> None:
    line = WaitLine()
    line.turn("cancelled", 1.0, ["r1", "r2"], now=0.0)
    assert line.turn("new", 2.0, ["r1", "r2"], now=STALE_S / 2) == []
    assert line.turn("new", 2.0, ["r1", "r2"], now=STALE_S + 0.01) == ["r1", "r2"]
    assert len(line) == 1
