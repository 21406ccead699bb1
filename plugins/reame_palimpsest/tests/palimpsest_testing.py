"""Helpers of the archive's tests (fixtures are in conftest.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reame_core.backend.fake import FakeBackend
from reame_core.engine.engine import Engine
from reame_core.request import FinishEvent, GenerationRequest, SamplingParams
from reame_palimpsest.plugin import Palimpsest


@dataclass
class ArchivedEngine:
    """One running engine with its own palimpsest plugin: a server process, in miniature."""

    engine: Engine
    archive: Palimpsest
    backend: FakeBackend

    def text(self, text: str) -> list[int]:
        return self.backend.tokenize(text, add_special=True, parse_special=False)

    def generate(
        self,
        prompt: Sequence[int],
        max_tokens: int = 32,
        *,
        extensions: Mapping[str, Any] | None = None,
        speculate: str = "on",
    ) -> FinishEvent:
        """One greedy request, then wait until it is archived and indexed."""
        params = SamplingParams(max_tokens=max_tokens, speculate=speculate)  # type: ignore[arg-type]
        request = GenerationRequest(list(prompt), params, extensions=dict(extensions or {}))
        finished = self.engine.generate(request)
        assert finished.error is None, finished.error
        assert self.archive.flush()
        return finished

    def tokens(self, finished: FinishEvent) -> list[int]:
        return list(finished.candidates[0].tokens)

    def reference(self, prompt: Sequence[int], max_tokens: int = 32) -> list[int]:
        """Greedy tokens computed straight from the fake model: no engine, no drafts."""
        output: list[int] = []
        while len(output) < max_tokens:
            token = int(np.argmax(self.backend.logits_after([*prompt, *output])))
            if token in self.backend.info.eog:
                break
            output.append(token)
        return output

    def stats(self) -> dict[str, Any]:
        result = self.archive.reame_collect_stats()
        assert result is not None
        return dict(result["palimpsest"])


StartArchive = Callable[..., ArchivedEngine]


@dataclass
class FinishedSequence:
    """A SequenceView of a finished candidate, for calling the hooks directly."""

    prompt_tokens: Sequence[int]
    output_tokens: Sequence[int]
    extensions: Mapping[str, Any] = field(default_factory=dict)
    key: int = 1
    request_id: str = "req-test"
    candidate: int = 0
    params: SamplingParams = field(default_factory=SamplingParams)


def accepted(finished: FinishEvent) -> int:
    return finished.usage.draft_accepted.get("palimpsest", 0)
