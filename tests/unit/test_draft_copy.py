"""The draft model's Q4_0 copy, with llama.cpp's quantizer replaced by a stand-in that writes
a file or fails: when a copy is made, reused, replaced or given up, and that none is ever
left half-written (the real quantizer on the real model is in tests/integration)."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from reame_core.models import draft_copy
from reame_core.models.draft_copy import FOLDER, copy_name, q4_0_copy, remove_copies


class Quantizer:
    """Stands in for llama.cpp's quantizer: writes `source`'s bytes reversed, or fails."""

    def __init__(self, status: int = 0) -> None:
        self.status = status
        self.calls: list[tuple[Path, Path, int]] = []

    def __call__(self, source: Path, target: Path, threads: int) -> int:
        self.calls.append((source, target, threads))
        if self.status == 0:
            target.write_bytes(source.read_bytes()[::-1])
        else:
            target.write_bytes(b"half")  # what a failing quantizer may leave behind
        return self.status


@pytest.fixture
def quantizer(monkeypatch: pytest.MonkeyPatch) -> Quantizer:
    stand_in = Quantizer()
    monkeypatch.setattr(draft_copy, "_quantize", stand_in)
    return stand_in


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "models" / "Draft-0.5B.Q4_K_M.gguf"
    path.parent.mkdir()
    path.write_bytes(b"GGUF weights")
    return path


def files_in(folder: Path) -> list[str]:
    """What the folder holds besides its lock file."""
    return sorted(path.name for path in folder.iterdir() if path.name != ".lock")


def test_the_copy_is_made_once_under_the_cache_directory(
    quantizer: Quantizer, source: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    first = q4_0_copy(source, cache, threads=2)
    assert first is not None
    assert first.parent == cache / FOLDER
    assert first.name.startswith("Draft-0.5B.Q4_K_M.") and first.name.endswith(".q4_0.gguf")
    assert first.read_bytes() == b"sthgiew FUGG"
    assert quantizer.calls[0][0] == source and quantizer.calls[0][2] == 2
    again = q4_0_copy(source, cache, threads=2)
    assert again == first
    assert len(quantizer.calls) == 1, "an existing copy is used as it is"
    assert files_in(cache / FOLDER) == [first.name], "no scratch file is left"


def test_the_quantizer_writes_under_a_scratch_name_renamed_when_complete(
    quantizer: Quantizer, source: Path, tmp_path: Path
) -> None:
    copy = q4_0_copy(source, tmp_path, threads=1)
    assert copy is not None
    written = quantizer.calls[0][1]
    assert written == copy.with_name(f".{copy.name}.part")
    assert not written.exists()


def test_what_a_killed_process_left_is_overwritten_and_cleared(
    quantizer: Quantizer, source: Path, tmp_path: Path
) -> None:
    folder = tmp_path / FOLDER
    folder.mkdir()
    left = folder / f".{copy_name(source)}.part"
    left.write_bytes(b"half a copy")
    copy = q4_0_copy(source, tmp_path, threads=2)
    assert copy is not None and copy.read_bytes() == b"sthgiew FUGG"
    assert files_in(folder) == [copy.name]


def test_a_failed_copy_leaves_nothing(
    monkeypatch: pytest.MonkeyPatch, source: Path, tmp_path: Path
) -> None:
    monkeypatch.setattr(draft_copy, "_quantize", Quantizer(status=1))
    assert q4_0_copy(source, tmp_path, threads=2) is None
    assert files_in(tmp_path / FOLDER) == []


def test_a_cache_that_cannot_be_written_gives_no_copy_and_no_error(
    quantizer: Quantizer, source: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    cache.write_bytes(b"a file where the cache directory should be")
    assert q4_0_copy(source, cache, threads=2) is None
    assert quantizer.calls == []


def test_a_quantizer_failing_on_the_disk_gives_no_copy_and_no_error(
    monkeypatch: pytest.MonkeyPatch, source: Path, tmp_path: Path
) -> None:
    def full_disk(source: Path, target: Path, threads: int) -> int:
        target.write_bytes(b"part")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(draft_copy, "_quantize", full_disk)
    assert q4_0_copy(source, tmp_path, threads=2) is None
    assert files_in(tmp_path / FOLDER) == []


def test_no_copy_is_tried_without_room_for_it(
    quantizer: Quantizer, source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(draft_copy, "free_disk_bytes", lambda path: 3)
    assert q4_0_copy(source, tmp_path, threads=2) is None
    assert quantizer.calls == []


def test_two_makers_at_once_quantize_once(
    monkeypatch: pytest.MonkeyPatch, source: Path, tmp_path: Path
) -> None:
    calls = []

    def slow(source: Path, target: Path, threads: int) -> int:
        calls.append(target)
        time.sleep(0.2)
        target.write_bytes(b"q4")
        return 0

    monkeypatch.setattr(draft_copy, "_quantize", slow)
    with ThreadPoolExecutor(2) as pool:
        copies = list(pool.map(lambda _: q4_0_copy(source, tmp_path, threads=1), range(2)))
    assert copies[0] is not None and copies[0] == copies[1]
    assert len(calls) == 1, "the second waited for the first's copy"


def test_a_new_version_of_the_file_replaces_its_copy(
    quantizer: Quantizer, source: Path, tmp_path: Path
) -> None:
    old = q4_0_copy(source, tmp_path, threads=2)
    source.write_bytes(b"GGUF newer weights")
    os.utime(source, ns=(source.stat().st_atime_ns, source.stat().st_mtime_ns + 10**9))
    new = q4_0_copy(source, tmp_path, threads=2)
    assert new is not None and old is not None and new != old
    assert files_in(tmp_path / FOLDER) == [new.name]
    assert new.read_bytes() == b"sthgiew rewen FUGG"


def test_a_file_of_the_same_name_elsewhere_takes_the_copys_place(
    quantizer: Quantizer, source: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "other" / source.name
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(b"GGUF other weights")
    mine = q4_0_copy(source, tmp_path, threads=2)
    theirs = q4_0_copy(elsewhere, tmp_path, threads=2)
    assert mine is not None and theirs is not None and mine != theirs
    assert files_in(tmp_path / FOLDER) == [theirs.name]
    assert theirs.read_bytes() == b"sthgiew rehto FUGG"


def test_removing_the_copies_of_a_file_frees_them_and_any_scratch(
    quantizer: Quantizer, source: Path, tmp_path: Path
) -> None:
    copy = q4_0_copy(source, tmp_path, threads=2)
    assert copy is not None
    left = copy.with_name(f".{copy.name}.part")
    left.write_bytes(b"half")
    other = tmp_path / "Other.gguf"
    other.write_bytes(b"GGUF")
    kept = q4_0_copy(other, tmp_path, threads=2)
    assert kept is not None

    assert remove_copies(source, tmp_path) == len(b"sthgiew FUGG") + len(b"half")
    assert files_in(tmp_path / FOLDER) == [kept.name]


def test_the_name_holds_the_source_name_and_a_key(source: Path) -> None:
    name = copy_name(source)
    stem, key = name.removesuffix(".q4_0.gguf").rsplit(".", 1)
    assert stem == "Draft-0.5B.Q4_K_M"
    assert len(key) == draft_copy.KEY_DIGITS and all(c in "0123456789abcdef" for c in key)
    assert copy_name(source) == name, "the same file gets the same name"
