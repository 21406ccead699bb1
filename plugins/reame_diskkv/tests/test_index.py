"""Longest-prefix search in the index: the entry sharing the most leading tokens."""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.synchronize
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from reame_core.engine.slots import common_prefix
from reame_diskkv.index import BLOCK, PrefixIndex, entry_key

MODEL = "model-a"


@pytest.fixture
def index(tmp_path: Path) -> Iterator[PrefixIndex]:
    opened = PrefixIndex(tmp_path / "index.sqlite", busy_timeout_s=1.0)
    yield opened
    opened.close()


def add(index: PrefixIndex, tokens: Sequence[int], fingerprint: str = MODEL) -> str:
    key = entry_key(fingerprint, tokens)
    with index.writing():
        index.add(key, fingerprint=fingerprint, model="m", tokens=tokens, size=1, when=0.0)
    return key


def _open_together(path: Path, start: multiprocessing.synchronize.Barrier) -> None:
    start.wait()
    PrefixIndex(path, busy_timeout_s=5.0).close()


def test_processes_opening_a_new_index_together_all_open_it(tmp_path: Path) -> None:
    # The switch to WAL mode answered "locked" without waiting to all but one of them.
    context = multiprocessing.get_context("fork")
    for round_ in range(25):
        path = tmp_path / f"index-{round_}.sqlite"
        start = context.Barrier(6)
        openers = [context.Process(target=_open_together, args=(path, start)) for _ in range(6)]
        for opener in openers:
            opener.start()
        for opener in openers:
            opener.join(timeout=30)

        assert [opener.exitcode for opener in openers] == [0] * 6
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


BASE = list(range(1000, 1300))  # 300 tokens


def test_entry_sharing_the_most_tokens_is_found_across_blocks(index: PrefixIndex) -> None:
    add(index, BASE[:64])
    longest = add(index, BASE[:250])
    add(index, [*BASE[:100], 7, 7, 7])
    prompt = [*BASE[:200], 1, 2, 3]

    found = index.longest_prefix(MODEL, prompt)

    assert found is not None
    assert (found.key, found.shared, found.tokens) == (longest, 200, tuple(BASE[:250]))


def test_shortest_entry_wins_when_several_share_as_much(index: PrefixIndex) -> None:
    add(index, BASE[:300])
    shorter = add(index, BASE[:240])

    found = index.longest_prefix(MODEL, [*BASE[:200], 5])

    assert found is not None and (found.key, found.shared) == (shorter, 200)


def test_whole_prefixes_only_when_the_model_cannot_be_trimmed(index: PrefixIndex) -> None:
    whole = add(index, BASE[:150])
    add(index, BASE[:250])
    prompt = [*BASE[:200], 1, 2, 3]

    found = index.longest_prefix(MODEL, prompt, whole_within=len(prompt) - 2)

    assert found is not None and (found.key, found.shared) == (whole, 150)


def test_whole_prefix_is_found_behind_many_longer_entries_that_are_not(
    index: PrefixIndex,
) -> None:
    for branch in range(100):
        add(index, [*BASE[:250], 50_000 + branch, 1, 2, 3, 4])
    whole = add(index, BASE[:100])
    prompt = [*BASE[:250], *[9] * 10]

    found = index.longest_prefix(MODEL, prompt, whole_within=len(prompt) - 2)

    assert found is not None and (found.key, found.shared) == (whole, 100)


def test_whole_prefix_longer_than_allowed_is_not_offered(index: PrefixIndex) -> None:
    add(index, BASE[:199])

    assert index.longest_prefix(MODEL, BASE[:200], whole_within=198) is None


def test_prompt_differing_in_its_first_block_finds_nothing(index: PrefixIndex) -> None:
    add(index, BASE)

    assert index.longest_prefix(MODEL, [BASE[0], 1, *BASE[2:]]) is None


def test_entries_of_another_model_are_invisible(index: PrefixIndex) -> None:
    add(index, BASE, fingerprint="model-b")

    assert index.longest_prefix(MODEL, BASE) is None


def test_prompt_shorter_than_a_block_finds_nothing(index: PrefixIndex) -> None:
    add(index, BASE)

    assert index.longest_prefix(MODEL, BASE[: BLOCK - 1]) is None


def test_search_agrees_with_comparing_every_entry(index: PrefixIndex) -> None:
    rng = np.random.default_rng(0)
    trunk = [int(t) for t in rng.integers(0, 3, 2000)]  # few symbols: many long matches
    entries = []
    for _ in range(150):
        cut = int(rng.integers(BLOCK, 2000))
        branch = [int(t) for t in rng.integers(0, 3, int(rng.integers(0, 200)))]
        entries.append([*trunk[:cut], *branch])
        add(index, entries[-1])
    for _ in range(50):
        cut = int(rng.integers(0, 2000))
        prompt = [*trunk[:cut], *(int(t) for t in rng.integers(0, 3, 50))]
        expected = max(common_prefix(entry, prompt) for entry in entries)

        found = index.longest_prefix(MODEL, prompt)

        assert (found.shared if found else 0) == (expected if expected >= BLOCK else 0)
