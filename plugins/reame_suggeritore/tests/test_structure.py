"""Structure drafts: the next list number, bullets and indentation, table pipes and the keys
of the previous JSON object, proposed from the text's own shape, and nothing on prose.

The fake vocabulary has one token per byte, so every draft below is spelled out byte by
byte; the real tokenizer's merged tokens (a newline with indentation, `{"`) are exercised on
SmolLM2 in tests/integration/test_structure_smollm2.py.
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

from reame_core.backend.fake import BOS, EOS, N_VOCAB, FakeBackend
from reame_core.engine.engine import Engine
from reame_core.hooktypes import DraftRequest
from reame_core.plugins import PluginHost
from reame_core.request import GenerationRequest, SamplingParams
from reame_core.settings import Settings
from reame_suggeritore.structure import NAME, Shape, StructureDrafts, TokenKinds


def draft_after(text: str, max_tokens: int = 16) -> str:
    shape = Shape(TokenKinds(VOCAB))
    shape.extend(encode(text))
    return decode(shape.propose(max_tokens))


# --------------------------------------------------------------------------- lists


def test_a_numbered_list_goes_on_with_the_next_number_and_its_separator() -> None:
    assert draft_after("Fruits:\n1. apple\n2. pear\n") == "3. "


def test_nine_is_followed_by_ten() -> None:
    assert draft_after("8. fig\n9. kiwi\n") == "10. "
    assert draft_after("99) end\n") == "100) "


def test_the_first_item_after_a_blank_line_is_a_template_for_the_second() -> None:
    assert draft_after("Here are three:\n\n1. apple\n") == "2. "


def test_punctuation_before_the_item_text_is_repeated() -> None:
    assert draft_after("1. **Apple**: red\n2. **Pear**: green\n") == "3. **"


def test_bullets_repeat_with_their_indentation() -> None:
    assert draft_after("- apple\n- pear\n") == "- "
    assert draft_after("* apple\n* pear\n") == "* "
    assert draft_after("- fruit\n  - apple\n") == "  - "


def test_a_nested_item_follows_the_latest_item_after_the_same_newline() -> None:
    # "\n" is the same opener for every level here: the latest line after it is the guess.
    assert draft_after("1. fruit\n  - apple\n  - pear\n") == "  - "


def test_the_draft_is_cut_to_max_tokens() -> None:
    assert draft_after("1. **Apple**\n2. **Pear**\n", max_tokens=2) == "3."


def test_a_line_that_is_not_an_item_proposes_nothing() -> None:
    assert draft_after("1. apple\n2. pear\nThat is all.\n") == ""
    assert draft_after("1.5 litres of water\n") == ""


# -------------------------------------------------------------------------- tables


TABLE = "| n | fruit |\n|---|-------|\n"


def test_a_table_row_starts_with_the_pipe_and_spacing_of_the_row_before() -> None:
    assert draft_after(TABLE) == "| "
    assert draft_after(TABLE + "| 1 | apple |\n") == "| "


def test_a_row_with_as_many_pipes_as_the_row_before_ends_and_the_next_begins() -> None:
    assert draft_after(TABLE + "| 1 | apple |") == "\n| "


def test_a_row_with_fewer_pipes_than_the_row_before_proposes_nothing() -> None:
    assert draft_after(TABLE + "| 1 |") == ""


# ---------------------------------------------------------------------------- JSON


OBJECTS = '[{"name": "ann", "age": 31, "city": "Oslo"}, '


def test_a_new_object_in_an_array_starts_with_the_first_key_of_the_one_before() -> None:
    assert draft_after(OBJECTS + "{") == '"name": "'


def test_after_each_value_comes_the_next_key_of_the_object_before() -> None:
    assert draft_after(OBJECTS + '{"name": "bob",') == ' "age": '
    assert draft_after(OBJECTS + '{"name": "bob", "age": 40,') == ' "city": "'


def test_after_the_last_key_of_the_object_before_nothing_is_proposed() -> None:
    assert draft_after(OBJECTS + '{"name": "bob", "age": 40, "city": "Rome",') == ""


def test_pretty_printed_objects_repeat_their_line_breaks_and_indentation() -> None:
    text = '[\n  {\n    "id": 1,\n    "tags": ["a", "b"],\n    "ok": true\n  },\n  {'
    assert draft_after(text) == '\n    "id": '
    assert draft_after(text + '\n    "id": 2,') == '\n    "tags": '
    assert draft_after(text + '\n    "id": 2,\n    "tags": ["c",') == ""  # inside the array
    assert draft_after(text + '\n    "id": 2,\n    "tags": ["c"],') == '\n    "ok": '


def test_an_object_that_is_not_the_sibling_of_the_previous_one_proposes_nothing() -> None:
    assert draft_after('{"a": {"x": 1}, "b": {') == ""
    assert draft_after('[{"x": 1}]\nAnd then: [{') == ""


def test_commas_and_braces_inside_strings_are_text() -> None:
    assert draft_after('[{"q": "a, {b}", "r": 1}, {"q": "c, d",') == ' "r": '


# --------------------------------------------------------------------------- prose


PROSE = (
    "Once upon a time, in a small town by the sea, there lived a baker.\n"
    "Every morning he rose at four - before the birds - and lit the oven.\n"
    'He said: "bread, {like} time, waits for nobody."\n'
    "The end | or is it?\n"
)


def test_prose_gets_no_draft_at_any_token() -> None:
    shape = Shape(TokenKinds(VOCAB))
    drafts = []
    for token in encode(PROSE):
        shape.extend([token])
        drafts.append(shape.propose(8))

    assert not any(drafts)


# --------------------------------------------------------------------- incremental


LISTS = (
    "Fruits:\n\n1. apple\n2. pear\n- x\n- y\n" + TABLE + "| 1 | a |\n" + OBJECTS + '{"name": "b",'
)


def test_reading_token_by_token_proposes_as_reading_everything_at_once() -> None:
    tokens = encode(LISTS)
    incremental = Shape(TokenKinds(VOCAB))

    for end in range(1, len(tokens) + 1):
        incremental.extend(tokens[end - 1 : end])
        whole = Shape(TokenKinds(VOCAB))
        whole.extend(tokens[:end])

        assert incremental.propose(8) == whole.propose(8), decode(tokens[:end])


# ---------------------------------------------------------------------- the plugin


def configured(section: dict[str, object] | None = None) -> StructureDrafts:
    source = StructureDrafts()
    source.reame_configure(Settings(plugins={NAME: section or {}}), FakeBackend().info)
    return source


def test_the_plugin_proposes_for_each_sequence_from_its_prompt_and_output() -> None:
    source = configured()
    listing = View(encode("List:\n1. a\n"), encode("2. b\n"))
    prose = View(encode("Tell me a story.\n"), encode("Once upon a time\n"))

    proposals = source.reame_propose_drafts([DraftRequest(listing, 4), DraftRequest(prose, 4)])

    assert [(p.seq, p.source, decode(p.tokens)) for p in proposals] == [(listing, NAME, "3. ")]


def test_the_plugin_catches_up_on_what_was_committed_since_it_last_looked() -> None:
    source = configured()
    view = View(encode("List:\n1. a\n"))
    first = source.reame_propose_drafts([DraftRequest(view, 4)])
    view.output_tokens += encode("2. b\n3. c\n")
    later = source.reame_propose_drafts([DraftRequest(view, 4)])

    assert [decode(p.tokens) for p in first] == ["2. "]
    assert [decode(p.tokens) for p in later] == ["4. "]


def test_the_plugin_refuses_unknown_settings() -> None:
    with pytest.raises(ValidationError):
        configured({"no_such_option": 1})


def test_the_plugin_is_declared_as_an_entry_point_of_its_own() -> None:
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    declared = re.search(rf'^\[project.entry-points.reame\][^[]*^{NAME} = "(.+)"$', pyproject, re.M)
    assert declared is not None
    module, _, attribute = declared.group(1).partition(":")

    assert isinstance(getattr(import_module(module), attribute), StructureDrafts)


# ------------------------------------------------------------------ through the engine


SCRIPT = (
    "Fruits:\n\n1. apple\n2. pear\n3. fig\n4. plum\n5. lime\n6. kiwi\n7. date\n8. peach\n"
    "9. mango\n10. lemon\n11. melon\nNotes:\n- sweet\n- sour\n  - very sour\n  - bitter\n"
    "- dry\n\n| n | fruit |\n|---|-------|\n| 1 | apple |\n| 2 | pear |\n| 3 | fig |\n\n"
    '[{"name": "ann", "age": 31}, {"name": "bob", "age": 40}, {"name": "cy", "age": 7}]\n'
    "That is all, thank you.\n"
)
PROMPT_CHARS = 8  # "Fruits:\n"


class ListWriter(FakeBackend):
    """A fake model that writes `SCRIPT`: after BOS and the script's first n bytes it
    prefers byte n + 1, and after anything else it prefers "#", so a draft left wrongly in
    the KV changes what follows."""

    def logits_after(self, tokens: Sequence[int]) -> np.ndarray:
        script = SCRIPT.encode()
        written = list(tokens[1:])
        row = np.zeros(N_VOCAB, dtype=np.float32)
        if tokens[:1] == [BOS] and written == list(script[: len(written)]):
            row[script[len(written)] if len(written) < len(script) else EOS] = 10.0
        else:
            row[ord("#")] = 10.0
        return row


def writer_engine(speculate: str, source: StructureDrafts | None = None) -> Engine:
    host = PluginHost(["prompt_lookup", "draft_model"], discover=False)
    backend = ListWriter()
    if source is not None:
        host.register(source, NAME)
        host.hook.reame_configure(settings=Settings(), model=backend.info, hook=host.hook)
    return Engine(backend, host, speculate=speculate, draft_max=8)  # type: ignore[arg-type]


def write(engine: Engine) -> tuple[list[int], dict[str, int], dict[str, int]]:
    prompt = [BOS, *encode(SCRIPT[:PROMPT_CHARS])]
    engine.start()
    try:
        result = engine.generate(GenerationRequest(prompt, SamplingParams(max_tokens=1000)))
    finally:
        engine.stop()
    usage = result.usage
    return list(result.candidates[0].tokens), usage.draft_proposed, usage.draft_accepted


def test_greedy_output_with_structure_drafts_equals_output_without() -> None:
    plain, _, _ = write(writer_engine("off"))
    drafted, proposed, accepted = write(writer_engine("on", StructureDrafts()))

    assert decode(plain) == SCRIPT[PROMPT_CHARS:]
    assert drafted == plain
    assert 0 < accepted[NAME] < proposed[NAME]  # some guesses were right, some rolled back


def test_structure_drafts_on_the_script_are_mostly_accepted() -> None:
    _, proposed, accepted = write(writer_engine("on", StructureDrafts()))

    assert accepted[NAME] >= 0.8 * proposed[NAME]
    assert accepted[NAME] >= 60


def test_a_sequence_shape_is_dropped_when_it_ends() -> None:
    source = StructureDrafts()
    engine = writer_engine("on", source)
    held: list[int] = []
    prompt = [BOS, *encode(SCRIPT[:PROMPT_CHARS])]
    engine.start()
    try:
        engine.generate(
            GenerationRequest(prompt, SamplingParams(max_tokens=200)),
            lambda event: held.append(len(source._shapes)),
        )
    finally:
        engine.stop()

    assert max(held) == 1
    assert len(source._shapes) == 0
