"""The archive's thread keeps its indexes equal to ones built anew over the records it
knows, while building little: a finished generation extends `fresh`, a full `fresh` is
merged into `main`, and only records outgrowing the memory build `main` anew."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from test_archive_index import same_index

from reame_palimpsest import archivist as archivist_module
from reame_palimpsest.archive_index import ANCHORS, ArchiveIndex
from reame_palimpsest.archivist import Archivist


def start(root: Path, memory_tokens: int = 1_000_000) -> Archivist:
    archivist = Archivist(
        root,
        lambda: [b"a", b"b", b"c"],
        budget=1 << 30,
        memory_tokens=memory_tokens,
        segment_bytes=1 << 20,
        poll_seconds=3600,
        anchors=ANCHORS,
    )
    assert archivist.ready.wait(30)
    return archivist


def records(count: int, length: int = 40, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 20, length).astype(np.uint32) for _ in range(count)]


@pytest.fixture
def archivist(tmp_path: Path) -> Iterator[Archivist]:
    running = start(tmp_path)
    yield running
    running.close()


def test_a_finished_generation_extends_fresh(archivist: Archivist) -> None:
    main = archivist.indexes[0]
    written = records(5)
    for i, record in enumerate(written):
        assert archivist.submit(record, 0) and archivist.flush()
        assert archivist.indexes[0] is main  # `main` untouched
        assert same_index(archivist.indexes[1], ArchiveIndex(written[: i + 1]))
    assert archivist.counters.builds == 1  # at start only
    assert archivist.counters.merges == 0


def test_a_full_fresh_is_merged_into_main(
    archivist: Archivist, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(archivist_module, "FRESH_TOKENS", 100)
    written = records(5)  # 40 tokens each: the third outgrows `fresh`
    for record in written:
        assert archivist.submit(record, 0) and archivist.flush()
    assert archivist.counters.merges == 1
    assert archivist.counters.builds == 1
    assert same_index(archivist.indexes[0], ArchiveIndex(written[:3]))
    assert same_index(archivist.indexes[1], ArchiveIndex(written[3:]))


def test_records_beyond_the_memory_build_main_anew_from_the_newest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(archivist_module, "FRESH_TOKENS", 100)
    archivist = start(tmp_path, memory_tokens=150)
    try:
        written = records(6)
        for record in written:
            assert archivist.submit(record, 0) and archivist.flush()
        # The third outgrew `fresh` within the memory (120 tokens): merged. The sixth
        # outgrew it again, and all six (240) outgrow the memory: built anew from the
        # newest within three quarters of it (112 tokens: two), room for the next merges.
        assert archivist.counters.merges == 1
        assert archivist.counters.builds == 2
        assert len(archivist.indexes) == 1
        assert same_index(archivist.indexes[0], ArchiveIndex(written[4:]))
    finally:
        archivist.close()


def test_a_vanished_segment_rebuilds_only_the_index_that_held_its_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(archivist_module, "FRESH_TOKENS", 100)
    archivist = Archivist(
        tmp_path,
        lambda: [b"a", b"b", b"c"],
        budget=1 << 30,
        memory_tokens=1_000_000,
        segment_bytes=1,  # a segment per record
        poll_seconds=3600,
        anchors=ANCHORS,
    )
    try:
        assert archivist.ready.wait(30)
        written = records(5)
        names = []
        for record in written:
            assert archivist.submit(record, 0) and archivist.flush()
            names.append(archivist._records[-1][0])
        # `main`: the first three (merged); `fresh`: the last two.
        main = archivist.indexes[0]
        assert archivist.directory is not None
        (archivist.directory.path / names[4]).unlink()
        assert archivist.flush()
        assert archivist.indexes[0] is main and archivist.counters.builds == 1
        assert same_index(archivist.indexes[1], ArchiveIndex([written[3]]))

        (archivist.directory.path / names[1]).unlink()
        assert archivist.flush()
        assert archivist.counters.builds == 2
        left = [written[0], written[2], written[3]]
        assert same_index(archivist.indexes[0], ArchiveIndex(left))
    finally:
        archivist.close()
