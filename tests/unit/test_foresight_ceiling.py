"""The near-repeat benchmark's ceiling with foresight (benchmarks/palimpsest.py): the least
decode time the drafts found at each position allow, knowing which of their tokens come
true, against a brute-force search over every way to decode; and its policy reference: a
governor that knows how often each kind of draft comes true, never faster than foresight."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _benchmark() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))  # it imports its neighbours (common, pass_cost)
    try:
        spec = importlib.util.spec_from_file_location("bench", BENCHMARKS / "palimpsest.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


bench = _benchmark()
# A pass of n tokens: 10 ms, then 4 ms for each further token (a 5-token pass costs 2.6x).
BOTH = (bench.ARCHIVE, bench.LOOKUP)
SECONDS = {n: 0.010 + 0.004 * (n - 1) for n in range(1, 18)}


def brute_force(answer: list[list[int]], sources: tuple[int, ...]) -> float:
    """Every way to decode `answer`: at each position reached, plain decoding or any
    source's draft at any length."""

    @functools.cache
    def least(t: int) -> float:
        if t >= len(answer):
            return 0.0
        options = [SECONDS[1] + least(t + 1)]
        for source in sources:
            length, right = answer[t][2 * source], answer[t][2 * source + 1]
            options += [SECONDS[k + 1] + least(t + min(k, right) + 1) for k in range(1, length + 1)]
        return min(options)

    return least(0)


@st.composite
def answers(draw: st.DrawFn) -> list[list[int]]:
    n = draw(st.integers(1, 30))
    positions = []
    for t in range(n):
        position = []
        for _ in range(2):
            length = draw(st.integers(0, 16))
            position += [length, draw(st.integers(0, min(length, n - t)))]
        positions.append(position)
    return positions


@settings(max_examples=200, deadline=None)
@given(answer=answers())
def test_the_least_time_is_the_brute_forces(answer: list[list[int]]) -> None:
    for sources in ((bench.ARCHIVE,), (bench.LOOKUP,), (bench.ARCHIVE, bench.LOOKUP)):
        assert abs(bench._fastest(answer, SECONDS, sources) - brute_force(answer, sources)) < 1e-12


def test_drafts_that_never_come_true_leave_plain_decoding() -> None:
    answer = [[8, 0, 0, 0]] * 10
    assert bench._fastest(answer, SECONDS, BOTH) == pytest.approx(10 * SECONDS[1])
    assert bench.ceiling_with_foresight([answer], SECONDS) == pytest.approx(1.0)


def test_a_right_archive_draft_where_prompt_lookup_has_none_is_the_ceiling() -> None:
    # 9 tokens; at position 0 the archive drafts 8, all right: one pass of 9 tokens.
    answer = [[8, 8, 0, 0], *[[0, 0, 0, 0]] * 8]
    assert bench._fastest(answer, SECONDS, BOTH) == pytest.approx(SECONDS[9])
    assert bench.ceiling_with_foresight([answer], SECONDS) == pytest.approx(
        9 * SECONDS[1] / SECONDS[9]
    )


def test_the_archive_adds_nothing_where_prompt_lookup_drafts_the_same() -> None:
    answer = [[8, 8, 8, 8], *[[0, 0, 0, 0]] * 8]
    assert bench.ceiling_with_foresight([answer], SECONDS) == pytest.approx(1.0)


def test_a_draft_is_found_for_each_position_and_scored_against_the_answer() -> None:
    assert bench._came_true((5, 6, 7), [5, 6, 9, 9]) == (3, 2)
    assert bench._came_true((5, 6, 7), [5, 6]) == (3, 2)  # the answer ends
    assert bench._came_true((), [1]) == (0, 0)


# The policy reference: positions as `_foresight` gives them (the archive's draft without
# the backing check, prompt lookup's, the archive's as offered, and its kind).


def _position(lookup: tuple[int, int], offered: tuple[int, int], kind: str = "match 3-7") -> list:
    return [*offered, *lookup, *offered, kind if offered[0] else ""]


@st.composite
def governed_answers(draw: st.DrawFn) -> list[list]:
    """`answers` with the archive's drafts as offered: a prefix of each (the backing check
    cuts a draft, never extends it), of a kind."""
    kinds = st.sampled_from(["match 1", "match 16+"])
    governed = []
    for position in draw(answers()):
        length, right = position[0], position[1]
        offered = draw(st.integers(0, length))
        kind = draw(kinds) if offered else ""
        governed.append([*position, offered, min(offered, right), kind])
    return governed


@settings(max_examples=200, deadline=None)
@given(answers=st.lists(governed_answers(), min_size=1, max_size=3))
def test_no_governor_decodes_faster_than_foresight(answers: list[list]) -> None:
    tables = bench.acceptance_tables(answers)
    for answer in answers:
        for sources, seen in (
            ((bench.LOOKUP,), (bench.LOOKUP,)),
            ((bench.OFFERED, bench.LOOKUP), BOTH),
        ):
            governed = bench._governed(answer, SECONDS, sources, tables)
            assert governed >= bench._fastest(answer, SECONDS, seen) - 1e-12


def test_acceptance_is_counted_by_kind_and_position_up_to_the_first_miss() -> None:
    answer = [
        _position((0, 0), (3, 1), "match 2"),  # reached 0 (right) and 1 (wrong)
        _position((4, 4), (2, 2), "match 2"),  # reached 0 and 1, both right
        _position((2, 0), (0, 0)),
        _position((0, 0), (0, 0)),
        _position((0, 0), (0, 0)),
    ]
    tables = bench.acceptance_tables([answer])
    assert tables["match 2"][:3] == [1.0, 0.5, 0.0]
    assert tables[bench.LOOKUP_KIND][:4] == [0.5, 1.0, 1.0, 1.0]


def test_a_draft_right_to_the_answers_end_counts_no_miss() -> None:
    # 5 tokens: at position 0 a draft of 3, all right; at position 3 a draft of 4 whose two
    # tokens within the answer are right (its third and fourth are past the end: neither).
    nothing = _position((0, 0), (0, 0))
    answer = [
        _position((0, 0), (3, 3), "match 2"),
        nothing,
        nothing,
        _position((0, 0), (4, 2), "match 2"),
        nothing,
    ]
    assert bench.acceptance_tables([answer])["match 2"][:3] == [1.0, 1.0, 1.0]


def test_drafts_of_a_kind_that_never_comes_true_are_not_verified() -> None:
    answer = [_position((0, 0), (8, 0))] * 10
    assert bench.policy_reference([answer], SECONDS) == pytest.approx(1.0)
    tables = bench.acceptance_tables([answer])
    both = (bench.OFFERED, bench.LOOKUP)
    assert bench._governed(answer, SECONDS, both, tables) == pytest.approx(10 * SECONDS[1])


def test_drafts_that_always_come_true_are_verified_whole() -> None:
    # 9 tokens; the archive offers 8 at position 0, all right, and its kind never misses.
    answer = [_position((0, 0), (8, 8)), *[_position((0, 0), (0, 0))] * 8]
    assert bench.policy_reference([answer], SECONDS) == pytest.approx(9 * SECONDS[1] / SECONDS[9])
