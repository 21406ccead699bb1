"""The cache directory: entry files, their index, and the rules that keep them consistent.

`DiskStore` is the only code that touches the directory. Several stores share one
directory — one per thread in a server, and any number of processes on the host — and
each follows the same rules, so none can break another's reads:

- An entry is written to a temporary file and fsynced; then, holding the index's write
  lock, renamed to its key, the directory fsynced and its row inserted. A crash leaves a
  complete entry or a temporary file, which `reconcile` deletes once its writer is dead.
  Two processes writing the same prefix both finish their temporary file, but under the
  lock only the first renames it; the other deletes its own.
- Eviction deletes rows and files under the same lock, so it never interleaves with a
  rename. It may delete a file another process is reading: on POSIX the reader keeps the
  open file, so an entry in use is never cut from under it; a reader that has not opened
  the file yet finds it gone and counts a miss.
- A file is never trusted: every read checks its size, checksum, model fingerprint and
  tokens. A file that fails is counted, logged, deleted and its row dropped; the caller
  computes the prefix again.
- Rows are a summary of the files: `reconcile` drops rows whose file is gone and adopts
  complete files that lack a row (a crash between rename and insert).
- Promises (a prefix a process is computing and will store) are hints, never trusted
  for content: each lapses at its `until`, a dead process's are ignored and dropped, and
  writing or failing to write the entry ends it. A process waiting for one restores
  only what an entry then holds.

Layout: ``<root>/v<format version>/{index.sqlite, <key>.kv, .<key>.<pid>.<random>.tmp}``.
A store is used by one thread at a time.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import structlog

from reame_diskkv import entry_format
from reame_diskkv.entry_format import Codec, CorruptEntry
from reame_diskkv.index import IndexedEntry, ModelUsage, PrefixIndex, entry_key

log = structlog.get_logger(__name__)

LAYOUT = f"v{entry_format.FORMAT_VERSION}"
# How long recording a promise waits for another process's write lock: it is done on the
# engine thread, and a promise not made only costs what computing without promises does.
PROMISE_PATIENCE_S = 0.02
INDEX_FILE = "index.sqlite"
ENTRY_SUFFIX = ".kv"
TEMP_SUFFIX = ".tmp"


@dataclass
class CacheCounters:
    """What a cache did: reads, writes, failures. Each instance has one writing thread."""

    hits: int = 0
    misses: int = 0
    restored_tokens: int = 0
    bytes_read: int = 0
    corrupt: int = 0
    read_errors: int = 0
    snapshots_dropped: int = 0
    promises_made: int = 0  # prefixes this process told the others it is computing
    promise_errors: int = 0  # promises the index could not record
    entries_written: int = 0
    tokens_written: int = 0
    bytes_written: int = 0
    write_seconds: float = 0.0
    write_errors: int = 0
    evictions: int = 0
    index_errors: int = 0  # lookups the index could not answer
    indexes_rebuilt: int = 0  # index files sqlite could not read, rebuilt from the entries
    directories_recreated: int = 0  # the directory was deleted under a running server

    def __add__(self, other: CacheCounters) -> CacheCounters:
        return CacheCounters(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        )

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Snapshot:
    """The KV state of `tokens` under model `fingerprint`, waiting to be written."""

    fingerprint: str
    model: str
    tokens: tuple[int, ...]
    state: bytes
    codec: Codec

    @property
    def key(self) -> str:
        return entry_key(self.fingerprint, self.tokens)


class DiskStore:
    """See the module docstring. Raises OSError or sqlite3.Error if `root` is unusable:
    not creatable, not writable, or its index cannot be opened. What the store does is
    added to `counters`, which only the store's thread may write."""

    def __init__(
        self,
        root: Path,
        *,
        counters: CacheCounters | None = None,
        busy_timeout_s: float = 10.0,
    ) -> None:
        self.root = root
        self.directory = root / LAYOUT
        self.directory.mkdir(parents=True, exist_ok=True)
        self._check_writable()
        self.counters = counters if counters is not None else CacheCounters()
        self._busy_timeout_s = busy_timeout_s
        self._index = _open_index(self.directory / INDEX_FILE, busy_timeout_s, self.counters)
        self._index_file = _identity(self.directory / INDEX_FILE)

    def close(self) -> None:
        self._index.close()

    def vanished(self) -> bool:
        """Whether the index file this store opened is no longer in the directory: the
        directory was deleted (or replaced) while the store was open."""
        return _identity(self.directory / INDEX_FILE) != self._index_file

    def reopen(self) -> None:
        """Start again on the directory, made anew if it is gone, with its index as it is
        now. Raises what the constructor raises, and then keeps the index it had."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._check_writable()
        index = _open_index(self.directory / INDEX_FILE, self._busy_timeout_s, self.counters)
        self._index.close()
        self._index, self._index_file = index, _identity(self.directory / INDEX_FILE)

    def _check_writable(self) -> None:
        probe = self._temp_path("probe")
        _write_synced(probe, b"")
        probe.unlink()

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}{ENTRY_SUFFIX}"

    def _temp_path(self, key: str) -> Path:
        return self.directory / f".{key}.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}"

    # ---------------------------------------------------------------- reading

    def find(
        self, fingerprint: str, tokens: Sequence[int], *, whole_within: int | None
    ) -> IndexedEntry | None:
        """The indexed entry sharing the longest prefix with `tokens` (see PrefixIndex)."""
        return self._index.longest_prefix(fingerprint, tokens, whole_within=whole_within)

    def holds(self, fingerprint: str, tokens: Sequence[int]) -> bool:
        return self._index.has(entry_key(fingerprint, tokens))

    def load(self, entry: IndexedEntry, fingerprint: str) -> bytes | None:
        """The state of `entry`, or None if its file is gone, unreadable or corrupt
        (corrupt files are deleted)."""
        path = self._path(entry.key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:  # evicted since the lookup, or by another process
            self._forget(entry.key)
            return None
        except OSError as error:
            self.counters.read_errors += 1
            log.warning("disk prefix cache: entry unreadable", key=entry.key, error=str(error))
            return None
        try:
            state = entry_format.decode(data, fingerprint=fingerprint, tokens=entry.tokens)
        except CorruptEntry as error:
            self.counters.corrupt += 1
            log.warning("disk prefix cache: corrupt entry deleted", key=entry.key, why=str(error))
            path.unlink(missing_ok=True)
            self._forget(entry.key)
            return None
        self.counters.bytes_read += len(data)
        return state

    def pending(
        self, fingerprint: str, tokens: Sequence[int], *, longer_than: int, owner: str
    ) -> int | None:
        """The length of the longest live prefix of `tokens` another owner than `owner`
        promised to store, more than `longer_than` tokens; None if there is none."""
        for promise in self._index.promised(
            fingerprint, tokens, longer_than=longer_than, now=time.time()
        ):
            if promise.owner != owner and owner_alive(promise.owner):
                return promise.n_tokens
        return None

    def promise(
        self,
        fingerprint: str,
        prefixes: Sequence[Sequence[int]],
        *,
        owner: str,
        until: float,
        withdrawn: Sequence[str] = (),
    ) -> list[str]:
        """Promise, as `owner`, to store each of `prefixes` before `until`, and withdraw
        `owner`'s promises named `withdrawn`, in one transaction. Returns the new
        promises' keys."""
        keys = [entry_key(fingerprint, tokens) for tokens in prefixes]
        with self._index.writing(patience_s=PROMISE_PATIENCE_S):
            self._index.withdraw(withdrawn, owner=owner)
            for key, tokens in zip(keys, prefixes, strict=True):
                self._index.promise(
                    key, fingerprint=fingerprint, tokens=tokens, owner=owner, until=until
                )
        return keys

    def withdraw(self, keys: Sequence[str], *, owner: str) -> None:
        with self._index.writing(patience_s=PROMISE_PATIENCE_S):
            self._index.withdraw(keys, owner=owner)

    def fulfil(self, key: str) -> None:
        """The entry `key` is stored, or will not be: nobody need wait for it. Promises
        that lapsed meanwhile go too."""
        with self._index.writing():
            self._index.withdraw([key])
            self._index.drop_promises(before=time.time())

    def drop_dead_promises(self) -> None:
        """Drop lapsed promises and those of processes on this host that are gone."""
        owners = [o for o in self._index.promise_owners() if not owner_alive(o)]
        with self._index.writing():
            self._index.drop_promises(before=time.time(), owners=owners)

    def _forget(self, key: str) -> None:
        """Drop the row of an entry whose file is gone. A busy index keeps the row for
        now: the next reader finds the file gone and tries again."""
        with contextlib.suppress(sqlite3.OperationalError), self._index.writing():
            self._index.remove(key)

    def total_size(self) -> int:
        return self._index.total_size()

    def count(self) -> int:
        return self._index.count()

    def usage(self) -> list[ModelUsage]:
        return self._index.usage()

    # ---------------------------------------------------------------- writing

    def write(self, snapshot: Snapshot, *, max_size: int, level: int = 3) -> int:
        """Store `snapshot` unless the directory holds it already or it would take more
        than `max_size` bytes. Returns the bytes written."""
        started = time.perf_counter()
        key = snapshot.key
        if self._index.has(key):
            return 0
        data = entry_format.encode(
            fingerprint=snapshot.fingerprint,
            model=snapshot.model,
            tokens=snapshot.tokens,
            state=snapshot.state,
            codec=snapshot.codec,
            level=level,
        )
        if len(data) > max_size:
            return 0
        temp, path = self._temp_path(key), self._path(key)
        renamed = False
        try:
            _write_synced(temp, data)
            with self._index.writing():
                if self._index.has(key):  # another process stored it meanwhile
                    return 0
                os.replace(temp, path)
                renamed = True
                _sync_directory(self.directory)
                self._index.add(
                    key,
                    fingerprint=snapshot.fingerprint,
                    model=snapshot.model,
                    tokens=snapshot.tokens,
                    size=len(data),
                    when=time.time(),
                )
        except BaseException:
            if renamed:
                # Its row was not committed (sqlite's journal on a full disk, say): the file
                # would sit outside the budget's count. Should another process have stored
                # the same prefix since, its row loses its file: a miss, never a wrong read.
                path.unlink(missing_ok=True)
            raise
        finally:
            temp.unlink(missing_ok=True)
        counters = self.counters
        counters.entries_written += 1
        counters.tokens_written += len(snapshot.tokens)
        counters.bytes_written += len(data)
        counters.write_seconds += time.perf_counter() - started
        return len(data)

    def touch(self, key: str) -> None:
        """The entry was just used: it is evicted last."""
        with self._index.writing():
            self._index.touch(key, time.time())

    def evict(self, budget: int) -> int:
        """Delete least recently used entries until they take at most `budget` bytes.
        Returns how many were deleted."""
        with self._index.writing():
            total = self._index.total_size()
            victims = []
            for key, size in self._index.by_last_use():
                if total <= budget:
                    break
                victims.append(key)
                total -= size
            for key in victims:
                self._index.remove(key)
                self._path(key).unlink(missing_ok=True)
        self.counters.evictions += len(victims)
        return len(victims)

    def clear(self) -> tuple[int, int]:
        """Delete every entry of every model. Returns (entries, bytes) deleted."""
        with self._index.writing():
            entries, size = self._index.count(), self._index.total_size()
            for key in self._index.entry_keys():
                self._index.remove(key)
            for path in self.directory.glob(f"*{ENTRY_SUFFIX}"):
                path.unlink(missing_ok=True)
        self._delete_dead_temps()
        return entries, size

    def reconcile(self) -> None:
        """Make rows and files agree after crashes: drop rows without a file, adopt
        complete files without a row, delete corrupt ones and dead writers' temps."""
        with self._index.writing():
            rows = self._index.entry_keys()
            files = {path.stem: path for path in self.directory.glob(f"*{ENTRY_SUFFIX}")}
            for key in rows - files.keys():
                self._index.remove(key)
            for key in files.keys() - rows:
                self._adopt(key, files[key])
        self._delete_dead_temps()
        self.drop_dead_promises()

    def _adopt(self, key: str, path: Path) -> None:
        try:
            header = entry_format.verify(path.read_bytes())
            if entry_key(header.fingerprint, header.tokens) != key:
                raise CorruptEntry("file name does not match its contents")
        except CorruptEntry as error:
            self.counters.corrupt += 1
            log.warning("disk prefix cache: corrupt entry deleted", key=key, why=str(error))
            path.unlink(missing_ok=True)
            return
        self._index.add(
            key,
            fingerprint=header.fingerprint,
            model=header.model,
            tokens=header.tokens,
            size=header.size,
            when=path.stat().st_mtime,
        )

    def _delete_dead_temps(self) -> None:
        for path in self.directory.glob(f".*{TEMP_SUFFIX}"):
            parts = path.name.split(".")  # "", key, pid, random, "tmp"
            if len(parts) == 5 and parts[2].isdigit() and _process_alive(int(parts[2])):
                continue
            path.unlink(missing_ok=True)

    def free_bytes(self) -> int:
        return shutil.disk_usage(self.directory).free


def _open_index(path: Path, busy_timeout_s: float, counters: CacheCounters) -> PrefixIndex:
    """Open the index; an index sqlite cannot read is deleted and rebuilt from the files."""
    try:
        return PrefixIndex(path, busy_timeout_s=busy_timeout_s)
    except sqlite3.OperationalError:
        raise
    except sqlite3.DatabaseError as error:
        counters.indexes_rebuilt += 1
        log.warning("disk prefix cache: index unreadable, rebuilding it", error=str(error))
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return PrefixIndex(path, busy_timeout_s=busy_timeout_s)


def _identity(path: Path) -> tuple[int, int] | None:
    """The file's (device, inode), or None if there is no such file."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino


def _write_synced(path: Path, data: bytes) -> None:
    """Create `path` holding `data`, on disk before this returns."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_directory(path: Path) -> None:
    """Make a rename in `path` durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def new_owner() -> str:
    """A name for one process's promises, unique across the hosts sharing a directory."""
    return f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(4)}"


def owner_alive(owner: str) -> bool:
    """Whether the process behind `owner` may still be running: on this host, whether its
    pid is; on another, presumed so (its promises lapse)."""
    host, _, rest = owner.partition("/")
    pid = rest.partition("/")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return True
    return _process_alive(int(pid))


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
