"""The draft model's Q4_0 copy, with llama.cpp's quantizer replaced by a stand-in that writes
a file or fails: when a copy is made, reused, replaced, and that none is ever left
half-written (the real quantizer on the real model is in tests/integration)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reame_core.models import draft_copy
from reame_core.models.draft_copy import FOLDER, copy_name, q4_0_copy


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
    return sorted(path.name for path in folder.iterdir())


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
    assert files_in(cache / FOLDER) == [first.name], "no temporary file is left"


def test_the_quantizer_writes_under_a_temporary_name(
    quantizer: Quantizer, source: Path, tmp_path: Path
) -> None:
    copy = q4_0_copy(source, tmp_path, threads=1)
    assert copy is not None
    written = quantizer.calls[0][1]
    assert written != copy and written.name.startswith(".") and written.name.endswith(".part")
    assert not written.exists()


def test_a_failed_copy_leaves_nothing_and_drafts_from_the_file(
    monkeypatch: pytest.MonkeyPatch, source: Path, tmp_path: Path
) -> None:
    monkeypatch.setattr(draft_copy, "_quantize", Quantizer(status=1))
    assert q4_0_copy(source, tmp_path, threads=2) is None
    assert files_in(tmp_path / FOLDER) == []


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


def test_a_file_of_the_same_name_elsewhere_keeps_its_own_copy(
    quantizer: Quantizer, source: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "other" / source.name
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(b"GGUF other weights")
    mine = q4_0_copy(source, tmp_path, threads=2)
    theirs = q4_0_copy(elsewhere, tmp_path, threads=2)
    assert mine is not None and theirs is not None and mine != theirs
    assert files_in(tmp_path / FOLDER) == sorted([mine.name, theirs.name])


def test_the_name_holds_the_source_name_and_two_keys(source: Path) -> None:
    name = copy_name(source)
    stem, keys = name.removesuffix(".q4_0.gguf").rsplit(".", 1)
    assert stem == "Draft-0.5B.Q4_K_M"
    assert len(keys) == 2 * draft_copy.KEY and all(c in "0123456789abcdef" for c in keys)
    assert copy_name(source) == name, "the same file gets the same name"
