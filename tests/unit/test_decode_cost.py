"""What a decode costs: how a batch is cut into passes over the weights, and the cost curve
`DecodeCost` learns from timed decodes so the speculation governor can price a draft.

The fake backend charges `step_cost_s` per pass and `token_cost_s` per token; its sleeps
are recorded instead of slept, so nothing here depends on wall-clock time.
"""

from __future__ import annotations

import bisect
import itertools

import pytest

from reame_core.backend import fake as fake_module
from reame_core.backend.base import Batch, equal_split_passes, simple_split_passes
from reame_core.backend.fake import FakeBackend
from reame_core.engine import decode_cost
from reame_core.engine.decode_cost import SETTLED_TIMINGS, STALE_AFTER, STALE_CHECK, DecodeCost

# ----------------------------------------------------------------------------- passes


def test_equal_split_puts_consecutive_one_token_sequences_in_one_pass() -> None:
    assert equal_split_passes([(0, 1), (1, 1), (2, 1)], 512) == [3]


def test_drafting_sequence_beside_one_token_sequences_takes_a_second_pass() -> None:
    assert equal_split_passes([(0, 1), (1, 5)], 512) == [2, 4]


def test_sequences_drafting_equally_share_one_pass() -> None:
    assert equal_split_passes([(0, 5), (1, 5), (2, 5)], 512) == [15]


@pytest.mark.parametrize(
    "layout",
    [[(0, 1), (2, 1)], [(1, 1), (0, 1)]],
    ids=["gap-between-ids", "descending-ids"],
)
def test_equal_split_needs_a_pass_per_sequence_unless_ids_ascend_by_one(
    layout: list[tuple[int, int]],
) -> None:
    assert equal_split_passes(layout, 512) == [1, 1]


def test_n_ubatch_caps_the_tokens_of_a_pass() -> None:
    assert equal_split_passes([(0, 10)], 4) == [4, 4, 2]
    assert equal_split_passes([(seq_id, 1) for seq_id in range(6)], 4) == [4, 2]


def test_simple_split_cuts_consecutive_chunks_of_n_ubatch() -> None:
    assert simple_split_passes(10, 4) == [4, 4, 2]
    assert simple_split_passes(8, 4) == [4, 4]


def test_fake_decode_charges_step_cost_per_pass_and_token_cost_per_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept: list[float] = []
    monkeypatch.setattr(fake_module.time, "sleep", slept.append)
    backend = FakeBackend(step_cost_s=0.5, token_cost_s=0.01)
    together = Batch()
    together.add(1, 0, 0, True)
    together.add(1, 0, 1, True)
    apart = Batch()  # seq 0 one token, seq 1 three: equal split makes passes [2, 2]
    apart.add(2, 1, 0, True)
    for position in range(1, 4):
        apart.add(2, position, 1, True)

    backend.decode(together)
    backend.decode(apart)

    assert slept == [pytest.approx(0.5 + 2 * 0.01), pytest.approx(2 * 0.5 + 4 * 0.01)]


def test_fake_decode_charges_more_for_a_pass_whose_sequences_carry_several_tokens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept: list[float] = []
    monkeypatch.setattr(fake_module.time, "sleep", slept.append)
    backend = FakeBackend(step_cost_s=0.5, multi_token_cost_s=0.25)
    one_each = Batch()
    one_each.add(1, 0, 0, True)
    one_each.add(1, 0, 1, True)
    apart = Batch()  # passes: one token of each sequence, then two more of seq 1
    apart.add(2, 1, 0, True)
    for position in range(1, 4):
        apart.add(2, position, 1, True)

    backend.decode(one_each)
    backend.decode(apart)

    assert slept == [pytest.approx(0.5), pytest.approx(2 * 0.5 + 0.25)]


# ------------------------------------------------------------------------- cost curve


def test_single_pass_decode_teaches_the_time_of_its_size() -> None:
    cost = DecodeCost()

    cost.observe([4], 0.02)

    assert cost.covers(4) and not cost.covers(3)
    assert cost.curve() == {4: 0.02}
    assert cost.pass_seconds(4) == 0.02


def test_multi_pass_decode_teaches_nothing() -> None:
    cost = DecodeCost()

    cost.observe([4, 4], 0.04)

    assert not cost.covers(4)
    assert cost.curve() == {}


def test_time_between_measured_sizes_is_interpolated() -> None:
    cost = DecodeCost()
    cost.observe([1], 0.01)
    cost.observe([9], 0.05)

    assert cost.pass_seconds(5) == pytest.approx(0.03)


def test_size_below_the_smallest_measured_costs_as_much_as_it() -> None:
    cost = DecodeCost()
    cost.observe([4], 0.02)
    cost.observe([8], 0.04)

    assert cost.pass_seconds(1) == 0.02


def test_size_above_the_largest_measured_follows_the_last_slope() -> None:
    cost = DecodeCost()
    cost.observe([1], 0.01)
    cost.observe([5], 0.02)
    cost.observe([9], 0.04)

    assert cost.pass_seconds(13) == pytest.approx(0.06)


def test_one_measured_size_scales_with_tokens_above_it() -> None:
    cost = DecodeCost()
    cost.observe([4], 0.02)

    assert cost.pass_seconds(8) == pytest.approx(0.04)


def test_decode_made_of_passes_costs_the_sum_of_its_passes() -> None:
    cost = DecodeCost()
    cost.observe([1], 0.01)
    cost.observe([9], 0.05)

    assert cost.seconds([9, 1, 5]) == pytest.approx(0.05 + 0.01 + 0.03)


def test_one_slow_decode_among_usual_ones_changes_nothing() -> None:
    # On a shared host a decode now and then takes several times its usual time.
    cost = DecodeCost()
    for seconds in (0.01, 0.01, 0.05, 0.01):
        cost.observe([1], seconds)

    assert cost.pass_seconds(1) == 0.01


def test_cost_follows_a_lasting_change_of_speed() -> None:
    cost = DecodeCost(window=7)
    for _ in range(7):
        cost.observe([1], 0.01)

    for _ in range(4):
        cost.observe([1], 0.02)

    assert cost.pass_seconds(1) == 0.02


def test_sizes_up_to_32_are_kept_apart_and_larger_sizes_share_buckets() -> None:
    cost = DecodeCost()

    cost.observe([31], 0.1)
    cost.observe([32], 0.2)
    cost.observe([40], 0.3)
    cost.observe([47], 0.5)

    assert cost.curve() == {31: 0.1, 32: 0.2, 40: pytest.approx(0.4)}  # median of 0.3, 0.5


def test_prompt_share_is_a_token_of_the_largest_pass_next_to_a_one_token_decode() -> None:
    cost = DecodeCost()
    cost.observe([1], 0.010)
    cost.observe([128], 0.320)

    assert cost.prompt_share() == pytest.approx(0.25)


def test_prompt_share_is_one_until_a_large_pass_is_measured() -> None:
    cost = DecodeCost()
    cost.observe([1], 0.010)
    cost.observe([2], 0.018)

    assert cost.prompt_share() == 1.0


def test_a_reader_on_another_thread_never_sees_a_size_without_its_price(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cost = DecodeCost()
    cost.observe([1], 0.010)
    insort = bisect.insort
    read_meanwhile: list[dict[int, float]] = []

    def insort_while_read(sizes: list[int], size: int) -> None:
        insort(sizes, size)
        read_meanwhile.append(cost.curve())  # a /metrics scrape at this very moment

    monkeypatch.setattr(decode_cost.bisect, "insort", insort_while_read)
    cost.observe([8], 0.020)

    assert read_meanwhile == [{1: 0.010, 8: 0.020}]


def test_a_pass_between_measured_sizes_costs_at_most_the_next_larger_one() -> None:
    # The 2-core EPYC with Qwen2.5-Coder-1.5B: a token costs less the more a pass holds.
    cost = DecodeCost()
    for n, seconds in ((1, 0.036), (28, 0.437)):
        cost.observe([n], seconds)

    assert cost.pass_seconds(17) < 0.30  # the interpolation, well below the 0.33-0.44 s seen
    assert cost.pass_seconds_at_most(17) == 0.437
    assert cost.pass_seconds_at_most(1) == 0.036
    assert cost.pass_seconds_at_most(56) == pytest.approx(cost.pass_seconds(56))


def timed_often(cost: DecodeCost, n: int, seconds: float) -> None:
    for _ in range(SETTLED_TIMINGS):
        cost.observe([n], seconds)


def test_a_size_timed_once_slow_is_priced_no_higher_than_its_neighbours_line() -> None:
    # The first pass verifying 4 drafts was preempted: 0.5 s where its neighbours say 0.03.
    cost = DecodeCost()
    timed_often(cost, 1, 0.01)
    timed_often(cost, 9, 0.05)

    cost.observe([5], 0.5)

    assert cost.pass_seconds(5) == pytest.approx(0.03)
    assert cost.pass_seconds(3) == pytest.approx(0.02)  # its neighbours keep their line too
    assert cost.curve()[5] == 0.5  # what was measured, for reports


def test_a_size_that_is_that_dear_settles_at_its_timings() -> None:
    cost = DecodeCost()
    timed_often(cost, 1, 0.01)
    timed_often(cost, 9, 0.05)

    timed_often(cost, 5, 0.5)

    assert cost.pass_seconds(5) == 0.5


def test_the_smallest_size_timed_once_slow_costs_at_most_the_next_larger() -> None:
    cost = DecodeCost()
    timed_often(cost, 4, 0.02)

    cost.observe([1], 0.3)

    assert cost.pass_seconds(1) == 0.02


def test_the_largest_size_timed_once_is_taken_as_timed() -> None:
    # Nothing above it to bound it: a prompt chunk's time is what it is.
    cost = DecodeCost()
    timed_often(cost, 1, 0.01)

    cost.observe([128], 0.9)

    assert cost.pass_seconds(128) == 0.9


def test_two_neighbouring_sizes_timed_once_slow_cost_at_most_the_next_settled_one() -> None:
    # One burst on the core preempted the first verifications of two draft lengths: each
    # caps the other's line, but a pass of fewer tokens takes no longer than a settled one.
    cost = DecodeCost()
    timed_often(cost, 1, 0.01)
    timed_often(cost, 9, 0.05)

    cost.observe([5], 0.5)
    cost.observe([7], 0.5)

    assert cost.pass_seconds(5) == cost.pass_seconds(7) == 0.05


def timed_after(cost: DecodeCost, timings: int, *sizes: tuple[int, float]) -> None:
    """`timings` decodes of other sizes, taking turns (one-token passes of 10 ms by
    default): what a size rarely verified waits through."""
    for n, seconds in itertools.islice(itertools.cycle(sizes or ((1, 0.01),)), timings):
        cost.observe([n], seconds)


def two_settled_dear() -> DecodeCost:
    """The 1.5B on a 2-core EPYC: passes of two tokens priced 85 ms where they take 47 ms
    (settled by a process's first, slow passes); looking dear, they were never verified
    again to correct it."""
    cost = DecodeCost()
    timed_often(cost, 1, 0.036)
    timed_often(cost, 4, 0.067)
    timed_often(cost, 2, 0.085)
    return cost


def test_a_size_settled_dear_and_not_timed_since_is_priced_by_its_neighbours_again() -> None:
    cost = two_settled_dear()
    assert cost.pass_seconds(2) == 0.085

    timed_after(cost, STALE_AFTER + STALE_CHECK, (1, 0.036))

    assert cost.pass_seconds(2) == pytest.approx(0.036 + (0.067 - 0.036) / 3)
    assert cost.curve()[2] == 0.085  # its median, kept


@pytest.mark.parametrize("now", [0.047, 0.085], ids=["cheaper-now", "that-dear"])
def test_a_size_forgotten_settles_at_what_two_new_timings_say(now: float) -> None:
    cost = two_settled_dear()
    timed_after(cost, STALE_AFTER + STALE_CHECK, (1, 0.036))

    cost.observe([2], now)
    cost.observe([2], now)

    assert cost.pass_seconds(2) == now


@pytest.mark.parametrize("times", [SETTLED_TIMINGS, 1], ids=["settled", "timed-once"])
def test_sizes_left_dear_together_are_priced_by_the_sizes_timed_since(times: int) -> None:
    # The governor's curve at the end of a run of the 1.5B on a 2-core EPYC: passes of two
    # and three tokens left dearer than four. Stale together, neither is the other's measure,
    # whether they had settled or been timed once.
    cost = DecodeCost()
    timed_often(cost, 1, 0.0294)
    timed_often(cost, 4, 0.0706)
    for n, seconds in ((2, 0.0854), (3, 0.0818)):
        for _ in range(times):
            cost.observe([n], seconds)

    timed_after(cost, STALE_AFTER + STALE_CHECK, (1, 0.0294), (4, 0.0706))

    assert cost.pass_seconds(2) == pytest.approx(0.0294 + (0.0706 - 0.0294) / 3)
    assert cost.pass_seconds(3) == pytest.approx(0.0294 + 2 * (0.0706 - 0.0294) / 3)


def test_an_unsettled_size_follows_when_the_settled_one_bounding_it_is_forgotten() -> None:
    cost = DecodeCost()
    timed_often(cost, 1, 0.036)
    timed_often(cost, 8, 0.1)
    timed_often(cost, 3, 0.2)
    cost.observe([2], 0.15)  # ten timings so far
    assert cost.pass_seconds(2) == pytest.approx(0.036 + (0.2 - 0.036) / 2)

    # The last of these is the timing after which stale sizes are looked for.
    timed_after(cost, STALE_AFTER + STALE_CHECK - 10, (1, 0.036), (8, 0.1))

    assert cost.pass_seconds(2) == pytest.approx(0.036 + (0.1 - 0.036) / 7)


def test_a_size_timed_within_the_stale_horizon_keeps_its_timings() -> None:
    cost = two_settled_dear()

    timed_after(cost, STALE_AFTER - 2 * SETTLED_TIMINGS, (1, 0.036))

    assert cost.pass_seconds(2) == 0.085


def test_the_largest_size_forgotten_keeps_its_median_as_its_price() -> None:
    # Not its last timing: that may be the one a neighbour's burst slowed.
    cost = DecodeCost()
    timed_often(cost, 1, 0.01)
    for seconds in (0.7, 0.6, 0.9):
        cost.observe([128], seconds)

    timed_after(cost, STALE_AFTER + STALE_CHECK)

    assert cost.pass_seconds(128) == 0.7
