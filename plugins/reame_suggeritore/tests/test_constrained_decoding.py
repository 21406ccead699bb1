"""Constrained decoding and forced-token drafts on the fake backend."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

import jsonschema
import numpy as np
import pytest

from reame_core.backend.base import Batch
from reame_core.backend.fake import FakeBackend
from reame_core.engine.engine import Engine
from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import DraftProposal, DraftRequest
from reame_core.request import FinishEvent, GenerationRequest, SamplingParams

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "kind": {"enum": ["alpha", "beta", "gamma"]},
        "tags": {
            "type": "array",
            "items": {"type": "string", "maxLength": 6},
            "minItems": 1,
            "maxItems": 3,
        },
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
    },
    "required": ["name", "kind", "tags", "code"],
    "additionalProperties": False,
}
StartEngine = Callable[..., Engine]
REGEX = r"(yes|no): [a-z ]{4,30}\."
PROMPTS = ["Describe the item.", "Classify this ticket.", "Extract the fields.", "Answer."]


def prompt(text: str) -> list[int]:
    return FakeBackend().tokenize(text, add_special=True, parse_special=False)


def request(text: str, max_tokens: int = 200, **fields: Any) -> GenerationRequest:
    params: dict[str, Any] = {"max_tokens": max_tokens}
    for name in ("temperature", "seed", "speculate"):
        if name in fields:
            params[name] = fields.pop(name)
    return GenerationRequest(prompt(text), SamplingParams(**params), extensions=fields)


def answer(finished: FinishEvent, candidate: int = 0) -> str:
    assert finished.error is None
    return finished.candidates[candidate].text


class WrongGuesses:
    """A draft source that proposes tokens the grammar allows but the model does not pick
    (spaces, then letters from the end of the alphabet), so the constraint consumes them as
    pending and must roll them back."""

    def __init__(self) -> None:
        self.proposed = 0

    @hookimpl
    def reame_propose_drafts(self, requests: Sequence[DraftRequest]) -> list[DraftProposal]:
        guess = tuple(b"  zzyx")
        self.proposed += len(requests)
        return [DraftProposal(r.seq, "wrong", guess[: r.max_tokens]) for r in requests]


# ------------------------------------------------------------------ outputs


@pytest.mark.parametrize("text", PROMPTS)
def test_a_json_schema_answer_validates(start_engine: StartEngine, text: str) -> None:
    engine = start_engine()

    output = answer(engine.generate(request(text, json_schema=SCHEMA)))

    jsonschema.validate(json.loads(output), SCHEMA)


@pytest.mark.parametrize("text", PROMPTS)
def test_a_regex_answer_matches(start_engine: StartEngine, text: str) -> None:
    engine = start_engine()

    output = answer(engine.generate(request(text, regex=REGEX)))

    assert re.fullmatch(REGEX, output)


def test_a_gbnf_answer_follows_the_grammar(start_engine: StartEngine) -> None:
    grammar = 'root ::= "colour: " colour "\\n"\ncolour ::= "red" | "green" | "blue"'
    engine = start_engine()

    output = answer(engine.generate(request("Pick.", grammar=grammar)))

    assert output in ("colour: red\n", "colour: green\n", "colour: blue\n")


def test_json_object_gives_any_json_object(start_engine: StartEngine) -> None:
    engine = start_engine()

    finished = engine.generate(
        request("Answer.", max_tokens=400, response_format={"type": "json_object"})
    )

    if finished.candidates[0].finish_reason == "stop":
        assert isinstance(json.loads(answer(finished)), dict)
    else:  # a free object may run on; its start is still an object's
        assert answer(finished).startswith("{")


@pytest.mark.parametrize("seed", range(8))
def test_sampled_answers_validate(start_engine: StartEngine, seed: int) -> None:
    engine = start_engine()

    finished = engine.generate(request("Extract.", json_schema=SCHEMA, temperature=1.0, seed=seed))

    jsonschema.validate(json.loads(answer(finished)), SCHEMA)


def test_max_tokens_cuts_a_structured_answer_with_finish_reason_length(
    start_engine: StartEngine,
) -> None:
    engine = start_engine()

    finished = engine.generate(request("Extract.", max_tokens=10, json_schema=SCHEMA))

    assert finished.candidates[0].finish_reason == "length"
    assert len(finished.candidates[0].tokens) == 10
    with pytest.raises(json.JSONDecodeError):
        json.loads(answer(finished))


# ------------------------------------------------------------------- drafts


@pytest.mark.parametrize("text", PROMPTS)
@pytest.mark.parametrize("sampled", [False, True])
def test_forced_drafts_give_exactly_the_answer_without_drafts(
    start_engine: StartEngine, text: str, sampled: bool
) -> None:
    engine = start_engine(speculate="on")
    sampling: dict[str, Any] = {"temperature": 0.8, "seed": 7} if sampled else {}

    drafted = engine.generate(request(text, json_schema=SCHEMA, **sampling))
    plain = engine.generate(request(text, json_schema=SCHEMA, speculate="off", **sampling))

    assert drafted.candidates[0].tokens == plain.candidates[0].tokens
    assert "suggeritore" not in plain.usage.draft_proposed
    proposed = drafted.usage.draft_proposed["suggeritore"]
    assert proposed >= len('{"name": "", "kind": "", "tags": [""], "code": "-"}') // 2
    assert drafted.usage.draft_accepted["suggeritore"] == proposed  # forced: always right


@pytest.mark.parametrize("logprobs", [None, 2])
def test_certain_drafts_are_computed_without_rows_of_logits_of_their_own(
    start_engine: StartEngine, logprobs: int | None
) -> None:
    engine = start_engine(speculate="on")
    backend: FakeBackend = engine.backend  # type: ignore[assignment]
    shapes: list[tuple[int, int]] = []
    decode = backend.decode

    def spy(batch: Batch) -> np.ndarray:
        shapes.append((len(batch), batch.n_outputs))
        return decode(batch)

    backend.decode = spy  # type: ignore[method-assign]
    drafted = request("Extract.", json_schema=SCHEMA)
    drafted.params = dataclasses.replace(drafted.params, logprobs=logprobs)
    plain = request("Extract.", json_schema=SCHEMA, speculate="off")
    plain.params = dataclasses.replace(plain.params, logprobs=logprobs)

    with_drafts = engine.generate(drafted)
    decode_steps = [shape for shape in shapes if shape[1] > 0][1:]  # after the prompt
    without = engine.generate(plain)

    assert with_drafts.candidates[0].tokens == without.candidates[0].tokens
    assert with_drafts.usage.draft_accepted["suggeritore"] > 0
    skipped = [tokens for tokens, rows in decode_steps if rows < tokens]
    if logprobs is None:  # a forced run and the token after it: one row
        assert skipped and all(rows == 1 for tokens, rows in decode_steps if rows < tokens)
    else:  # every token's logprob is asked for: every token has its row
        assert not skipped


@pytest.mark.parametrize("n_ctx_seq", range(20, 40))
def test_certain_drafts_end_at_the_context_where_one_token_steps_do(
    start_engine: StartEngine, n_ctx_seq: int
) -> None:
    drafted = start_engine(speculate="on", n_ctx_seq=n_ctx_seq)
    alone = start_engine(speculate="off", n_ctx_seq=n_ctx_seq)

    most = n_ctx_seq - len(prompt("Extract."))  # all the context allows: it ends first

    with_drafts = drafted.generate(request("Extract.", most, json_schema=SCHEMA))
    without = alone.generate(request("Extract.", most, json_schema=SCHEMA))

    assert with_drafts.candidates[0].tokens == without.candidates[0].tokens
    assert with_drafts.candidates[0].finish_reason == without.candidates[0].finish_reason
    assert with_drafts.usage.completion_tokens == without.usage.completion_tokens


def test_unconstrained_requests_get_no_grammar_drafts(start_engine: StartEngine) -> None:
    engine = start_engine(speculate="on")

    finished = engine.generate(request("Answer.", max_tokens=30))

    assert "suggeritore" not in finished.usage.draft_proposed


def test_rejected_drafts_leave_the_grammar_in_step(start_engine: StartEngine) -> None:
    wrong = WrongGuesses()
    guessed = start_engine(speculate="on", extra={"wrong": wrong})
    alone = start_engine(speculate="off")

    for text in PROMPTS:
        for fields in ({"regex": REGEX}, {"json_schema": SCHEMA}):
            with_wrong = guessed.generate(request(text, **fields))
            plain = alone.generate(request(text, **fields))
            assert with_wrong.candidates[0].tokens == plain.candidates[0].tokens
            assert with_wrong.usage.draft_proposed.get("wrong", 0) > 0
    assert wrong.proposed > 0


def test_drafts_the_grammar_refuses_are_rejected_without_harm(start_engine: StartEngine) -> None:
    class Nul:
        @hookimpl
        def reame_propose_drafts(self, requests: Sequence[DraftRequest]) -> list[DraftProposal]:
            return [DraftProposal(r.seq, "nul", (0,) * r.max_tokens) for r in requests]

    guessed = start_engine(speculate="on", extra={"nul": Nul()})
    alone = start_engine(speculate="off")

    with_nul = guessed.generate(request("Extract.", json_schema=SCHEMA))
    plain = alone.generate(request("Extract.", json_schema=SCHEMA))

    assert with_nul.candidates[0].tokens == plain.candidates[0].tokens
    assert with_nul.usage.draft_accepted.get("nul", 0) == 0


# ------------------------------------------------------------------ batching


def run_together(engine: Engine, requests: Sequence[GenerationRequest]) -> list[FinishEvent]:
    """Submit `requests` at once to an engine driven step by step: they share batches."""
    finished: dict[int, FinishEvent] = {}
    for index, item in enumerate(requests):

        def emit(event: object, index: int = index) -> None:
            if isinstance(event, FinishEvent):
                finished[index] = event

        engine.submit(item, emit)
    for _ in range(10_000):
        if not engine.step() and not engine.busy:
            break
    return [finished[i] for i in range(len(requests))]


def test_a_constrained_and_a_free_sequence_share_a_batch(start_engine: StartEngine) -> None:
    engine = start_engine(started=False)
    backend: FakeBackend = engine.backend  # type: ignore[assignment]
    free_prompt = prompt("Tell me.")

    constrained, free = run_together(
        engine, [request("Extract.", json_schema=SCHEMA), request("Tell me.", max_tokens=40)]
    )

    jsonschema.validate(json.loads(answer(constrained)), SCHEMA)
    expected: list[int] = []
    while len(expected) < 40:
        token = int(backend.logits_after([*free_prompt, *expected]).argmax())
        if token in backend.info.eog:
            break
        expected.append(token)
    assert list(free.candidates[0].tokens) == expected
    assert max(backend.batch_sizes) > 1


def test_each_of_n_candidates_is_constrained(start_engine: StartEngine) -> None:
    engine = start_engine()
    asked = request("Extract.", json_schema=SCHEMA, temperature=1.0, seed=3)
    asked.n = 2

    finished = engine.generate(asked)

    outputs = [answer(finished, i) for i in range(2)]
    for output in outputs:
        jsonschema.validate(json.loads(output), SCHEMA)
    assert outputs[0] != outputs[1]
