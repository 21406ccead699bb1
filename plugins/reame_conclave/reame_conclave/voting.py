"""The vote: a tally of the answers, its winner, and the rules that say it is settled.

A candidate votes with its answer once it has finished ("stop"; one cut off by
`max_tokens` has no final answer and does not vote). The answer with most votes wins;
a tie goes to the answer whose candidates the model found likelier (mean per-token
log-probability), and the winning answer's likeliest candidate is the one returned.

Stopping rules look at the answers in the order candidates finished and at how many
candidates may still vote:

- ``all``: no early stop, every candidate runs.
- ``majority``: stop once the remaining candidates could not change the winner (the
  leader has more votes than the runner-up could reach). The result is the one a full
  run gives, save how a tie would have been broken.
- ``adaptive`` (Adaptive-Consistency, Aggarwal et al., 2023): stop once the probability
  that the leader's answer is truly ahead of the runner-up's, under a uniform Beta prior
  on their shares, reaches `confidence` (0.95: four agreeing answers suffice).
- ``window`` (Early-Stopping Self-Consistency, Li et al., 2024): stop once the last
  `window` answers agree.

Every rule but ``all`` also stops when the winner can no longer change.
Pure functions and values: the plugin holds no state between calls.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from math import comb
from typing import Literal

from reame_core.hooktypes import CandidateView

Rule = Literal["adaptive", "window", "majority", "all"]


@dataclass(frozen=True)
class Ballot:
    """One candidate's vote: its answer (None: it gave none) and how likely the model
    found its text (mean log-probability per token)."""

    candidate: int
    answer: str | None
    mean_logprob: float


def ballot(view: CandidateView, answer: str | None) -> Ballot:
    mean = view.cumulative_logprob / len(view.tokens) if view.tokens else float("-inf")
    return Ballot(view.candidate, answer, mean)


@dataclass(frozen=True)
class Tally:
    """The votes so far, in the order the candidates finished."""

    ballots: tuple[Ballot, ...]

    @property
    def answers(self) -> list[str]:
        return [b.answer for b in self.ballots if b.answer is not None]

    def counts(self) -> Counter[str]:
        return Counter(self.answers)

    def ranking(self) -> list[str]:
        """Answers from most to fewest votes; ties by the mean log-probability of their
        candidates."""
        counts = self.counts()
        likelihood = {
            answer: _mean([b.mean_logprob for b in self.ballots if b.answer == answer])
            for answer in counts
        }
        return sorted(counts, key=lambda answer: (-counts[answer], -likelihood[answer]))

    def winners(self) -> list[int]:
        """Candidates in the order they should be returned: those of the winning answer
        first, likeliest first, then the next answer's, and finally those without an
        answer."""
        order = {answer: place for place, answer in enumerate(self.ranking())}
        return [
            b.candidate
            for b in sorted(
                self.ballots,
                key=lambda b: (
                    order.get(b.answer, len(order)) if b.answer is not None else len(order),
                    -b.mean_logprob,
                ),
            )
        ]


@dataclass(frozen=True)
class StopRule:
    """When a vote is settled before every candidate has voted."""

    name: Rule = "adaptive"
    confidence: float = 0.95
    window: int = 3

    def settled(self, tally: Tally, remaining: int) -> bool:
        """Whether the vote may stop with `remaining` candidates still to vote."""
        if remaining == 0:
            return True
        if self.name == "all":
            return False
        top = tally.counts().most_common(2)
        leader = top[0][1] if top else 0
        runner_up = top[1][1] if len(top) > 1 else 0
        if leader > runner_up + remaining:
            return True
        if self.name == "adaptive":
            return leader > 0 and beta_lead(leader, runner_up) >= self.confidence
        if self.name == "window":
            recent = tally.answers[-self.window :]
            return len(recent) == self.window and len(set(recent)) == 1
        return False


def beta_lead(leader: int, runner_up: int) -> float:
    """P(p > 1/2) for p ~ Beta(leader + 1, runner_up + 1): the chance the leader's answer
    has the larger share, given these votes and a uniform prior. For integer parameters
    this is a binomial tail, computed exactly: P(Binomial(a + b - 1, 1/2) < a)."""
    a, b = leader + 1, runner_up + 1
    n = a + b - 1
    return float(sum(comb(n, k) for k in range(a)) / 2**n)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("-inf")
