"""The index against a brute-force reference: every position of every record compared."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any
from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from reame_palimpsest.archive_index import (
    ANCHORS,
    BACKING_CONTEXT,
    CANDIDATES,
    MAX_DRAFT,
    MAX_MATCH,
    TRUSTED,
    ArchiveIndex,
    Drafted,
    _mix,
    continuation,
    gram_hash,
    kind_of,
    lookup,
    nothing_backed,
    suffix_hashes,
)

# A small alphabet makes matches, forks and repeats common.
records_strategy = st.lists(
    st.lists(st.integers(0, 5), min_size=1, max_size=60), min_size=1, max_size=12
)
tail_strategy = st.lists(st.integers(0, 5), min_size=1, max_size=MAX_MATCH)


def reference_draft(
    records: Sequence[Sequence[int]],
    tail: Sequence[int],
    max_tokens: int,
    *,
    factor: float,
    min_share: float,
    min_backing: float = 0.0,
    anchors: Sequence[int] = ANCHORS,
) -> tuple[tuple[int, ...], int]:
    """What the index must propose, and the length of the match behind it (0 where it
    proposes nothing), computed by comparing `tail` with every position."""
    occurrences = []  # (match length, record, position after the match), oldest first
    for r, record in enumerate(records):
        for end in range(len(record)):  # something follows: record[end]
            length = 0
            while length < min(len(tail), end) and record[end - 1 - length] == tail[-1 - length]:
                length += 1
            occurrences.append((length, r, end))
    longest = max((length for length, _, _ in occurrences), default=0)
    anchor = max((k for k in anchors if k <= longest), default=None)
    if anchor is None:
        return (), 0
    # The index compares only the most recent occurrences of the anchor's k-gram.
    recent = [o for o in occurrences if o[0] >= anchor][-CANDIDATES:]
    best = max(length for length, _, _ in recent)
    limit = min(max_tokens, MAX_DRAFT, max(1, math.ceil(factor * best)))
    paths = [list(records[r][end : end + limit]) for length, r, end in recent if length == best]
    drafted: list[int] = []
    probability = 1.0
    for depth in range(limit):
        counts = Counter(path[depth] for path in paths if len(path) > depth)
        if not counts:
            break
        token, count = max(counts.items(), key=lambda item: (item[1], -item[0]))
        probability *= count / len(paths)
        if probability < min_share:
            break
        drafted.append(token)
        paths = [path for path in paths if len(path) > depth and path[depth] == token]
    if min_backing > 0.0:
        drafted = reference_backed(records, tail, drafted, best, min_backing, anchors)
    return tuple(drafted), best if drafted else 0


def reference_backed(
    records: Sequence[Sequence[int]],
    tail: Sequence[int],
    drafted: list[int],
    length: int,
    min_backing: float,
    anchors: Sequence[int],
) -> list[int]:
    """`drafted` cut before the first token, drafted after a match shorter than TRUSTED,
    that too few of the (most recent) occurrences of the k tokens before it preceded: k
    the longest anchor within BACKING_CONTEXT, the match and the drafted tokens before."""
    context = [*tail, *drafted]
    for j, token in enumerate(drafted):
        if length + j >= TRUSTED:
            break
        reach = min(max(BACKING_CONTEXT, min(anchors)), length + j, len(tail) + j)
        k = max((a for a in anchors if a <= reach), default=0)
        if not k:
            return drafted[:j]
        at = len(tail) + j  # drafted[j]'s place in the context
        gram = context[at - k : at]
        followers = [
            record[end]
            for record in records
            for end in range(k, len(record))
            if list(record[end - k : end]) == gram
        ][-CANDIDATES:]
        if not followers or followers.count(token) < min_backing * len(followers):
            return drafted[:j]
    return drafted


def index_lookup(
    records: Sequence[Sequence[int]],
    tail: Sequence[int],
    max_tokens: int,
    *,
    factor: float,
    min_share: float,
    min_backing: float = 0.0,
    anchors: Sequence[int] = ANCHORS,
) -> Drafted:
    index = ArchiveIndex([np.array(r, dtype=np.uint32) for r in records], anchors)
    query = np.array(tail, dtype=np.uint32)
    return lookup(
        query, [index], max_tokens, factor=factor, min_share=min_share, min_backing=min_backing
    )


def index_draft(
    records: Sequence[Sequence[int]], tail: Sequence[int], max_tokens: int, **options: Any
) -> tuple[int, ...]:
    """`index_lookup`'s tokens alone."""
    return index_lookup(records, tail, max_tokens, **options).tokens


@settings(max_examples=300, deadline=None)
@given(
    records=records_strategy,
    tail=tail_strategy,
    max_tokens=st.integers(1, 40),
    factor=st.sampled_from([0.5, 1.0, 2.0]),
    min_share=st.sampled_from([0.05, 0.3, 0.6, 1.0]),
    min_backing=st.sampled_from([0.0, 0.4, 0.7, 1.0]),
)
def test_lookup_matches_the_brute_force_reference(
    records: list[list[int]],
    tail: list[int],
    max_tokens: int,
    factor: float,
    min_share: float,
    min_backing: float,
) -> None:
    shares = {"factor": factor, "min_share": min_share, "min_backing": min_backing}
    for anchors in ((3,), (8, 3, 1), (24, 8, 3), (24, 8, 3, 2, 1), (24, 8, 5)):
        expected = reference_draft(records, tail, max_tokens, anchors=anchors, **shares)
        found = index_lookup(records, tail, max_tokens, anchors=anchors, **shares)
        assert found == expected, anchors


@settings(max_examples=200, deadline=None)
@given(tokens=st.lists(st.integers(0, 2**32 - 2), min_size=1, max_size=MAX_MATCH))
def test_every_way_of_hashing_tokens_agrees_with_the_tables(tokens: list[int]) -> None:
    # The tables hash each k-gram in numpy; a lookup hashes the tail's suffixes one token
    # after another in Python, from an array or a list, and a backing check a few tokens.
    index = ArchiveIndex([[*tokens, 0]], anchors=(len(tokens),))  # one k-gram, then a token
    [table_key] = index._tables[0][0].tolist()

    hashes = suffix_hashes(np.array(tokens, dtype=np.uint32), len(tokens))

    assert _mix(hashes[-1]) == table_key == _mix(gram_hash(tokens))
    assert suffix_hashes(tokens, len(tokens)) == hashes  # a list as an array
    assert all(hashes[k] == gram_hash(tokens[-k:]) for k in range(1, len(tokens) + 1))


@settings(max_examples=200, deadline=None)
@given(records=records_strategy, data=st.data())
def test_a_draft_continues_an_occurrence_of_the_tails_end(
    records: list[list[int]], data: st.DataObject
) -> None:
    record = data.draw(st.sampled_from(records))
    cut = data.draw(st.integers(1, len(record)))
    tail = record[max(0, cut - MAX_MATCH) : cut]
    drafted = index_draft(records, tail, MAX_DRAFT, factor=2.0, min_share=0.1, anchors=(1,))
    if not drafted:
        return
    # Somewhere in the archive the tail's last token was followed by the whole draft.
    assert any(
        r[end - 1] == tail[-1] and tuple(r[end : end + len(drafted)]) == drafted
        for r in records
        for end in range(1, len(r))
    )


def test_the_most_frequent_continuation_wins() -> None:
    history = [7, 8, 9]
    records = [[*history, 1, 2, 3]] * 3 + [[*history, 4, 5, 6]] * 2
    assert index_draft(records, history, 8, factor=2.0, min_share=0.1) == (1, 2, 3)


def test_a_path_below_the_minimum_share_is_cut() -> None:
    history = [7, 8, 9]
    records = [[*history, 1, 2, 3]] * 3 + [[*history, 4, 5, 6]] * 2
    # 3 of 5 is 0.6: drafted at 0.5, refused at 0.7.
    assert index_draft(records, history, 8, factor=2.0, min_share=0.5) == (1, 2, 3)
    assert index_draft(records, history, 8, factor=2.0, min_share=0.7) == ()


def test_forks_multiply_their_shares() -> None:
    history = [7, 8, 9]
    records = [[*history, 1, 2]] * 2 + [[*history, 1, 3]] * 2 + [[*history, 4]] * 1
    # 1 takes 4/5; then 2 and 3 split those 2:2, so the path's share is 0.4.
    assert index_draft(records, history, 8, factor=2.0, min_share=0.3) == (1, 2)
    assert index_draft(records, history, 8, factor=2.0, min_share=0.5) == (1,)


def test_a_token_after_a_short_match_needs_the_archives_backing() -> None:
    # The tail's last three tokens (1, 2, 3) matched one record that went on with 9; four
    # others that end with the same three tokens went on with 4.
    records = [[7, 1, 2, 3, 9, 9], *([[6, 1, 2, 3, 4]] * 4)]
    history = [7, 1, 2, 3]
    assert index_draft(records, history, 8, factor=2.0, min_share=0.1) == (9, 9)
    assert index_draft(records, history, 8, factor=2.0, min_share=0.1, min_backing=0.5) == ()
    assert index_draft(records, history, 8, factor=2.0, min_share=0.1, min_backing=0.2) == (9, 9)


def test_a_long_match_needs_no_backing() -> None:
    lone = [*range(100, 100 + TRUSTED), 9, 9]
    records = [lone, *[[*lone[TRUSTED - 3 : TRUSTED], 4]] * 6]  # the same three tokens, then 4
    history = lone[:TRUSTED]
    assert index_draft(records, history, 2, factor=1.0, min_share=0.1, min_backing=1.0) == (9, 9)
    shorter = history[1:]  # a match one token short of trusted: the first token is checked
    assert index_draft(records, shorter, 2, factor=1.0, min_share=0.1, min_backing=0.5) == ()


def test_the_draft_grows_with_the_match_and_is_capped_by_the_caller() -> None:
    record = list(range(100, 160))
    for matched in (3, 5, 10, 20):
        tail = record[30 - matched : 30]
        drafted = index_draft([record], tail, 64, factor=1.0, min_share=0.1)
        assert drafted == tuple(record[30 : 30 + matched])
    tail = record[10:30]
    assert len(index_draft([record], tail, 6, factor=1.0, min_share=0.1)) == 6
    assert len(index_draft([record], tail, 64, factor=0.5, min_share=0.1)) == 10


def test_the_longest_match_decides_over_more_frequent_shorter_ones() -> None:
    long_history = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    records = [[*long_history, 50]] + [[0, 7, 8, 9, 60]] * 10
    assert index_draft(records, long_history, 4, factor=1.0, min_share=0.1)[:1] == (50,)


def test_matches_never_cross_records() -> None:
    records = [[1, 2, 3], [4, 5, 6]]
    assert index_draft(records, [2, 3, 4], 4, factor=4.0, min_share=0.1, anchors=(3, 2)) == ()
    found = index_lookup(records, [2, 3, 4], 4, factor=4.0, min_share=0.1)
    assert found == ((5, 6), 1)  # the 4 alone: 3, 4 spans two records
    assert index_draft(records, [1, 2, 3], 4, factor=4.0, min_share=0.1) == ()  # nothing after


def test_several_indexes_pool_their_longest_matches() -> None:
    history = [7, 8, 9, 10]
    old = ArchiveIndex([np.array([*history, 1, 2], dtype=np.uint32)] * 2)
    new = ArchiveIndex([np.array([*history, 3, 4], dtype=np.uint32)] * 3)
    query = np.array(history, dtype=np.uint32)
    assert lookup(query, [old, new], 8, factor=1.0, min_share=0.1).tokens == (3, 4)
    assert lookup(query, [old], 8, factor=1.0, min_share=0.1).tokens == (1, 2)


def test_continuation_of_identical_rows_is_taken_whole() -> None:
    rows = np.array([[5, 6, 7, 0xFFFFFFFF]] * 4, dtype=np.uint32)
    assert continuation(rows, 0.5) == (5, 6, 7)


def test_an_empty_index_matches_nothing() -> None:
    index = ArchiveIndex([])
    assert index.n_tokens == 0
    empty = lookup(np.array([1, 2, 3], dtype=np.uint32), [index], 8, factor=1, min_share=0.1)
    assert empty == ((), 0)


def test_a_draft_after_a_short_match_is_backed_by_as_many_tokens_as_it_matched() -> None:
    # One token matches (5); what followed 5 across the archive was 6 three times in four.
    records = [[5, 6, 7], [5, 6, 8], [5, 6, 9], [5, 4]]
    assert index_draft(records, [1, 5], 8, factor=1.0, min_share=0.1, anchors=(3, 1)) == (6,)
    assert (
        index_draft(records, [1, 5], 8, factor=1.0, min_share=0.1, min_backing=0.8, anchors=(3, 1))
        == ()
    )
    assert index_draft(
        records, [1, 5], 8, factor=1.0, min_share=0.1, min_backing=0.7, anchors=(3, 1)
    ) == (6,)


def test_a_lookup_says_how_long_a_match_stands_behind_its_draft() -> None:
    records = [[1, 2, 3, 4, 5, 6, 7, 8]]
    found = index_lookup(records, [9, 3, 4], 8, factor=2.0, min_share=0.1, anchors=(3, 2, 1))
    assert found.tokens == (5, 6, 7, 8) and found.match == 2
    missed = index_lookup(records, [9], 8, factor=2.0, min_share=0.1, anchors=(3, 2, 1))
    assert missed.tokens == () and missed.match == 0


def test_kinds_of_draft_follow_the_length_of_the_match() -> None:
    kinds = [kind_of(n) for n in (1, 2, 3, 7, 8, 15, 16, 64)]
    assert kinds == [
        "match 1", "match 2", "match 3-7", "match 3-7",
        "match 8-15", "match 8-15", "match 16+", "match 16+",
    ]  # fmt: skip


def same_index(a: ArchiveIndex, b: ArchiveIndex) -> bool:
    """Token for token and entry for entry the same index, its followers' counts too."""
    tables = zip(a._tables, b._tables, strict=True)
    counts = zip(a._followers, b._followers, strict=True)
    return (
        np.array_equal(a.tokens, b.tokens)
        and a.n_tokens == b.n_tokens
        and a.anchors == b.anchors
        and all(
            np.array_equal(x, y) and x.dtype == y.dtype
            for t, u in (*tables, *((c, d) for c, d in counts if c is not None or d is not None))
            for x, y in zip(t, u, strict=True)
        )
        and all(
            shift == other_shift and np.array_equal(starts, other_starts)
            for (shift, starts), (other_shift, other_starts) in zip(
                a._starts, b._starts, strict=True
            )
        )
    )


@settings(max_examples=200, deadline=None)
@given(
    records=records_strategy,
    cuts=st.lists(st.integers(0, 12), max_size=3),
    anchors=st.sampled_from([ANCHORS, (3,), (8, 3, 1), (24, 8, 5)]),
    tail=tail_strategy,
)
def test_an_extended_index_is_the_index_of_all_its_records(
    records: list[list[int]], cuts: list[int], anchors: tuple[int, ...], tail: list[int]
) -> None:
    arrays = [np.array(r, dtype=np.uint32) for r in records]
    bounds = [0, *sorted(min(c, len(arrays)) for c in cuts), len(arrays)]
    grown = ArchiveIndex(arrays[: bounds[1]], anchors)
    for start, end in itertools.pairwise(bounds[1:]):
        grown = grown.extended(arrays[start:end])
    whole = ArchiveIndex(arrays, anchors)
    assert same_index(grown, whole)
    query = np.array(tail, dtype=np.uint32)
    options = {"factor": 2.0, "min_share": 0.1, "min_backing": 0.4}
    assert lookup(query, [grown], 16, **options) == lookup(query, [whole], 16, **options)


def test_extending_by_nothing_keeps_the_index() -> None:
    index = ArchiveIndex([np.array([1, 2, 3], dtype=np.uint32)])
    assert index.extended([]) is index


@settings(max_examples=200, deadline=None)
@given(
    records=records_strategy,
    cut=st.integers(0, 12),
    anchors=st.sampled_from([ANCHORS, (3,), (8, 3, 1), (24, 8, 5)]),
    tail=tail_strategy,
    min_backing=st.sampled_from([0.4, 0.7, 1.0]),
)
def test_the_shortcuts_for_unbacked_tokens_change_no_lookup(
    records: list[list[int]],
    cut: int,
    anchors: tuple[int, ...],
    tail: list[int],
    min_backing: float,
) -> None:
    # Two indexes, as the archive keeps them (`main` and `fresh`): whatever each one's
    # counts say (`nothing_backed` before a search, `backed` after), pooled lookups answer
    # as the search and the backing check's own counts do.
    arrays = [np.array(r, dtype=np.uint32) for r in records]
    indexes = [ArchiveIndex(arrays[:cut], anchors), ArchiveIndex(arrays[cut:], anchors)]
    query = np.array(tail, dtype=np.uint32)
    options = {"factor": 2.0, "min_share": 0.1, "min_backing": min_backing}
    found = lookup(query, indexes, 16, **options)
    with mock.patch.object(ArchiveIndex, "backs_nothing", return_value=False):
        searched = lookup(query, indexes, 16, **options)  # every count read as "cannot tell"
    assert found == searched


@settings(max_examples=100, deadline=None)
@given(records=records_strategy, gram=st.lists(st.integers(0, 5), min_size=1, max_size=3))
def test_an_index_counts_each_short_grams_commonest_follower(
    records: list[list[int]], gram: list[int]
) -> None:
    index = ArchiveIndex([np.array(r, dtype=np.uint32) for r in records], (8, 3, 2, 1))
    k = len(gram)
    followers = [r[end] for r in records for end in range(k, len(r)) if r[end - k : end] == gram]
    recent = followers[-CANDIDATES:]
    table, key = index.anchors.index(k), gram_hash(gram)
    if not recent:
        assert index.backs_nothing(table, key, 0.01)
        return
    share = max(Counter(recent).values()) / len(recent)
    assert not index.backs_nothing(table, key, share)  # the commonest follower backs as much
    assert index.backs_nothing(table, key, share + 0.01)  # and no more


def test_text_unlike_the_archives_is_refused_without_a_search() -> None:
    # Every 2-gram and 1-gram at the tail's end was followed by many different tokens, and
    # its last 8 tokens are nowhere: nothing a match could draft would be backed.
    records = [[1, 2, 10 + i, 3, 4, 20 + i] for i in range(8)]
    index = ArchiveIndex([np.array(r, dtype=np.uint32) for r in records])
    tail = np.array([90, 91, 92, 93, 94, 95, 1, 2], dtype=np.uint32)
    assert nothing_backed(tail, suffix_hashes(tail, 24), [index], 0.7)
    assert lookup(tail, [index], 8, factor=1.0, min_share=0.01, min_backing=0.7) == ((), 0)
    # Where a follower dominates, the search runs and drafts.
    agreed = [[1, 2, 10, 3] for _ in range(8)]
    index = ArchiveIndex([np.array(r, dtype=np.uint32) for r in agreed])
    assert not nothing_backed(tail, suffix_hashes(tail, 24), [index], 0.7)
    assert lookup(tail, [index], 8, factor=1.0, min_share=0.01, min_backing=0.7).tokens == (10, 3)


def test_a_lookup_refused_by_the_counts_does_not_search() -> None:
    records = [[1, 2, 10 + i, 3, 4, 20 + i] for i in range(8)]
    index = ArchiveIndex([np.array(r, dtype=np.uint32) for r in records])
    tail = [90, 91, 92, 93, 94, 95, 1, 2]
    with mock.patch.object(ArchiveIndex, "match", side_effect=AssertionError("searched")):
        assert lookup(tail, [index], 8, factor=1.0, min_share=0.01, min_backing=0.7) == ((), 0)
