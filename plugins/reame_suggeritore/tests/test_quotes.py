"""Quote drafts: the prompt's text after the longest end of the answer that it holds,
matched from a word's start; inside a JSON value, cut where the prompt's phrase ends and
closed, with the keys the grammar forces next; never inside a key.

The fake vocabulary has one token per byte, so tokens never straddle a match here; the real
tokenizer's splits (` Officina` in the prompt, `"Off` in the answer) are exercised on
SmolLM2 in tests/integration/test_quotes_smollm2.py.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from importlib import import_module
from pathlib import Path

import numpy as np
import pytest
from byte_text import VOCAB, View, decode, encode
from pydantic import ValidationError

from reame_core.backend.fake import BOS, EOS, IM_END, N_VOCAB, FakeBackend
from reame_core.engine.engine import Engine
from reame_core.hooktypes import DraftRequest
from reame_core.plugins import PluginHost
from reame_core.request import GenerationRequest, SamplingParams
from reame_core.settings import Settings
from reame_suggeritore.constraint import Constraint
from reame_suggeritore.grammars import GrammarCache
from reame_suggeritore.plugin import Suggeritore
from reame_suggeritore.quotes import NAME, JsonPlace, Quotation, QuoteDrafts, quoted_at
from reame_suggeritore.request_grammar import _json_schema
from reame_suggeritore.tokenizer import build_tokenizer

DOCUMENT = "INVOICE 7\nFrom: Officina Verdi Srl, Via Roma 12\nTotal due: 67.50 EUR.\n"


def draft_after(answer: str, prompt: str = DOCUMENT, max_tokens: int = 64) -> str | None:
    quotation = Quotation(VOCAB, encode(prompt))
    quotation.extend(encode(answer))
    quote = quotation.propose(max_tokens)
    return None if quote is None else decode(quote.tokens)


# ---------------------------------------------------------------------------- matching


def test_the_longest_end_of_the_answer_is_found_from_a_word_start() -> None:
    source = b"an apple, a pineapple, an apple pie"

    assert quoted_at(b"I like an apple", source) == (
        len(b" an apple"),
        len(b"an apple, a pineapple, an apple"),
    )


def test_a_match_must_start_a_word_in_the_prompt_too() -> None:
    # "apple" ends "pineapple" first, but only the later "apple" starts a word.
    assert quoted_at(b"the apple", b"one pineapple, then apple jam") == (
        len(b" apple"),
        len(b"one pineapple, then apple"),
    )


def test_an_end_shorter_than_three_bytes_is_not_a_quote() -> None:
    assert quoted_at(b"say ab", b"ab cd") is None


def test_the_middle_of_a_word_is_not_a_quote() -> None:
    # "voice" is in the prompt, but the answer's word is "invoice" and the prompt has none.
    assert quoted_at(b"an invoice", b"his voice carried") is None


def test_a_word_after_a_typographic_quote_or_a_dash_starts_a_word() -> None:
    # The answer's “Officina follows a quote mark; the prompt's Officina an em dash.
    answer = "Fornitore: “Officina".encode()
    source = "Fornitore — Officina Rossi".encode()

    assert quoted_at(answer, source) == (len(b"Officina"), source.index(b"Officina") + 8)


def test_accented_letters_belong_to_their_word() -> None:
    # "però" holds "rò"; "ciò" ends in "iò": neither starts a word.
    assert quoted_at("dico però".encode(), "ciò rò".encode()) is None
    assert quoted_at("la città".encode(), "però città di".encode()) == (
        len(" città".encode()),
        len("però città".encode()),
    )


def test_a_quote_never_starts_inside_a_character() -> None:
    # "è" is c3 a8: its second byte alone matches no character's start.
    answer = "perch\u00e8 no".encode()[:-3]  # "perchè"
    assert quoted_at(answer, b"\xa8 x", shortest=1) is None


# ---------------------------------------------------------------------------- proposing


def test_free_text_goes_on_with_what_followed_a_phrase_in_the_prompt() -> None:
    assert (
        draft_after("It says: INVOICE 7\nFrom: Offi")
        == "cina Verdi Srl, Via Roma 12\nTotal due: 67.50 EUR.\n"
    )


def test_a_long_continuation_loses_its_last_token_which_may_be_a_cut_word() -> None:
    prompt = "The sender: Offi" + "cina " * 40

    assert draft_after("The sender: Offi", prompt) == ("cina " * 40)[: 64 - 1]


def test_free_text_needs_a_phrase_not_a_few_letters() -> None:
    assert draft_after("The sender is Offi") is None


def test_a_string_value_ends_where_the_prompts_phrase_does_and_is_closed() -> None:
    assert draft_after('{"organization": "Offi') == 'cina Verdi Srl"'
    assert draft_after('{"note": "Total d') == 'ue"'


def test_a_full_stop_inside_a_number_does_not_end_a_value() -> None:
    assert draft_after('{"total": "Total due: 67') == '.50 EUR"'


def test_a_number_value_ends_with_its_last_digit() -> None:
    assert draft_after('{"amount": 67.') == "50"


def test_nothing_is_proposed_inside_a_key() -> None:
    # "Total" starts a key here: the schema's words, which the prompt may quote.
    assert draft_after('{"Total') is None
    assert draft_after('{"a": "x", "Total') is None
    assert draft_after('["Total') == ' due"'  # an array holds values, not keys


def test_the_draft_is_cut_to_max_tokens() -> None:
    assert draft_after('{"organization": "Offi', max_tokens=4) == "cina"


@pytest.mark.parametrize(
    "text",
    [
        '{"organization": "Officina Verdi Srl", "tags": ["a, b", "c\\"d"], "amount": 67.50}',
        '[{"a": "x"}, {"b": {"c": "y, z"}}]',
        'He said "hello, world" and left: {"k',
    ],
)
def test_the_json_place_is_the_same_read_in_pieces_of_any_size(text: str) -> None:
    whole = JsonPlace()
    whole.read(text.encode())
    for size in (1, 2, 3, 7):
        pieces = JsonPlace()
        data = text.encode()
        for start in range(0, len(data), size):
            pieces.read(data[start : start + size])

        assert vars(pieces) == vars(whole)


def test_a_value_is_quoted_from_its_own_text_not_the_punctuation_before_it() -> None:
    # `": "` is in the prompt (an example), but the value has no text of its own yet.
    prompt = 'Example: {"name": "Ann"}. Now the document: From: Officina Verdi Srl.'

    assert draft_after('{"name": "', prompt) is None
    assert draft_after('{"name": "Offi', prompt) == 'cina Verdi Srl"'


def test_after_a_closed_value_only_a_phrase_is_quoted() -> None:
    # The value is closed: what follows is the grammar's, not a number's digits.
    assert draft_after('{"note": "x", "total": "Total due: 67.50 EUR", ') is None


# ------------------------------------------------------------------- with a grammar


def schema(max_length: int) -> dict[str, object]:
    return {
        "type": "object",
        "properties": {
            "organization": {"type": "string", "maxLength": max_length},
            "amount": {"type": "number"},
        },
        "required": ["organization", "amount"],
        "additionalProperties": False,
    }


def schema_constraint(max_length: int) -> Constraint:
    tokenizer = build_tokenizer(FakeBackend().info)
    return Constraint(
        GrammarCache(tokenizer).matcher(_json_schema("json_schema", schema(max_length))),
        mask_bits=tokenizer.vocab_size,
        eos=EOS,
        eog=frozenset({EOS, IM_END}),
        request_id="req-test",
    )


def configured(constraints: dict[int, Constraint] | None = None) -> QuoteDrafts:
    source = QuoteDrafts((constraints or {}).get)
    source.reame_configure(Settings(), FakeBackend().info)
    return source


def constrained_draft(answer: str, max_length: int) -> list[str]:
    view = View(encode(DOCUMENT), encode(answer))
    constraint = schema_constraint(max_length)
    constraint.commit(view.output_tokens)
    source = configured({view.key: constraint})
    proposals = source.reame_propose_drafts([DraftRequest(view, 40)])
    return [decode(p.tokens) for p in proposals]


def test_a_closed_value_goes_on_with_what_the_grammar_forces_after_it() -> None:
    assert constrained_draft('{"organization": "Offi', 40) == ['cina Verdi Srl", "amount": ']


def test_the_grammar_cuts_a_draft_where_it_refuses_it() -> None:
    # maxLength 12: "Officina Ver" and no more.
    assert constrained_draft('{"organization": "Offi', 12) == ["cina Ver"]


@pytest.mark.parametrize(
    ("max_length", "tokens"),
    [
        (40, 'cina Verdi Srl", "amount": 67.50}'),  # allowed whole: it completes the answer
        (40, 'cina Verdi Srl"'),  # allowed whole: it closes the value
        (12, "cina Verdi Srl and more"),  # refused past maxLength
    ],
)
def test_asking_the_grammar_about_a_draft_leaves_it_where_it_was(
    max_length: int, tokens: str
) -> None:
    constraint = schema_constraint(max_length)
    constraint.commit(encode('{"organization": "Offi'))
    before = (constraint.forced(8), mask(constraint))

    constraint.allowed(encode(tokens), closes=True)

    assert (constraint.forced(8), mask(constraint)) == before


def mask(constraint: Constraint) -> list[int]:
    row = np.zeros(N_VOCAB, dtype=np.float32)
    constraint.constrain((), row)
    return [int(t) for t in np.flatnonzero(np.isfinite(row))]


def test_an_unconstrained_sequence_gets_the_quote_alone() -> None:
    view = View(encode(DOCUMENT), encode('{"organization": "Offi'))

    assert [
        decode(p.tokens) for p in configured().reame_propose_drafts([DraftRequest(view, 40)])
    ] == ['cina Verdi Srl"']


def test_the_plugin_refuses_unknown_settings() -> None:
    source = QuoteDrafts()
    with pytest.raises(ValidationError):
        source.reame_configure(Settings(plugins={NAME: {"no_such_option": 1}}), FakeBackend().info)


def test_the_plugin_is_declared_as_an_entry_point_of_its_own() -> None:
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    declared = re.search(rf'^\[project.entry-points.reame\][^[]*^{NAME} = "(.+)"$', pyproject, re.M)
    assert declared is not None
    module, _, attribute = declared.group(1).partition(":")

    assert isinstance(getattr(import_module(module), attribute), QuoteDrafts)


# ------------------------------------------------------------------ through the engine

ANSWER = '{"organization": "Officina Verdi Srl", "amount": 67.50}'


class Extractor(FakeBackend):
    """A fake model that answers `DOCUMENT` with `ANSWER`: after BOS, the document and the
    answer's first n bytes it prefers byte n + 1, and after anything else it prefers "#",
    so a draft left wrongly in the KV changes what follows."""

    def logits_after(self, tokens: Sequence[int]) -> np.ndarray:
        prompt, answer = [BOS, *encode(DOCUMENT)], ANSWER.encode()
        written = list(tokens[len(prompt) :])
        row = np.zeros(N_VOCAB, dtype=np.float32)
        if list(tokens[: len(prompt)]) == prompt and written == list(answer[: len(written)]):
            row[answer[len(written)] if len(written) < len(answer) else EOS] = 10.0
        else:
            row[ord("#")] = 10.0
        return row


def extract(speculate: str) -> tuple[str, dict[str, int], dict[str, int]]:
    host = PluginHost(["prompt_lookup", "draft_model"], discover=False)
    suggeritore = Suggeritore()
    host.register(suggeritore, "suggeritore")
    host.register(QuoteDrafts(suggeritore.constraint_of), NAME)
    backend = Extractor()
    host.hook.reame_configure(settings=Settings(), model=backend.info, hook=host.hook)
    engine = Engine(backend, host, speculate=speculate, draft_max=16)  # type: ignore[arg-type]
    request = GenerationRequest(
        [BOS, *encode(DOCUMENT)],
        SamplingParams(max_tokens=200),
        extensions={"json_schema": schema(40)},
    )
    engine.start()
    try:
        result = engine.generate(request)
    finally:
        engine.stop()
    usage = result.usage
    return decode(result.candidates[0].tokens), usage.draft_proposed, usage.draft_accepted


def test_greedy_output_with_quote_drafts_equals_output_without() -> None:
    plain, _, _ = extract("off")
    drafted, proposed, accepted = extract("on")

    assert plain == ANSWER
    assert drafted == plain
    # After "Off", `icina Verdi Srl"` (16 tokens, the most a draft may have here; the key
    # after it came as the grammar's certain draft), and after "67." its "50".
    assert accepted[NAME] >= len('icina Verdi Srl"') + len("50")
    assert proposed[NAME] == accepted[NAME]  # each value's end was where the document's was
