"""What the Conclave's tests share: a third-party plugin that offers answer extractors
and records every candidate the engine ran, and an engine voting with it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from reame_conclave.plugin import Conclave
from reame_core.backend.fake import FakeBackend
from reame_core.engine.engine import Engine
from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import AnswerExtractor, SequenceView


@dataclass
class Ran:
    """One candidate as it ended: its number, tokens, finish reason and temperature."""

    candidate: int
    tokens: tuple[int, ...]
    reason: str
    temperature: float


@dataclass
class Witness:
    """A third-party plugin: extractor "constant" (every text answers "x") and "length"
    (the answer is the text's length), and a record of the candidates that ran."""

    ran: list[Ran] = field(default_factory=list)
    starts: list[tuple[str, int]] = field(default_factory=list)  # (request id, candidate)
    started: int = 0
    most_at_once: int = 0
    running: int = 0

    @hookimpl
    def reame_answer_extractors(self) -> Mapping[str, AnswerExtractor]:
        return {
            "constant": lambda text, arg: "x",
            "length": lambda text, arg: str(len(text)),
            "broken": lambda text, arg: str(1 / 0),
        }

    @hookimpl
    def reame_sequence_started(self, seq: SequenceView) -> None:
        self.started += 1
        self.starts.append((seq.request_id, getattr(seq, "candidate", -1)))
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)

    @hookimpl
    def reame_generation_finished(self, seq: SequenceView, finish_reason: str, text: str) -> None:
        self.running -= 1
        candidate = getattr(seq, "candidate", -1)
        self.ran.append(
            Ran(candidate, tuple(seq.output_tokens), finish_reason, seq.params.temperature)
        )

    def by_candidate(self) -> dict[int, Ran]:
        return {ran.candidate: ran for ran in self.ran}


@dataclass
class Voting:
    engine: Engine
    conclave: Conclave
    witness: Witness
    backend: FakeBackend
