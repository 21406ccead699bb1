"""The cache directory under crashes, races between processes, damage and a budget."""

from __future__ import annotations

import os
import random
import select
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from diskkv_testing import entry_files, temp_files

from reame_diskkv import store as store_module
from reame_diskkv.entry_format import Codec, verify
from reame_diskkv.index import entry_key
from reame_diskkv.store import DiskStore, Snapshot

FINGERPRINT = "f" * 16
UNLIMITED = 1 << 40


def snapshot(seed: int, n_tokens: int = 200, state_bytes: int = 4096) -> Snapshot:
    rng = np.random.default_rng(seed)
    tokens = tuple(int(t) for t in rng.integers(0, 50_000, n_tokens))
    state = rng.standard_normal(state_bytes // 2).astype(np.float16).tobytes()
    return Snapshot(FINGERPRINT, "model", tokens, state, Codec.ZSTD_BYTE_PLANES)


@pytest.fixture
def store(cache_dir: Path) -> Iterator[DiskStore]:
    opened = DiskStore(cache_dir)
    yield opened
    opened.close()


def load(store: DiskStore, item: Snapshot) -> bytes | None:
    found = store.find(FINGERPRINT, item.tokens, whole_within=None)
    assert found is not None and found.shared == len(item.tokens)
    return store.load(found, FINGERPRINT)


# ------------------------------------------------------------------ sharing


def test_entry_written_by_one_store_is_loaded_by_another(store: DiskStore, cache_dir: Path) -> None:
    item = snapshot(1)
    store.write(item, max_size=UNLIMITED)
    other = DiskStore(cache_dir)

    assert load(other, item) == item.state
    other.close()


def test_racing_writers_of_one_prefix_leave_one_entry(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stores = [DiskStore(cache_dir), DiskStore(cache_dir)]
    # Both writers finish their temporary file before either takes the lock.
    both_written = threading.Barrier(2)
    write_synced = store_module._write_synced

    def write_then_wait(path: Path, data: bytes) -> None:
        write_synced(path, data)
        both_written.wait(timeout=10)

    monkeypatch.setattr(store_module, "_write_synced", write_then_wait)
    item = snapshot(2)
    written: list[int] = []
    threads = [
        threading.Thread(target=lambda s=s: written.append(s.write(item, max_size=UNLIMITED)))
        for s in stores
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(written)[0] == 0 and sorted(written)[1] > 0
    assert len(entry_files(cache_dir)) == 1 and temp_files(cache_dir) == []
    assert stores[0].count() == 1 and load(stores[1], item) == item.state


WRITE_SAME_PREFIX = """
import sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_store import snapshot, UNLIMITED
from reame_diskkv.store import DiskStore
root, ready, go = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
store = DiskStore(root)
item = snapshot(3, n_tokens=2000, state_bytes=8 << 20)
ready.touch()
while not go.exists():
    time.sleep(0.001)
print(store.write(item, max_size=UNLIMITED))
"""


def test_two_processes_writing_the_same_prefix_leave_one_valid_entry(
    cache_dir: Path, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    ready = [tmp_path / f"ready-{i}" for i in range(2)]
    script = WRITE_SAME_PREFIX.format(tests=str(Path(__file__).parent))
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(cache_dir), str(flag), str(go)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for flag in ready
    ]
    deadline = time.monotonic() + 60
    while not all(flag.exists() for flag in ready) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()  # both have opened the store and built their snapshot: go
    outputs = [writer.communicate(timeout=60)[0] for writer in writers]

    written = sorted(int(output.strip()) for output in outputs)
    assert written[0] == 0 and written[1] > 0
    assert len(entry_files(cache_dir)) == 1 and temp_files(cache_dir) == []
    reader = DiskStore(cache_dir)
    assert reader.count() == 1
    item = snapshot(3, n_tokens=2000, state_bytes=8 << 20)
    assert load(reader, item) == item.state
    reader.close()


WRITE_FOREVER = """
import sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_store import snapshot, UNLIMITED
from reame_diskkv.store import DiskStore
store = DiskStore(Path(sys.argv[1]))
seed = 100
while True:
    store.write(snapshot(seed, state_bytes=2 << 20), max_size=UNLIMITED)
    print(seed, flush=True)
    store.evict(8 << 20)
    seed += 1
"""


def entries_being_written(cache_dir: Path, pid: int) -> list[Path]:
    """The temporary files of entries process `pid` writes (not its writability probe)."""
    mine = f".{pid}."
    return [
        path
        for path in temp_files(cache_dir)
        if mine in path.name and not path.name.startswith(".probe.")
    ]


def kill_while_writing(writer: subprocess.Popen[str], cache_dir: Path, within_s: float) -> None:
    """SIGKILL `writer` the moment it starts writing an entry, or after `within_s`."""
    deadline = time.monotonic() + within_s
    while not entries_being_written(cache_dir, writer.pid) and time.monotonic() < deadline:
        time.sleep(0.0005)  # leave the writer the CPU it writes with
    writer.send_signal(signal.SIGKILL)


def first_write_done(writer: subprocess.Popen[str], within_s: float) -> None:
    """Wait until `writer` reports its first complete entry (its start-up varies by host)."""
    assert writer.stdout is not None
    readable, _, _ = select.select([writer.stdout], [], [], within_s)
    assert readable and writer.stdout.readline(), "the writer wrote nothing"


def test_writer_killed_at_any_moment_leaves_only_complete_entries(cache_dir: Path) -> None:
    script = WRITE_FOREVER.format(tests=str(Path(__file__).parent))
    chance = random.Random(5)
    killed_mid_write = 0
    for round in range(8):
        writer = subprocess.Popen(
            [sys.executable, "-c", script, str(cache_dir)], stdout=subprocess.PIPE, text=True
        )
        if round % 2:  # every other kill aims at a write in progress
            kill_while_writing(writer, cache_dir, within_s=10.0)
        else:  # the others at any moment once writing is under way
            first_write_done(writer, within_s=60.0)
            time.sleep(chance.uniform(0.0, 0.5))
            writer.send_signal(signal.SIGKILL)
        writer.wait()
        assert writer.stdout is not None
        writer.stdout.close()
        killed_mid_write += bool(entries_being_written(cache_dir, writer.pid))
        for path in entry_files(cache_dir):  # an entry is named only once it is complete
            verify(path.read_bytes())

    survivor = DiskStore(cache_dir)
    survivor.reconcile()

    assert killed_mid_write >= 2  # entries caught mid-write were left as temporary files...
    assert temp_files(cache_dir) == []  # ...which repair deleted
    files = entry_files(cache_dir)
    assert files and survivor.count() == len(files)
    for path in files:
        header = verify(path.read_bytes())
        assert entry_key(header.fingerprint, header.tokens) == path.stem
    survivor.close()


# ------------------------------------------------------------------ repair


def test_temporary_file_of_a_dead_writer_is_deleted(store: DiskStore, cache_dir: Path) -> None:
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True)  # fmt: skip
    dead_pid = int(finished.stdout)
    partial = cache_dir / "v1" / f".{snapshot(4).key}.{dead_pid}.0badc0de.tmp"
    partial.write_bytes(b"REAMEKV\0 half an entry")

    store.reconcile()

    assert not partial.exists()
    assert store.find(FINGERPRINT, snapshot(4).tokens, whole_within=None) is None


def test_temporary_file_of_a_live_writer_is_kept(store: DiskStore, cache_dir: Path) -> None:
    in_progress = cache_dir / "v1" / f".{snapshot(5).key}.{os.getppid()}.0badc0de.tmp"
    in_progress.write_bytes(b"REAMEKV\0 being written")

    store.reconcile()

    assert in_progress.exists()


def test_entry_file_without_a_row_is_adopted(store: DiskStore, cache_dir: Path) -> None:
    item = snapshot(6)
    store.write(item, max_size=UNLIMITED)
    with sqlite3.connect(cache_dir / "v1" / "index.sqlite") as db:  # the crash lost the row
        db.execute("DELETE FROM entries")
        db.execute("DELETE FROM blocks")

    store.reconcile()

    assert load(store, item) == item.state


def test_damaged_file_without_a_row_is_deleted(store: DiskStore, cache_dir: Path) -> None:
    orphan = cache_dir / "v1" / f"{snapshot(7).key}.kv"
    orphan.write_bytes(b"REAMEKV\0 not an entry at all")

    store.reconcile()

    assert not orphan.exists()
    assert store.counters.corrupt == 1


def test_row_whose_file_is_gone_is_dropped(store: DiskStore) -> None:
    item = snapshot(8)
    store.write(item, max_size=UNLIMITED)
    (store.directory / f"{item.key}.kv").unlink()

    store.reconcile()

    assert store.count() == 0


def test_row_whose_file_vanished_since_the_lookup_is_a_miss(store: DiskStore) -> None:
    item = snapshot(9)
    store.write(item, max_size=UNLIMITED)
    found = store.find(FINGERPRINT, item.tokens, whole_within=None)
    assert found is not None
    (store.directory / f"{item.key}.kv").unlink()

    assert store.load(found, FINGERPRINT) is None
    assert store.count() == 0 and store.counters.corrupt == 0


def test_unreadable_index_is_rebuilt_from_the_entry_files(cache_dir: Path) -> None:
    item = snapshot(10)
    first = DiskStore(cache_dir)
    first.write(item, max_size=UNLIMITED)
    first.close()
    for path in (cache_dir / "v1").glob("index.sqlite*"):
        path.write_bytes(b"this is not an sqlite database" * 100)

    rebuilt = DiskStore(cache_dir)
    rebuilt.reconcile()

    assert load(rebuilt, item) == item.state
    rebuilt.close()


# ------------------------------------------------------------------ budget


def test_eviction_keeps_the_budget_deleting_the_least_recently_used(store: DiskStore) -> None:
    items = [snapshot(seed) for seed in range(20, 24)]
    sizes = []
    for item in items[:3]:
        sizes.append(store.write(item, max_size=UNLIMITED))
    store.touch(items[0].key)  # used again: the second entry is now the oldest
    sizes.append(store.write(items[3], max_size=UNLIMITED))

    evicted = store.evict(budget=sum(sizes) - sizes[1])

    assert evicted == 1
    assert store.total_size() <= sum(sizes) - sizes[1]
    assert not store.holds(FINGERPRINT, items[1].tokens)
    assert all(store.holds(FINGERPRINT, items[i].tokens) for i in (0, 2, 3))
    assert store.counters.evictions == 1


def test_entry_open_by_a_reader_survives_its_eviction(store: DiskStore) -> None:
    item = snapshot(30)
    store.write(item, max_size=UNLIMITED)
    found = store.find(FINGERPRINT, item.tokens, whole_within=None)
    assert found is not None
    with (store.directory / f"{item.key}.kv").open("rb") as reading:
        store.evict(budget=0)
        data = reading.read()

    assert store.count() == 0
    assert verify(data).tokens == item.tokens


def test_entry_larger_than_the_budget_is_not_written(store: DiskStore, cache_dir: Path) -> None:
    assert store.write(snapshot(31), max_size=100) == 0
    assert entry_files(cache_dir) == [] and temp_files(cache_dir) == []


def test_clear_deletes_every_entry_of_every_model(store: DiskStore, cache_dir: Path) -> None:
    store.write(snapshot(32), max_size=UNLIMITED)
    other = snapshot(33)
    moved = Snapshot("another model", "m2", other.tokens, other.state, other.codec)
    store.write(moved, max_size=UNLIMITED)

    entries, size = store.clear()

    assert entries == 2 and size > 0
    assert entry_files(cache_dir) == [] and store.count() == 0


# ----------------------------------------------------------------- promises


def test_a_promise_is_seen_by_other_owners_until_the_entry_is_written(
    store: DiskStore, cache_dir: Path
) -> None:
    item = snapshot(40)
    prompt = [*item.tokens, 7, 8, 9]
    other = DiskStore(cache_dir)
    try:
        keys = store.promise(FINGERPRINT, [item.tokens], owner="me", until=time.time() + 60)

        seen = other.pending(FINGERPRINT, prompt, longer_than=0, owner="you")
        mine = store.pending(FINGERPRINT, prompt, longer_than=0, owner="me")
        held_already = other.pending(FINGERPRINT, prompt, longer_than=200, owner="you")
        another_prompt = other.pending(FINGERPRINT, [5, *prompt], longer_than=0, owner="you")
        another_model = other.pending("0" * 16, prompt, longer_than=0, owner="you")
        store.write(item, max_size=UNLIMITED)
        store.fulfil(item.key)
        after = other.pending(FINGERPRINT, prompt, longer_than=0, owner="you")
    finally:
        other.close()

    assert keys == [item.key]
    assert seen == len(item.tokens)
    assert mine is held_already is another_prompt is another_model is after is None


def test_promises_lapse_die_with_their_process_and_are_withdrawn(
    store: DiskStore, cache_dir: Path
) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead_owner = f"{store_module.socket.gethostname()}/{dead.stdout.strip()}/abcd"
    tokens = [snapshot(seed).tokens for seed in (41, 42, 43)]
    store.promise(FINGERPRINT, [tokens[0]], owner="lapsed", until=time.time() - 1)
    store.promise(FINGERPRINT, [tokens[1]], owner=dead_owner, until=time.time() + 60)
    store.promise(FINGERPRINT, [tokens[2]], owner="withdrawn", until=time.time() + 60)
    live_elsewhere = "another-host/1/abcd"
    store.promise(FINGERPRINT, [tokens[2][:100]], owner=live_elsewhere, until=time.time() + 60)
    store.withdraw([entry_key(FINGERPRINT, tokens[2])], owner="withdrawn")

    pending = [store.pending(FINGERPRINT, [*t, 1, 2], longer_than=0, owner="me") for t in tokens]
    store.reconcile()

    assert pending == [None, None, 100]
    assert store._index.promise_owners() == {live_elsewhere}


def test_an_index_from_before_promises_gains_their_table(cache_dir: Path) -> None:
    DiskStore(cache_dir).close()
    db = sqlite3.connect(cache_dir / "v1" / "index.sqlite")
    db.execute("DROP TABLE promises")
    db.commit()
    db.close()

    reopened = DiskStore(cache_dir)
    reopened.promise(FINGERPRINT, [snapshot(44).tokens], owner="me", until=time.time() + 60)

    assert reopened._index.promise_owners() == {"me"}
    reopened.close()


def test_a_promise_waits_only_briefly_for_another_processs_write_lock(
    store: DiskStore, cache_dir: Path
) -> None:
    holder = sqlite3.connect(cache_dir / "v1" / "index.sqlite", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process writing
    started = time.monotonic()
    with pytest.raises(sqlite3.OperationalError):
        store.promise(FINGERPRINT, [snapshot(45).tokens], owner="me", until=time.time() + 60)
    waited = time.monotonic() - started
    holder.execute("COMMIT")
    holder.close()

    # Then writes wait as long as they did before: the store's own timeout is back.
    store.promise(FINGERPRINT, [snapshot(45).tokens], owner="me", until=time.time() + 60)
    assert waited < store_module.PROMISE_PATIENCE_S + 0.2
    assert store._index._db.execute("PRAGMA busy_timeout").fetchone()[0] == 10_000
