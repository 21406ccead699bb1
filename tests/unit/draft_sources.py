"""Draft sources written as a third party would write them, shared by the speculation tests.

Each is a class with one ``reame_propose_drafts`` hook implementation, registered on a
`PluginHost` by name (`drafting`), without the built-in prompt lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from reame_core.backend.fake import FakeBackend
from reame_core.engine.engine import Engine
from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import DraftProposal, DraftRequest
from reame_core.plugins import PluginHost
from reame_core.request import GenerationRequest, SamplingParams

SOURCE = "my-drafts"


class KnownAnswers:
    """Proposes the rest of an answer it knows; with `wrong_every`, every n-th token
    of the answer is guessed wrong (a mostly-right source); with `wrong_before`, the
    answer's first tokens are (a preamble before the text it copies)."""

    def __init__(
        self,
        answers: dict[tuple[int, ...], Sequence[int]],
        wrong_every: int = 0,
        wrong_before: int = 0,
    ):
        self.answers = answers
        self.wrong_every = wrong_every
        self.wrong_before = wrong_before

    def _wrong(self, index: int) -> bool:
        return index < self.wrong_before or bool(
            self.wrong_every and (index + 1) % self.wrong_every == 0
        )

    @hookimpl
    def reame_propose_drafts(self, requests: Sequence[DraftRequest]) -> list[DraftProposal]:
        proposals = []
        for request in requests:
            answer = self.answers.get(tuple(request.seq.prompt_tokens), ())
            done = len(request.seq.output_tokens)
            if list(answer[:done]) != list(request.seq.output_tokens):
                continue
            guess = [
                0 if self._wrong(done + i) else token
                for i, token in enumerate(answer[done : done + request.max_tokens])
            ]
            if guess:
                proposals.append(DraftProposal(request.seq, SOURCE, tuple(guess)))
        return proposals


class AlwaysWrong:
    """Proposes NUL bytes, which the fake model never predicts; counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    @hookimpl
    def reame_propose_drafts(self, requests: Sequence[DraftRequest]) -> list[DraftProposal]:
        self.calls += 1
        return [DraftProposal(r.seq, SOURCE, (0,) * r.max_tokens) for r in requests]


class RightFor:
    """Proposes the answer for the prompts it knows and NUL bytes for the others: a
    source that pays for some requests only."""

    def __init__(self, answers: dict[tuple[int, ...], Sequence[int]]):
        self.known = KnownAnswers(answers)
        self.wrong = AlwaysWrong()

    @hookimpl
    def reame_propose_drafts(self, requests: Sequence[DraftRequest]) -> list[DraftProposal]:
        mine = [r for r in requests if tuple(r.seq.prompt_tokens) in self.known.answers]
        others = [r for r in requests if tuple(r.seq.prompt_tokens) not in self.known.answers]
        return [
            *self.known.reame_propose_drafts(mine),
            *self.wrong.reame_propose_drafts(others),
        ]


class Slow:
    """Proposes what `inner` does, taking `seconds_per_token` per token of its longest
    draft (plus one: the call itself), as a draft model decodes once per drafted token.
    `sleep` is the clock the engine times it with; `calls` counts the calls."""

    def __init__(
        self, inner: Any, seconds_per_token: float, sleep: Callable[[float], None]
    ) -> None:
        self.inner = inner
        self.seconds_per_token = seconds_per_token
        self.sleep = sleep
        self.calls = 0

    @hookimpl
    def reame_propose_drafts(self, requests: Sequence[DraftRequest]) -> list[DraftProposal]:
        self.calls += 1
        proposals: list[DraftProposal] = self.inner.reame_propose_drafts(requests)
        longest = max((len(p.tokens) for p in proposals), default=0)
        self.sleep(self.seconds_per_token * (1 + longest))
        return proposals


def drafting(*sources: object, names: Sequence[str] = (SOURCE,)) -> PluginHost:
    """The sources alone, registered under `names`: the built-in prompt lookup would
    propose too."""
    host = PluginHost(["prompt_lookup"], discover=False)
    for source, name in zip(sources, names, strict=True):
        host.register(source, name)
    return host


def request(prompt: Sequence[int], **params: Any) -> GenerationRequest:
    return GenerationRequest(list(prompt), SamplingParams(**params))


def fake(engine: Engine) -> FakeBackend:
    assert isinstance(engine.backend, FakeBackend)
    return engine.backend
