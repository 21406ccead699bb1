"""Draft sources written as a third party would write them, shared by the speculation tests.

Each is a class with one ``reame_propose_drafts`` hook implementation, registered on a
`PluginHost` by name (`drafting`), without the built-in prompt lookup.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    of the answer is guessed wrong (a mostly-right source)."""

    def __init__(self, answers: dict[tuple[int, ...], Sequence[int]], wrong_every: int = 0):
        self.answers = answers
        self.wrong_every = wrong_every

    @hookimpl
    def reame_propose_drafts(self, requests: Sequence[DraftRequest]) -> list[DraftProposal]:
        proposals = []
        for request in requests:
            answer = self.answers.get(tuple(request.seq.prompt_tokens), ())
            done = len(request.seq.output_tokens)
            if list(answer[:done]) != list(request.seq.output_tokens):
                continue
            guess = [
                0 if self.wrong_every and (done + i + 1) % self.wrong_every == 0 else token
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


def drafting(source: object) -> PluginHost:
    """The source alone: the built-in prompt lookup would propose too."""
    host = PluginHost(["prompt_lookup"], discover=False)
    host.register(source, SOURCE)
    return host


def request(prompt: Sequence[int], **params: Any) -> GenerationRequest:
    return GenerationRequest(list(prompt), SamplingParams(**params))


def fake(engine: Engine) -> FakeBackend:
    assert isinstance(engine.backend, FakeBackend)
    return engine.backend
