from __future__ import annotations

import pytest

from reame_conclave.voting import Ballot, StopRule, Tally, beta_lead


def tally(*answers: str | None, likelihood: dict[str, float] | None = None) -> Tally:
    odds = likelihood or {}
    return Tally(tuple(Ballot(i, a, odds.get(a or "", -1.0)) for i, a in enumerate(answers)))


def first_settled(rule: StopRule, answers: list[str], total: int) -> int | None:
    """After how many votes, in this order, the rule stops a vote of `total` candidates."""
    for k in range(1, len(answers) + 1):
        if rule.settled(tally(*answers[:k]), total - k):
            return k
    return None


def test_beta_lead_is_the_exact_posterior_chance_that_the_leader_is_ahead() -> None:
    assert beta_lead(0, 0) == 0.5
    assert beta_lead(3, 0) == 15 / 16
    assert beta_lead(4, 0) == 31 / 32
    assert beta_lead(2, 2) == 0.5


@pytest.mark.parametrize(
    ("rule", "answers", "total", "step"),
    [
        # Unanimous: the adaptive rule needs four votes at 0.95 (3 give 0.9375).
        (StopRule("adaptive"), ["7"] * 9, 9, 4),
        (StopRule("adaptive", confidence=0.9), ["7"] * 9, 9, 3),
        # One dissent: 5 to 1 gives 0.9375, 6 to 1 gives 0.965.
        (StopRule("adaptive"), ["7", "8", "7", "7", "7", "7", "7", "7", "7"], 16, 7),
        # The window rule stops when the last three agree, wherever they come.
        (StopRule("window"), ["7", "8", "8", "8", "7"], 9, 4),
        (StopRule("window", window=2), ["7", "8", "9", "9"], 9, 4),
        # Majority stops once the runner-up could not catch up: 5 of 9 at the latest.
        (StopRule("majority"), ["7"] * 9, 9, 5),
        (StopRule("majority"), ["7", "8", "7", "7", "7"], 5, 4),
        # "all" waits for every candidate.
        (StopRule("all"), ["7"] * 5, 5, 5),
    ],
)
def test_each_rule_fires_at_its_exact_step(
    rule: StopRule, answers: list[str], total: int, step: int
) -> None:
    assert first_settled(rule, answers, total) == step


def test_every_rule_stops_when_the_winner_can_no_longer_change() -> None:
    # 3 votes to 0 with one candidate left: even all four rules' weakest case is settled.
    for name in ("adaptive", "window", "majority"):
        assert StopRule(name, confidence=0.999, window=9).settled(tally("a", "a", "a"), 1)


def test_a_vote_without_any_answer_is_not_settled_early() -> None:
    assert not StopRule("adaptive").settled(tally(None, None), 3)
    assert StopRule("adaptive").settled(tally(None, None), 0)


def test_the_winner_has_most_votes_and_its_likeliest_candidate_comes_first() -> None:
    votes = Tally(
        (
            Ballot(0, "b", -0.1),
            Ballot(1, "a", -0.9),
            Ballot(2, "a", -0.3),
            Ballot(3, None, 0.0),
        )
    )
    assert votes.ranking() == ["a", "b"]
    assert votes.winners() == [2, 1, 0, 3]


def test_a_tie_goes_to_the_answer_the_model_found_likelier() -> None:
    votes = tally("x", "y", "y", "x", likelihood={"x": -0.2, "y": -0.7})
    assert votes.ranking() == ["x", "y"]
    assert votes.winners()[0] in (0, 3)
