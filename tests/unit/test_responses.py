"""OpenAI response pieces built from engine values."""

from __future__ import annotations

from reame_core.request import TokenLogprob, Usage
from reame_core.server.responses import completion_logprobs, timings_body, usage_body

PIECES = {1: b"a", 2: b"\xc3", 3: b"\xa9", 4: b"b"}


def test_text_offsets_count_characters_of_the_completion() -> None:
    items = [TokenLogprob(token, -0.5) for token in (1, 2, 3, 4)]  # "a", half of "é" twice, "b"
    body = completion_logprobs(items, PIECES.__getitem__, offset=10)
    assert body["text_offset"] == [10, 11, 11, 12]
    assert body["tokens"][1] == "\\xc3"


def test_usage_reports_cached_tokens_and_timings_the_computed_ones() -> None:
    usage = Usage(prompt_tokens=100, cached_tokens=80, completion_tokens=5, prompt_ms=40.0)
    assert usage_body(usage)["prompt_tokens_details"] == {"cached_tokens": 80}
    assert usage_body(usage)["total_tokens"] == 105
    timings = timings_body(usage)
    assert (timings["prompt_n"], timings["cached_n"]) == (20, 80)
    assert timings["prompt_per_second"] == 500.0
    assert "draft_n" not in timings


def test_timings_tell_restored_tokens_from_the_other_cached_ones() -> None:
    usage = Usage(prompt_tokens=100, cached_tokens=80, restored_tokens=64)
    timings = timings_body(usage)
    assert (timings["prompt_n"], timings["cached_n"], timings["restored_n"]) == (20, 80, 64)


def test_timings_show_drafts_per_source_once_speculation_ran() -> None:
    usage = Usage(draft_proposed={"lookup": 10}, draft_accepted={"lookup": 7})
    timings = timings_body(usage)
    assert (timings["draft_n"], timings["draft_n_accepted"]) == (10, 7)
    assert timings["drafts"] == {"lookup": {"proposed": 10, "accepted": 7}}
