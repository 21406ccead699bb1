from __future__ import annotations

import pytest

from reame_conclave.answers import (
    check_pattern,
    default_answer,
    final_line,
    final_number,
    json_field,
    regex_match,
    through_marked_answer,
    whole_text,
)


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("7 + 5 = 12", "12"),
        ("He has 1,200 apples.", "1200"),
        ("The total is +42.0 EUR", "42"),
        ("It drops to -3.", "-3"),
        ("Half of it: 1/2", "0.5"),
        ("3.25 metres", "3.25"),
        ("First 4, then 9.\nAnswer: 13", "13"),
        ("no digits here", None),
        ("model-v2 says x2", None),  # digits inside words are not numbers
    ],
)
def test_final_number_reads_the_last_number_as_people_write_it(
    text: str, answer: str | None
) -> None:
    assert final_number(text) == answer


def test_a_fraction_over_zero_is_not_a_number() -> None:
    assert final_number("1/0") is None


def test_final_line_drops_a_leading_answer_label_case_and_punctuation() -> None:
    assert final_line("Let me think.\n\nThe answer is: **Paris**.") == "paris"
    assert final_line("Reasoning...\nA: Yes!") == "yes"


def test_a_long_last_line_is_prose_not_a_short_answer() -> None:
    assert final_line("word " * 40) is None


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("7 + 5 = 12.\nAnswer: 12 apples (7 + 5)", "12"),
        ("The final answer is **42**. Checking: 40 + 2.", "42"),
        ("Answer: Paris\nIt has 2 million people.", "paris"),
    ],
)
def test_the_default_reads_what_follows_the_last_answer_marker(text: str, answer: str) -> None:
    assert default_answer(text) == answer


def test_a_cut_off_text_keeps_what_it_said_its_answer_was() -> None:
    assert through_marked_answer("3 + 4 = 7.\nAnswer: 7\nNow another 12") == (
        "3 + 4 = 7.\nAnswer: 7"
    )
    assert through_marked_answer("3 + 4 = 7 and then 12") is None
    assert through_marked_answer("Answer:") is None


def test_the_default_prefers_a_number_and_falls_back_to_the_last_line() -> None:
    assert default_answer("Counting gives 3 boxes\nso 3") == "3"
    assert default_answer("The capital is\nRome") == "rome"
    assert default_answer("   ") is None


def test_whole_text_compares_texts_up_to_case_and_spacing() -> None:
    assert whole_text("  Positive \n") == whole_text("positive") == "positive"


def test_regex_takes_the_last_match_and_its_first_group() -> None:
    assert regex_match("label=A then label=B", r"label=(\w)") == "b"
    assert regex_match("ok OK", r"ok") == "ok"
    assert regex_match("nothing", r"label=(\w)") is None
    assert regex_match("abc", r"(x)?") is None  # a group that took no part in the match


def test_an_invalid_or_huge_pattern_is_reported() -> None:
    assert check_pattern("(") is not None
    assert check_pattern("a" * 5000) is not None
    assert check_pattern(r"label=(\w+)") is None


def test_json_field_follows_a_dotted_path_through_objects_and_lists() -> None:
    text = 'Here: {"invoice": {"total": 388.0, "lines": [{"sku": "A1"}]}, "paid": false}'
    assert json_field(text, "invoice.total") == "388"
    assert json_field(text, "invoice.lines.0.sku") == "a1"
    assert json_field(text, "paid") == "false"
    assert json_field(text, "invoice.missing") is None
    assert json_field("not json", "a") is None


def test_json_objects_compare_by_their_canonical_form() -> None:
    assert json_field('{"b": 1, "a": 2}', None) == json_field('{"a":2,"b":1}', None)
