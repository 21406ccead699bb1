"""The way a completion request goes through the server: where its prompt is tokenized, and
how the choices a candidate-selection plugin returns are numbered.

The 429 path (refused before the engine sees the request) is in `test_server_concurrency.py`;
every limit's error and its `param` in `test_server_errors.py`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import TestClient

from reame_core.backend.fake import BOS, FakeBackend, FakeVocabulary
from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import CandidateView, Selection
from reame_core.plugins import PluginHost
from reame_core.request import GenerationRequest
from reame_core.server.service import ON_LOOP_CHARS

Client = TestClient[Litestar]
CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"


def event_loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class RecordingVocabulary(FakeVocabulary):
    """The fake vocabulary, noting for each text it tokenizes whether that ran on the
    thread of an event loop."""

    def __init__(self) -> None:
        self.on_loop: dict[int, bool] = {}  # text length -> tokenized on the event loop

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        self.on_loop[len(text)] = event_loop_running()
        return super().tokenize(text, add_special=add_special, parse_special=parse_special)


LONG = "The sea is wide. " * (ON_LOOP_CHARS // 10)


@pytest.mark.parametrize(
    ("route", "body"),
    [
        (CHAT, {"messages": [{"role": "user", "content": LONG}]}),
        (TEXT, {"prompt": LONG}),
        (TEXT, {"prompt": "def f(x):\n", "suffix": LONG}),  # fill in the middle
    ],
)
def test_a_long_prompt_is_tokenized_off_the_event_loop(
    serve: Callable[..., Client], route: str, body: dict[str, Any]
) -> None:
    vocab = RecordingVocabulary()
    client = serve(backend=FakeBackend(vocab=vocab))

    response = client.post(route, json={**body, "max_tokens": 4})

    assert response.status_code == 200, response.text
    long_texts = [length for length in vocab.on_loop if length >= len(LONG)]
    assert long_texts
    assert not any(vocab.on_loop[length] for length in long_texts)


def test_a_short_prompt_is_tokenized_on_the_event_loop(serve: Callable[..., Client]) -> None:
    # Below ON_LOOP_CHARS a hand-off to a thread costs more than tokenizing: the recorder
    # sees the loop, so the test above can tell the two apart.
    vocab = RecordingVocabulary()
    client = serve(backend=FakeBackend(vocab=vocab))

    assert client.post(TEXT, json={"prompt": "The sea", "max_tokens": 4}).status_code == 200
    assert vocab.on_loop == {len("The sea"): True}


class LastAndFirst:
    """Candidate selection that returns two of a request's candidates: the last, then the
    first. It keeps every candidate's text by prompt."""

    def __init__(self) -> None:
        self.texts: dict[tuple[int, ...], list[str]] = {}

    @hookimpl
    def reame_select_candidates(
        self, request: GenerationRequest, candidates: Sequence[CandidateView], final: bool
    ) -> Selection | None:
        if not final:
            return None
        self.texts[tuple(request.prompt_tokens)] = [c.text for c in candidates]
        return Selection((candidates[-1].candidate, candidates[0].candidate))


def test_choices_of_a_subset_selection_are_numbered_densely_in_the_order_returned(
    serve: Callable[..., Client], plugins: PluginHost
) -> None:
    selection = LastAndFirst()
    plugins.register(selection, "last_and_first")
    client = serve()
    prompts = ["The sea", "A mountain"]

    response = client.post(
        TEXT, json={"prompt": prompts, "n": 3, "temperature": 1, "seed": 5, "max_tokens": 8}
    )

    assert response.status_code == 200, response.text
    choices = response.json()["choices"]
    assert [choice["index"] for choice in choices] == [0, 1, 2, 3]
    texts = [selection.texts[(BOS, *prompt.encode())] for prompt in prompts]
    assert all(len(set(candidates)) > 1 for candidates in texts)  # seeds differ per candidate
    expected = [texts[0][2], texts[0][0], texts[1][2], texts[1][0]]
    assert [choice["text"] for choice in choices] == expected
