"""What asking a draft source costs: `ProposeCost` learns it from timed propose calls, by
the tokens drafted and the tokens caught up on."""

from __future__ import annotations

import pytest

from reame_core.engine.propose_cost import CLIPPED, SETTLED_CALLS, ProposeCost

# A draft model that takes 40 ms a drafted token and 10 ms a caught-up token (a quarter,
# as a prompt token is to a decode step here).
DRAFT_TOKEN_S, CATCH_UP_S, WEIGHT = 0.040, 0.010, 0.25


def timed(drafted: int, caught_up: int) -> float:
    return DRAFT_TOKEN_S * (1 + drafted) + CATCH_UP_S * caught_up


def test_nothing_is_known_before_a_call() -> None:
    cost = ProposeCost()

    assert not cost.known
    assert cost.predict(16, 1, WEIGHT) == 0.0


def test_a_first_call_that_caught_up_a_long_prompt_prices_a_later_short_one_right() -> None:
    cost = ProposeCost()

    cost.observe(timed(4, 600), drafted=4, caught_up=600)

    assert cost.predict(16, 1, WEIGHT) == pytest.approx(timed(16, 1))


def test_a_source_far_behind_costs_more_to_ask() -> None:
    cost = ProposeCost()
    cost.observe(timed(8, 2), drafted=8, caught_up=2)

    assert cost.predict(8, 200, WEIGHT) > 2 * cost.predict(8, 2, WEIGHT)


def test_one_slow_call_among_usual_ones_changes_nothing() -> None:
    cost = ProposeCost()
    for _ in range(6):
        cost.observe(timed(16, 1), drafted=16, caught_up=1)

    cost.observe(10 * timed(16, 1), drafted=16, caught_up=1)

    assert cost.predict(16, 1, WEIGHT) == pytest.approx(timed(16, 1))


def test_what_calls_take_lately_is_their_mean_whatever_they_were_asked() -> None:
    cost = ProposeCost()
    for drafted in (0, 16, 3, 16, 0):  # a lookup whose time does not depend on its answer
        cost.observe(0.00002, drafted=drafted, caught_up=1)

    assert cost.typical() == pytest.approx(0.00002)


def test_calls_mostly_quick_are_priced_at_what_they_take_on_the_whole() -> None:
    # Lookups that mostly stop at once and now and then search: asking every step costs
    # their mean, which a median would put at the quick ones.
    cost = ProposeCost()
    for seconds in (0.00005, 0.00005, 0.00025, 0.00005, 0.00025, 0.00005, 0.00005, 0.00025):
        cost.observe(seconds, drafted=8, caught_up=1)

    calls = [0.00005, 0.00025, 0.00005, 0.00025, 0.00005, 0.00005, 0.00025]  # the warm-up gone
    assert cost.typical() == pytest.approx(sum(calls) / len(calls))


def test_a_preempted_call_counts_as_a_few_usual_ones_at_most() -> None:
    cost = ProposeCost()
    for _ in range(7):
        cost.observe(0.00002, drafted=4, caught_up=1)
    cost.observe(0.005, drafted=4, caught_up=1)  # 250 times the usual
    cost.observe(0.005, drafted=4, caught_up=1)

    # 6 usual calls (the warm-up gone) and 2 counted as CLIPPED usual ones each
    assert cost.typical() == pytest.approx(0.00002 * (6 + 2 * CLIPPED) / 8)


def test_a_slow_first_call_prices_the_source_only_until_a_second_is_timed() -> None:
    cost = ProposeCost()
    cost.observe(0.005, drafted=4, caught_up=1)  # a cold cache
    assert cost.typical() == pytest.approx(0.005)

    cost.observe(0.00002, drafted=4, caught_up=1)

    assert cost.typical() == pytest.approx(0.00002)


def test_a_price_settles_after_enough_timed_calls_or_at_once_when_the_source_gives_it() -> None:
    timed_only, given = ProposeCost(), ProposeCost()
    given.observe(timed(4, 1), drafted=4, caught_up=1, given=True)
    settled = []
    for _ in range(1 + SETTLED_CALLS):
        settled.append(timed_only.settled)
        timed_only.observe(timed(4, 1), drafted=4, caught_up=1)

    assert given.settled
    assert settled == [False] * (1 + SETTLED_CALLS)  # the warm-up, then SETTLED_CALLS more
    assert timed_only.settled


def test_two_slow_calls_among_three_settle_the_price_slow() -> None:
    cost = ProposeCost()
    for seconds in (0.005, 0.005, 0.005, 0.00002):  # warm-up, then a source slow twice
        cost.observe(seconds, drafted=4, caught_up=1)

    assert cost.settled
    assert cost.typical() == pytest.approx((0.005 + 0.005 + 0.00002) / 3)


def test_a_given_figure_is_settled_only_until_calls_are_timed() -> None:
    cost = ProposeCost()
    cost.observe(timed(4, 1), drafted=4, caught_up=1, given=True)
    settled = []
    for _ in range(1 + SETTLED_CALLS):
        cost.observe(timed(4, 1), drafted=4, caught_up=1)
        settled.append(cost.settled)

    assert settled == [False] * SETTLED_CALLS + [True]


def test_timing_anew_keeps_the_last_call_as_the_price_until_it_settles() -> None:
    cost = ProposeCost()
    for seconds in (0.005, 0.005, 0.005, 0.005, 0.001):
        cost.observe(seconds, drafted=4, caught_up=1)

    cost.unsettle()

    assert not cost.settled
    assert cost.typical() == pytest.approx(0.001)
    for _ in range(SETTLED_CALLS):
        cost.observe(0.00002, drafted=4, caught_up=1)
    assert cost.settled
    # the new calls' price, the old call counted as at most CLIPPED of them
    assert cost.typical() == pytest.approx(
        0.00002 * (SETTLED_CALLS + CLIPPED) / (SETTLED_CALLS + 1)
    )


def test_a_figure_given_anew_replaces_the_last_until_a_call_is_timed() -> None:
    cost = ProposeCost()
    cost.observe(0.050, drafted=4, caught_up=1, given=True)  # beside a busy neighbour
    cost.observe(0.002, drafted=4, caught_up=1, given=True)

    assert cost.given and cost.settled
    assert cost.typical() == pytest.approx(0.002)

    cost.observe(0.003, drafted=4, caught_up=1)

    assert not cost.given
