"""The disk prefix cache on a real file system that fails: full (a small tmpfs, so sqlite's
own journal writes get ENOSPC as well as the entry files), remounted read-only, deleted
while the server runs, shared by processes that write and evict under one budget while
one of them is killed. Whatever happens, answers are the model's own greedy tokens, no
damaged entry is ever restored, files and index rows agree afterwards, and the fault is
said once in the log and counted in the metrics."""

from __future__ import annotations

import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import structlog
from diskkv_testing import StartCache, entry_files, temp_files
from test_store import FINGERPRINT, UNLIMITED, snapshot

from reame_diskkv.entry_format import verify
from reame_diskkv.index import entry_key
from reame_diskkv.store import DiskStore
from reame_diskkv.writer import SnapshotWriter

if TYPE_CHECKING:
    from conftest import SmallDisk

QUESTION = "Which ships are due on Tuesday?"
SYSTEM_B = "You keep the lighthouse log and answer in one line. " * 8


@pytest.fixture
def disk(small_disk: Callable[[int], SmallDisk]) -> SmallDisk:
    return small_disk(2 << 20)


@pytest.fixture
def cache_dir(disk: SmallDisk) -> Path:
    """The engines' cache directory (`start_cache`), on the small disk."""
    return disk.path / "kv"


def warnings_in(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in logs if line["log_level"] == "warning"]


def faults(running: Any) -> dict[str, int]:
    return dict(running.cache.reame_collect_stats()["disk_faults"]["diskkv"])


def assert_consistent(cache_dir: Path) -> int:
    """Files and index rows agree, every file is a whole entry named for its contents, no
    temporary file is left; returns how many entries there are."""
    reader = DiskStore(cache_dir)
    try:
        files = entry_files(cache_dir)
        assert reader.count() == len(files)
        assert temp_files(cache_dir) == []
        for path in files:
            header = verify(path.read_bytes())
            assert entry_key(header.fingerprint, header.tokens) == path.stem
        return len(files)
    finally:
        reader.close()


# ------------------------------------------------------------------ a full disk


def test_a_full_disk_at_any_point_of_a_write_leaves_files_and_index_agreeing(
    disk: SmallDisk,
) -> None:
    """Fill the disk so a write runs out of space at a different point each time: in the
    entry's own file, or in sqlite's journal once the file is in place."""
    cache_dir = disk.path / "kv"
    store = DiskStore(cache_dir)
    failed: set[str] = set()
    for seed, leave in enumerate(range(0, 160 << 10, 8 << 10)):
        filler = disk.fill(leave)
        try:
            store.write(snapshot(seed, state_bytes=48 << 10), max_size=UNLIMITED)
        except (OSError, sqlite3.Error) as error:
            failed.add(type(error).__name__)
        filler.unlink()
        assert store.count() == len(entry_files(cache_dir)) and temp_files(cache_dir) == []

    assert {"OSError", "OperationalError"} <= failed  # the file's write and sqlite's
    item = snapshot(999)
    assert store.write(item, max_size=UNLIMITED) > 0  # no transaction was left open
    found = store.find(FINGERPRINT, item.tokens, whole_within=None)
    assert found is not None and store.load(found, FINGERPRINT) == item.state
    store.close()
    assert assert_consistent(cache_dir) > 1


def test_a_full_disk_keeps_answers_exact_and_says_so_once(
    start_cache: StartCache, disk: SmallDisk, cache_dir: Path
) -> None:
    running = start_cache({"turns": 2})
    disk.fill()
    prompts = [running.chat(QUESTION), running.chat(QUESTION, system=SYSTEM_B)]

    with structlog.testing.capture_logs() as logs:
        results = [running.generate(prompt) for prompt in prompts for _ in range(2)]

    for result, prompt in zip(results, [p for p in prompts for _ in range(2)], strict=True):
        assert list(result.candidates[0].tokens) == running.reference(prompt)
    (warning,) = warnings_in(logs)
    assert "No space left" in warning["error"] or "full" in warning["error"]
    assert faults(running)["write_error"] >= 1
    assert assert_consistent(cache_dir) == 0


def test_a_cache_filling_its_own_small_disk_lowers_its_budget_and_stores_on(
    disk: SmallDisk,
) -> None:
    """A budget far larger than the disk (granted from another disk's free space): once
    the disk is full, the cache shrinks to fit it instead of failing every write."""
    cache_dir = disk.path / "kv"
    writer = SnapshotWriter(DiskStore(cache_dir), budget=1 << 40, retry_after_s=0)
    items = [snapshot(seed, state_bytes=96 << 10) for seed in range(60)]  # 3x the disk
    for item in items:
        assert writer.submit(item) and writer.flush()

    assert writer.budget < 2 << 20 and writer.store.counters.write_errors >= 1
    stored = [writer.store.holds(FINGERPRINT, item.tokens) for item in items]
    assert sum(stored[-10:]) >= 9  # the newest are kept: the cache goes on working
    writer.close()
    assert assert_consistent(cache_dir) > 5


# ------------------------------------------------------------------ read-only


def test_a_disk_failing_read_only_while_serving_still_restores_what_it_holds(
    start_cache: StartCache, small_disk: Callable[..., SmallDisk]
) -> None:
    disk = small_disk(16 << 20, "ext4")
    section = {"dir": str(disk.path / "kv")}
    first = start_cache(section)
    stored = first.chat(QUESTION)
    first.generate(stored)
    running = start_cache(section)
    disk.fail()  # read-only under the open index and everything else

    with structlog.testing.capture_logs() as logs:
        warm = running.generate(stored)
        new = running.chat(QUESTION, system=SYSTEM_B)
        cold = [running.generate(new) for _ in range(2)]

    assert list(warm.candidates[0].tokens) == running.reference(stored)
    assert warm.usage.restored_tokens > 0  # reading goes on
    for result in cold:
        assert list(result.candidates[0].tokens) == running.reference(new)
    (warning,) = warnings_in(logs)
    assert "cannot write" in warning["event"]  # sqlite says "disk I/O error", Python EROFS
    assert faults(running)["write_error"] >= 1
    (entry,) = entry_files(disk.path / "kv")
    verify(entry.read_bytes())


def test_a_read_only_disk_at_start_serves_without_the_cache_and_counts_it(
    start_cache: StartCache, disk: SmallDisk
) -> None:
    disk.remount("ro")

    with structlog.testing.capture_logs() as logs:
        running = start_cache()
        prompt = running.chat(QUESTION)
        results = [running.generate(prompt) for _ in range(2)]

    for result in results:
        assert list(result.candidates[0].tokens) == running.reference(prompt)
    (warning,) = warnings_in(logs)
    assert "off" in warning["event"]
    assert faults(running)["directory_unusable"] == 1


# ------------------------------------------------------------------ deleted


def test_a_directory_deleted_while_serving_is_made_again(
    start_cache: StartCache, tmp_path: Path
) -> None:
    cache_dir = tmp_path / "deleted"
    running = start_cache({"dir": str(cache_dir)})
    first = running.chat(QUESTION)
    running.generate(first)
    shutil.rmtree(cache_dir)

    with structlog.testing.capture_logs() as logs:
        later = running.chat(QUESTION, system=SYSTEM_B)
        result = running.generate(later)

    assert list(result.candidates[0].tokens) == running.reference(later)
    assert len(warnings_in(logs)) == 1
    assert assert_consistent(cache_dir) == 1  # the new prefix, in a new directory
    restarted = start_cache({"dir": str(cache_dir)})
    again = restarted.generate(later)
    assert list(again.candidates[0].tokens) == restarted.reference(later)
    assert again.usage.restored_tokens > 0


# ------------------------------------------------------------------ processes


WRITE_AND_EVICT = """
import sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_store import snapshot
from reame_diskkv.store import DiskStore
from reame_diskkv.writer import SnapshotWriter
root, first, budget, forever = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
store = DiskStore(root)
while True:
    for seed in range(first, first + 40):
        store.write(snapshot(seed, state_bytes=96 << 10), max_size=budget)
        store.evict(budget)
    if forever != "forever":
        break
"""


def test_processes_writing_other_prefixes_under_one_budget_keep_it_and_serve_no_damage(
    tmp_path: Path,
) -> None:
    """Three writers, each its own prefixes, evicting to one shared budget while a reader
    loads whatever is indexed; the third writes until it is killed -9."""
    cache_dir = tmp_path / "kv"
    budget = 8 * (100 << 10)
    script = WRITE_AND_EVICT.format(tests=str(Path(__file__).parent))
    seeds = {w: range(1000 * w, 1000 * w + 40) for w in range(3)}
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(cache_dir), str(1000 * w), str(budget), how]
        )
        for w, how in enumerate(("once", "once", "forever"))
    ]
    expected = {entry_key(FINGERPRINT, snapshot(s).tokens) for r in seeds.values() for s in r}
    deadline = time.monotonic() + 60
    while not (cache_dir / "v1" / "index.sqlite").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    reader = DiskStore(cache_dir)
    served = 0
    everyone = [s for r in seeds.values() for s in r]
    while writers[0].poll() is None or writers[1].poll() is None:
        for seed in everyone[served % 5 :: 5]:
            item = snapshot(seed, state_bytes=96 << 10)
            found = reader.find(FINGERPRINT, item.tokens, whole_within=None)
            if found is not None and (state := reader.load(found, FINGERPRINT)) is not None:
                assert state == item.state  # never another's, never damaged
                served += 1
    writers[2].send_signal(signal.SIGKILL)
    reader.close()

    assert [w.wait(60) for w in writers] == [0, 0, -signal.SIGKILL]
    assert served > 0 and reader.counters.corrupt == 0
    # Killed between a write and its eviction, the third may have left one entry too many:
    # the next cache to start deletes it, with the killed writer's temporary file.
    assert DiskStore(cache_dir).total_size() <= budget + (100 << 10)
    writer = SnapshotWriter(DiskStore(cache_dir), budget=budget)
    assert writer.flush()
    writer.close()
    assert assert_consistent(cache_dir) > 0
    assert DiskStore(cache_dir).total_size() <= budget
    assert {path.stem for path in entry_files(cache_dir)} <= expected
