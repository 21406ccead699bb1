"""What asking a draft source costs: `ProposeCost` learns it from timed propose calls, by
the tokens drafted and the tokens caught up on."""

from __future__ import annotations

import pytest

from reame_core.engine.propose_cost import ProposeCost

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


def test_what_calls_take_lately_is_their_median_whatever_they_were_asked() -> None:
    cost = ProposeCost()
    for drafted in (0, 16, 3, 16, 0):  # a lookup whose time does not depend on its answer
        cost.observe(0.00002, drafted=drafted, caught_up=1)

    assert cost.typical() == pytest.approx(0.00002)
