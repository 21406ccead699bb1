"""Helpers of the disk cache's tests (fixtures are in conftest.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from reame_core.backend.fake import IM_END, IM_START, FakeBackend
from reame_core.engine.engine import Engine
from reame_core.request import FinishEvent, GenerationRequest, SamplingParams
from reame_diskkv.plugin import DiskPrefixCache

SYSTEM = "You are the records clerk of a small harbour office. " * 8


@dataclass
class CachedEngine:
    """One running engine with its own diskkv plugin: a server process, in miniature."""

    engine: Engine
    cache: DiskPrefixCache
    backend: FakeBackend

    def chat(self, question: str, system: str = SYSTEM) -> list[int]:
        """A ChatML prompt: system message, then one user message."""
        text = (
            f"<|im_start|>system\n{system}<|im_end|>\n"
            f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
        )
        return self.backend.tokenize(text, add_special=True, parse_special=True)

    def text(self, text: str) -> list[int]:
        """A plain completion prompt (no chat turns)."""
        return self.backend.tokenize(text, add_special=True, parse_special=False)

    def generate(self, prompt: Sequence[int], max_tokens: int = 16) -> FinishEvent:
        """Run one greedy request, then wait until its snapshots are on disk."""
        request = GenerationRequest(list(prompt), SamplingParams(max_tokens=max_tokens))
        finished = self.engine.generate(request)
        assert finished.error is None, finished.error
        assert self.cache.flush()
        return finished

    def reference(self, prompt: Sequence[int], max_tokens: int = 16) -> list[int]:
        """Greedy tokens computed straight from the fake model: no engine, no cache."""
        output: list[int] = []
        while len(output) < max_tokens:
            token = int(np.argmax(self.backend.logits_after([*prompt, *output])))
            if token in self.backend.info.eog:
                break
            output.append(token)
        return output

    def stats(self) -> dict[str, Any]:
        result = self.cache.reame_collect_stats()
        assert result is not None
        return dict(result["diskkv"])


StartCache = Callable[..., CachedEngine]


def opening_length(prompt: Sequence[int]) -> int:
    """Tokens of a chat prompt that every question after its system message shares: through
    the end of the system message and the user turn's opening, `\n<|im_start|>user\n`."""
    end = list(prompt).index(IM_END) + 1
    opening = [ord("\n"), IM_START, *b"user\n"]
    assert list(prompt[end : end + len(opening)]) == opening
    return end + len(opening)


def entry_files(cache_dir: Path) -> list[Path]:
    return sorted((cache_dir / "v1").glob("*.kv"))


def temp_files(cache_dir: Path) -> list[Path]:
    return sorted((cache_dir / "v1").glob(".*.tmp"))
