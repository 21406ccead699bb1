"""What a draft source's drafts are worth: acceptance by draft position, its prior and its
confidence, a request's own estimate, and drafts scored without verifying them."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from reame_core.engine.acceptance import (
    PRIOR_RATE,
    Acceptance,
    ShadowDraft,
    accepted_by_length,
    sequence_rates,
)

# ------------------------------------------------------------ what a draft brings


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_expected_accepted_sums_the_chance_of_each_draft_prefix(alpha: float, k: int) -> None:
    # Draft token i is kept only if tokens 1..i are all right: probability alpha ** i.
    expected = accepted_by_length([alpha] * k)

    assert expected[k] == pytest.approx(sum(alpha**i for i in range(1, k + 1)))
    assert expected[0] == 0.0


def test_acceptance_counts_each_position_a_draft_reached() -> None:
    acceptance = Acceptance()

    acceptance.add(4, 2)  # tokens 0 and 1 right, token 2 wrong, token 3 never checked
    acceptance.add(2, 2)

    assert acceptance.reached == [2.0, 2.0, 1.0]
    assert acceptance.passed == [2.0, 2.0, 0.0]


def test_what_a_draft_brings_follows_how_drafts_really_fared() -> None:
    # Half the drafts miss at once; the others are right to the end (a copy on track):
    # an 8-token draft brings 4 tokens on average, which one rate for all positions
    # (about 0.88 here) overestimates.
    acceptance = Acceptance()
    for _ in range(100):
        acceptance.add(8, 0)
        acceptance.add(8, 8)

    rates = acceptance.rates(8)

    assert rates[0] < 0.6 and rates[7] > 0.9
    assert accepted_by_length(rates)[8] == pytest.approx(4.0, abs=0.1)
    assert accepted_by_length([acceptance.pooled] * 8)[8] > 4.5


# ------------------------------------------------------------- prior and confidence


def test_a_source_without_evidence_takes_the_prior_rate() -> None:
    assert Acceptance().rates(3) == pytest.approx([PRIOR_RATE] * 3)


def test_a_position_no_draft_reached_is_taken_as_good_as_the_one_before() -> None:
    acceptance = Acceptance()
    for _ in range(20):
        acceptance.add(2, 2)

    rates = acceptance.rates(6)

    assert rates[5] == pytest.approx(rates[1])
    assert rates[5] > 0.9


def test_given_priors_pull_each_position_with_their_weight() -> None:
    rates = Acceptance().rates(3, [0.2, 0.4, 0.6], 2.0)

    assert rates == pytest.approx([0.2, 0.4, 0.6])


def test_a_handful_of_missed_drafts_leaves_room_for_a_good_source() -> None:
    acceptance = Acceptance()
    for _ in range(4):
        acceptance.add(4, 0)

    assert acceptance.rates(1)[0] < 0.25
    assert acceptance.upper_rates(1)[0] > 0.4  # four misses prove little


def test_many_missed_drafts_leave_no_room_for_a_good_source() -> None:
    acceptance = Acceptance()
    for _ in range(40):
        acceptance.add(4, 0)

    assert acceptance.upper_rates(1)[0] < 0.1


def test_a_position_without_evidence_could_be_always_right() -> None:
    assert Acceptance().upper_rates(2) == [1.0, 1.0]


# --------------------------------------------------------------- one request's view


def test_a_request_without_evidence_of_its_own_takes_its_source_rates() -> None:
    source = [0.3, 0.8, 0.9]

    assert sequence_rates(Acceptance(), source, 2.0) == pytest.approx(source)


def test_a_request_that_copies_better_than_its_source_is_believed_at_later_positions() -> None:
    # The source's other requests did not copy; this one's first drafts were right for
    # four tokens. Positions it has no evidence for are lifted with it.
    own = Acceptance()
    for _ in range(6):
        own.add(4, 4)
    source = [0.1] * 16

    rates = sequence_rates(own, source, 2.0)

    assert rates[0] > 0.7
    assert min(rates[4:]) > 0.7
    assert accepted_by_length(rates)[16] > 5.0


def test_a_request_that_misses_keeps_its_source_rates_beyond_its_evidence() -> None:
    own = Acceptance()
    for _ in range(6):
        own.add(4, 0)
    source = [0.9] * 4

    rates = sequence_rates(own, source, 2.0)

    assert rates[0] < 0.3
    assert rates[1:] == pytest.approx([0.9] * 3)


# ----------------------------------------------------------------- shadow drafts


def record_into(log: list[tuple[int, bool]]) -> Callable[[int, bool], None]:
    def record(position: int, right: bool) -> None:
        log.append((position, right))

    return record


def test_a_shadow_draft_is_scored_against_the_tokens_committed_after_it() -> None:
    log: list[tuple[int, bool]] = []
    shadow = ShadowDraft("s", (7, 8, 9, 10), start=2)

    shadow.score([1, 2, 7], record_into(log))
    shadow.score([1, 2, 7, 8, 5, 6], record_into(log))

    assert log == [(0, True), (1, True), (2, False)]
    assert shadow.done


def test_a_shadow_draft_that_comes_true_to_its_end_is_done() -> None:
    log: list[tuple[int, bool]] = []
    shadow = ShadowDraft("s", (7, 8), start=0)

    shadow.score([7, 8, 9], record_into(log))

    assert log == [(0, True), (1, True)]
    assert shadow.done


def test_a_shadow_draft_leaves_the_verified_tokens_to_verification() -> None:
    accepted: list[tuple[int, bool]] = []
    rejected: list[tuple[int, bool]] = []
    # Its first two tokens were verified: both right in one case, the second wrong in the other.
    after_accepting = ShadowDraft("s", (7, 8, 9, 10), start=0, verified=2)
    after_rejecting = ShadowDraft("s", (7, 8, 9, 10), start=0, verified=2)

    after_accepting.score([7, 8, 9, 4], record_into(accepted))
    after_rejecting.score([7, 3, 9, 10], record_into(rejected))

    assert accepted == [(2, True), (3, False)]
    assert rejected == []
