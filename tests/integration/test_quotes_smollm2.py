"""Quote drafts on SmolLM2: its tokenizer splits a word one way in the document (` Officina`)
and another after an answer's quote (`"Off`), which is what the source matches across; its
drafts, closed with the keys a schema forces, must never change what the plain path says.

Verifying drafts is exact only up to near-ties on some builds, so greedy outputs with the
source on must equal the plain path up to a first divergence at a near-tie (near_tie.py).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from near_tie import TOP, VERIFY_FLIP_RATE_Q4_1, assert_near_ties, plain_run

from reame_core.backend.llama import LlamaBackend
from reame_core.chat import encode_chat
from reame_core.engine.engine import Engine
from reame_core.plugins import PluginHost
from reame_core.request import GenerationRequest, SamplingParams
from reame_core.settings import Settings
from reame_suggeritore.plugin import Suggeritore
from reame_suggeritore.quotes import NAME, Quotation, QuoteDrafts

MakeEngine = Callable[..., Engine]

DOCUMENTS = (
    "INVOICE No. 2024-0387\nDate: 14 March 2024\nFrom: Officina Verdi Srl, Via Roma 12, "
    "Bologna\nTo: Lanterna Lamps, attn. Giulia Ferri\nTotal due: 67.50 EUR within 30 days.",
    "Your parcel is on its way! Order 77-1193 from Bookhaven was handed to FastPost on "
    "5 June 2024. Recipient: Sara Lindqvist, Storgatan 4, Uppsala. Shipping paid: 4.90 EUR.",
    "We're hiring: Junior Data Analyst at Meridian Analytics (Lisbon, hybrid). Salary from "
    "32,000 EUR a year. Apply by 30 April 2024 to the hiring manager, Tomas Pereira.",
)
SCHEMA = {
    "type": "object",
    "properties": {
        "organization": {"type": "string", "maxLength": 60},
        "contact_name": {"type": "string", "maxLength": 40},
        "date": {"type": "string", "maxLength": 30},
        "amount": {"type": "number"},
    },
    "required": ["organization", "contact_name", "date", "amount"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    ("answer", "draft"),
    [
        ('{"organization": "Offic', 'ina Verdi Srl"'),
        ('{"contact_name": "Giulia Fer', 'ri"'),
        ('{"date": "14 March', ' 2024"'),
        ('{"amount": 67.', "50"),
    ],
)
def test_a_quote_is_tokenized_as_smollm2_tokenizes_the_whole_answer(
    backend: LlamaBackend, answer: str, draft: str
) -> None:
    vocab = backend.info.vocab
    written = vocab.tokenize(answer, add_special=False, parse_special=False)

    quote = quoted(backend, written)

    assert text(backend, quote) == draft
    assert [*written, *quote] == vocab.tokenize(
        answer + draft, add_special=False, parse_special=False
    )


def test_an_answer_that_split_a_word_otherwise_gets_the_rest_split_on_its_own(
    backend: LlamaBackend,
) -> None:
    vocab = backend.info.vocab
    # SmolLM2 writes "Offic" "ina"; an answer that wrote "Off" still gets the rest.
    written = vocab.tokenize('{"organization": "Off', add_special=False, parse_special=False)

    assert text(backend, quoted(backend, written)) == 'icina Verdi Srl"'


def quoted(backend: LlamaBackend, written: list[int]) -> tuple[int, ...]:
    vocab = backend.info.vocab
    quotation = Quotation(
        vocab, vocab.tokenize(DOCUMENTS[0], add_special=False, parse_special=False)
    )
    quotation.extend(written)
    quote = quotation.propose(16)
    assert quote is not None
    return quote.tokens


def text(backend: LlamaBackend, tokens: tuple[int, ...]) -> str:
    return b"".join(backend.info.vocab.token_bytes(t) for t in tokens).decode()


def extraction(backend: LlamaBackend, document: str) -> GenerationRequest:
    prompt = encode_chat(
        backend.info,
        [
            {"role": "system", "content": "Extract the fields as JSON."},
            {
                "role": "user",
                "content": f"Fields: organization, contact_name, date, amount.\n\n{document}",
            },
        ],
    )
    params = SamplingParams(max_tokens=120, logprobs=TOP)
    return GenerationRequest(prompt, params, extensions={"json_schema": SCHEMA})


def suggeritore_host(backend: LlamaBackend, *, quotes: bool) -> PluginHost:
    host = PluginHost(["prompt_lookup", "draft_model"], discover=False)
    suggeritore = Suggeritore()
    host.register(suggeritore, "suggeritore")
    if quotes:
        host.register(QuoteDrafts(suggeritore.constraint_of), NAME)
    host.hook.reame_configure(settings=Settings(), model=backend.info, hook=host.hook)
    return host


def test_extractions_with_quote_drafts_follow_the_plain_path(
    backend: LlamaBackend, make_engine: MakeEngine, verification_exact: bool
) -> None:
    requests = [extraction(backend, document) for document in DOCUMENTS]
    plain_engine = make_engine(backend, plugins=suggeritore_host(backend, quotes=False))
    plain = [plain_run(plain_engine, request) for request in requests]
    plain_engine.stop()
    engine = make_engine(backend, speculate="on", plugins=suggeritore_host(backend, quotes=True))
    results = [engine.generate(request) for request in requests]
    engine.stop()

    accepted = sum(r.usage.draft_accepted.get(NAME, 0) for r in results)
    assert accepted >= 10, [r.usage.draft_accepted for r in results]
    drafted = [r.candidates[0].tokens for r in results]
    assert_near_ties(plain, drafted, VERIFY_FLIP_RATE_Q4_1, exact=verification_exact)
