"""Structured output on SmolLM2: every answer validates, and grammar drafts change nothing.

Extraction and classification schemas of the kinds Reame's users send (an invoice, a support
ticket, a product, a label from an enum) cover enums, nested objects, arrays with minItems
and maxItems, maxLength, pattern, bounded numbers, optional fields and additionalProperties
false. Every answer, greedy or sampled, must parse and validate with `jsonschema`.

Forced tokens are certain drafts, appended unverified in a step of several tokens: the
tokens after them are computed along a multi-token path: greedy answers with them must
equal the plain constrained path token for token where the server's check finds verifying
drafts exact for SmolLM2 here, and elsewhere up to a first divergence at a near-tie of
that path (near_tie.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jsonschema
import pytest
from near_tie import TOP, VERIFY_FLIP_RATE_Q4_1, assert_near_ties, plain_run

from reame_core.backend.base import Backend
from reame_core.backend.llama import LlamaBackend
from reame_core.chat import encode_chat
from reame_core.engine.engine import Engine
from reame_core.errors import RequestError
from reame_core.plugins import PluginHost
from reame_core.request import FinishEvent, GenerationRequest, SamplingParams
from reame_core.settings import Settings
from reame_suggeritore.plugin import Suggeritore
from reame_suggeritore.tokenizer import build_tokenizer

MakeEngine = Callable[..., Engine]
Together = Callable[[Engine, Sequence[GenerationRequest]], list[FinishEvent]]

INVOICE = {
    "type": "object",
    "properties": {
        "invoice_number": {"type": "string", "pattern": "^INV-[0-9]{3,6}$"},
        "vendor": {"type": "string", "maxLength": 40},
        "currency": {"enum": ["EUR", "USD", "GBP"]},
        "lines": {
            "type": "array",
            "minItems": 1,
            "maxItems": 4,
            "items": {
                "type": "object",
                "properties": {
                    "item": {"type": "string", "maxLength": 30},
                    "quantity": {"type": "integer", "minimum": 1, "maximum": 999},
                },
                "required": ["item", "quantity"],
                "additionalProperties": False,
            },
        },
        "total": {"type": "number", "minimum": 0, "maximum": 100000},
        "due_date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
    },
    "required": ["invoice_number", "vendor", "currency", "lines", "total"],
    "additionalProperties": False,
}
TICKET = {
    "type": "object",
    "properties": {
        "customer": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 30},
                "email": {"type": "string", "pattern": "^[a-z0-9.]+@[a-z0-9.]+$", "maxLength": 40},
            },
            "required": ["name"],
            "additionalProperties": False,
        },
        "priority": {"enum": ["low", "medium", "high", "urgent"]},
        "category": {"enum": ["billing", "bug", "account", "other"]},
        "summary": {"type": "string", "maxLength": 60},
        "needs_reply": {"type": "boolean"},
    },
    "required": ["customer", "priority", "category", "summary"],
    "additionalProperties": False,
}
PRODUCT = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "price": {"type": "number", "minimum": 0, "maximum": 10000},
        "tags": {
            "type": "array",
            "items": {"type": "string", "maxLength": 15},
            "minItems": 1,
            "maxItems": 3,
        },
        "in_stock": {"type": "boolean"},
        "rating": {"type": "integer", "minimum": 1, "maximum": 5},
    },
    "required": ["name", "price", "tags", "in_stock"],
    "additionalProperties": False,
}
SENTIMENT = {
    "type": "object",
    "properties": {"label": {"enum": ["positive", "negative", "neutral"]}},
    "required": ["label"],
    "additionalProperties": False,
}
CASES = [
    (
        INVOICE,
        "Invoice INV-2291 from Cartoleria Rossi: 3 boxes of paper, 2 printer cartridges. "
        "Total 117.48 EUR, due 2024-04-11.",
    ),
    (INVOICE, "Bill no. INV-77 from ACME Ltd for 10 hammers, total 250 USD."),
    (
        TICKET,
        "From: Anna Bianchi <anna@example.com>. I was charged twice this month, please "
        "refund one payment as soon as possible!",
    ),
    (TICKET, "Hi, the app crashes when I open settings. -- Marco"),
    (PRODUCT, "The Trailblazer backpack, 35 litres, waterproof, 89.90 euros, in stock, 4 stars."),
    (PRODUCT, "Blue ceramic mug, 12 dollars, sold out."),
    (SENTIMENT, "I love this phone, the battery lasts for days."),
    (SENTIMENT, "The delivery was late and the box was broken."),
]
MAX_TOKENS = 300


def ask(
    backend: Backend, schema: dict[str, Any], document: str, **params: Any
) -> GenerationRequest:
    messages = [
        {"role": "system", "content": "Extract the information as JSON."},
        {"role": "user", "content": document},
    ]
    return GenerationRequest(
        encode_chat(backend.info, messages),
        SamplingParams(max_tokens=MAX_TOKENS, **params),
        extensions={"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}},
    )


@pytest.fixture(scope="module")
def constrained(backend: LlamaBackend) -> Iterator[PluginHost]:
    """The plugins with Il Suggeritore, configured for SmolLM2 (its tokenizer built once)."""
    host = PluginHost(discover=False)
    host.register(Suggeritore(), "suggeritore")
    host.hook.reame_configure(settings=Settings(), model=backend.info, hook=host.hook)
    yield host


def validated(finished: FinishEvent, schema: dict[str, Any]) -> list[Any]:
    assert finished.error is None
    answers = []
    for candidate in finished.candidates:
        assert candidate.finish_reason == "stop", candidate.text
        answer = json.loads(candidate.text)
        jsonschema.validate(answer, schema)
        answers.append(answer)
    return answers


def test_greedy_extractions_validate(
    backend: LlamaBackend,
    constrained: PluginHost,
    make_engine: MakeEngine,
    generate_together: Together,
) -> None:
    engine = make_engine(backend, plugins=constrained)

    results = generate_together(engine, [ask(backend, s, d) for s, d in CASES])

    for (schema, _), finished in zip(CASES, results, strict=True):
        validated(finished, schema)


def test_a_classification_picks_one_of_the_enum(
    backend: LlamaBackend, constrained: PluginHost, make_engine: MakeEngine
) -> None:
    engine = make_engine(backend, plugins=constrained)

    finished = engine.generate(ask(backend, SENTIMENT, CASES[6][1]))

    (answer,) = validated(finished, SENTIMENT)
    assert answer["label"] in ("positive", "negative", "neutral")


@pytest.mark.parametrize("seed", range(3))
def test_sampled_extractions_validate(
    backend: LlamaBackend,
    constrained: PluginHost,
    make_engine: MakeEngine,
    generate_together: Together,
    seed: int,
) -> None:
    engine = make_engine(backend, plugins=constrained, speculate="auto")
    requests = [
        ask(backend, s, d, temperature=1.0, seed=seed * 100 + i) for i, (s, d) in enumerate(CASES)
    ]

    results = generate_together(engine, requests)

    for (schema, _), finished in zip(CASES, results, strict=True):
        validated(finished, schema)


def test_n_sampled_candidates_each_validate(
    backend: LlamaBackend, constrained: PluginHost, make_engine: MakeEngine
) -> None:
    engine = make_engine(backend, plugins=constrained)
    request = ask(backend, TICKET, CASES[2][1], temperature=0.9, seed=11)
    request.n = 4

    finished = engine.generate(request)

    assert len(validated(finished, TICKET)) == 4


def test_greedy_answers_with_grammar_drafts_equal_the_plain_ones(
    backend: LlamaBackend,
    constrained: PluginHost,
    make_engine: MakeEngine,
    verification_exact: bool,
) -> None:
    engine = make_engine(backend, plugins=constrained, speculate="on")
    plains, drafted = [], []
    proposed = accepted = 0

    for schema, document in CASES:
        plains.append(
            plain_run(engine, ask(backend, schema, document, logprobs=TOP, speculate="off"))
        )
        finished = engine.generate(ask(backend, schema, document))
        drafted.append(finished.candidates[0].tokens)
        validated(finished, schema)
        proposed += finished.usage.draft_proposed.get("suggeritore", 0)
        accepted += finished.usage.draft_accepted.get("suggeritore", 0)

    assert_near_ties(plains, drafted, VERIFY_FLIP_RATE_Q4_1, exact=verification_exact)
    print(f"grammar drafts: {accepted} of {proposed} accepted")
    assert accepted >= 0.8 * proposed > 0


def test_the_governor_asks_for_forced_drafts_and_they_pay(
    backend: LlamaBackend, constrained: PluginHost, make_engine: MakeEngine
) -> None:
    engine = make_engine(backend, plugins=constrained, speculate="auto")

    for schema, document in CASES:
        validated(engine.generate(ask(backend, schema, document)), schema)

    report = engine.governor.report()
    source = next(s for s in report["sources"] if s["source"] == "suggeritore")
    print(source)
    assert source["accepted"] > 0
    assert source["acceptance_rate"] > 0.8


@pytest.mark.parametrize(
    ("field", "value"),
    [
        (
            "json_schema",
            {"type": "object", "properties": {"a": {"type": "string", "pattern": "(x+x+)+y"}}},
        ),
        ("regex", "[ab]*a[ab]{40}"),
        ("regex", "(.*a){30}"),
        (
            "grammar",
            "root ::= x0\n"
            + "\n".join(f"x{i} ::= x{i + 1} x{i + 1}" for i in range(40))
            + '\nx40 ::= "ab"',
        ),
    ],
)
def test_hard_grammars_on_the_real_vocabulary_are_refused_or_answered_in_bounds(
    backend: LlamaBackend, constrained: PluginHost, make_engine: MakeEngine, field: str, value: Any
) -> None:
    engine = make_engine(backend, plugins=constrained)
    request = GenerationRequest(
        encode_chat(backend.info, [{"role": "user", "content": "Go."}]),
        SamplingParams(max_tokens=24),
        extensions={field: value},
    )
    try:
        engine.check(request)
    except RequestError as error:
        assert error.param == field
        return
    finished = engine.generate(request)
    assert finished.error is None


def test_the_grammar_tokenizer_keeps_control_tokens_apart(backend: LlamaBackend) -> None:
    vocab = backend.info.vocab
    (im_end,) = vocab.tokenize("<|im_end|>", add_special=False, parse_special=True)
    text = vocab.tokenize("<|im_end|> hello", add_special=False, parse_special=False)

    control = vocab.control_tokens()
    tokenizer = build_tokenizer(backend.info)

    assert im_end in control and not control & set(text)
    assert tokenizer.is_special_token(im_end)
    assert not any(tokenizer.is_special_token(token) for token in text)
