"""The cache's own thread: it compresses and writes snapshots, records uses and evicts.

The engine thread only queues work here (`submit`, `touch`) and never waits for it. The
thread runs at a lower CPU priority than the engine where the OS allows it (Linux nice
per thread), so on a 2-core host compressing a snapshot yields to decoding.

Queued snapshots are bounded in bytes: when the disk is slower than the prefills, new
snapshots are dropped (and counted) instead of filling memory. A failed write (disk
full, directory turned read-only) pauses writing for `retry_after_s`; the first failure
is logged, later ones only counted. Lookups go on meanwhile.

A full disk also shrinks the budget to what the cache holds, less the snapshot that did not
fit, evicting to it (unless the cache holds less than that): a budget granted from another
disk's free space (a cache directory on a small disk of its own), or other files growing
beside the cache, would otherwise leave the disk full for good, every write failing before
it could evict anything.
"""

from __future__ import annotations

import contextlib
import errno
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from reame_diskkv.store import DiskStore, Snapshot

log = structlog.get_logger(__name__)

WRITER_NICENESS = 10
_SQLITE_FULL = 13  # sqlite's result code for a full disk (sqlite3.SQLITE_FULL from Python 3.11)


@dataclass(frozen=True)
class _Touch:
    key: str


_STOP = object()


class SnapshotWriter:
    """Owns `store` (and its counters) from construction on; see the module docstring."""

    def __init__(
        self,
        store: DiskStore,
        *,
        budget: int,
        level: int = 3,
        max_pending_bytes: int = 256 << 20,
        retry_after_s: float = 300.0,
    ) -> None:
        self.store = store
        self.budget = budget
        self.level = level
        self.max_pending_bytes = max_pending_bytes
        self.retry_after_s = retry_after_s
        self.held_bytes = 0  # what the directory held at the last write or eviction
        self.held_entries = 0
        self._jobs: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._pending_bytes = 0
        self._pending_lock = threading.Lock()
        self._paused_until = 0.0
        self._failed_once = False
        self.generation = 0  # times the directory was made anew (`_recreate_if_deleted`)
        self._thread = threading.Thread(target=self._run, name="reame-diskkv-writer", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ engine side

    @property
    def paused(self) -> bool:
        return time.monotonic() < self._paused_until

    def submit(self, snapshot: Snapshot) -> bool:
        """Queue a snapshot to write; False if it was dropped (writing paused or too
        much already queued)."""
        size = len(snapshot.state)
        with self._pending_lock:
            if self.paused or self._pending_bytes + size > self.max_pending_bytes:
                return False
            self._pending_bytes += size
        self._jobs.put(snapshot)
        return True

    def touch(self, key: str) -> None:
        self._jobs.put(_Touch(key))

    def flush(self, timeout_s: float = 120.0) -> bool:
        """Wait until the work queued so far is done; False on timeout."""
        done = threading.Event()
        self._jobs.put(done)
        return done.wait(timeout_s)

    def close(self, timeout_s: float = 120.0) -> None:
        """Write what is queued, then stop the thread and close the store."""
        self._jobs.put(_STOP)
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self.store.close()

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        with contextlib.suppress(AttributeError, OSError):  # per-thread nice: Linux only
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICENESS)
        self._attempt(self.store.reconcile)
        # Over budget at start: a process killed between a write and its eviction, or a
        # budget set lower since.
        self._attempt(self.store.evict, self.budget)
        self._attempt(self._refresh_holdings)
        while (job := self._jobs.get()) is not _STOP:
            if isinstance(job, (Snapshot, _Touch)):
                self._attempt(self._recreate_if_deleted)
            if isinstance(job, Snapshot):
                self._attempt(self._write, job)
                with self._pending_lock:
                    self._pending_bytes -= len(job.state)
                # Written, held already or not written: whoever waits for it stops.
                self._attempt(self.store.fulfil, job.key)
            elif isinstance(job, _Touch):
                self._attempt(self.store.touch, job.key)
            elif isinstance(job, threading.Event):
                job.set()

    def _write(self, snapshot: Snapshot) -> None:
        try:
            written = self.store.write(snapshot, max_size=self.budget, level=self.level)
        except (OSError, sqlite3.Error) as error:
            if _disk_full(error):
                self._shrink(len(snapshot.state))
            raise
        if written:
            self.store.evict(self.budget)
            self._refresh_holdings()

    def _shrink(self, wanted: int) -> None:
        """Lower the budget below what the cache holds by `wanted` bytes, and evict to it.
        A cache holding less than that leaves its budget: others fill the disk, not it."""
        self._refresh_holdings()
        budget = self.held_bytes - wanted
        if budget <= 0 or budget >= self.budget:
            return
        self.budget = budget
        log.info("disk prefix cache: the disk is full; budget lowered", budget_bytes=budget)
        with contextlib.suppress(OSError, sqlite3.Error):  # the next write evicts again
            self.store.evict(budget)
        self._refresh_holdings()

    def _recreate_if_deleted(self) -> None:
        """A directory deleted under the server (a user freeing disk space) is made again,
        with a new index, rather than writing to an index no other process can see."""
        if not self.store.vanished():
            return
        self.store.reopen()
        self.store.counters.directories_recreated += 1
        self.generation += 1
        self._refresh_holdings()
        log.warning(
            "disk prefix cache: its directory was deleted while serving; it starts again empty",
            directory=str(self.store.directory),
        )

    def _refresh_holdings(self) -> None:
        self.held_bytes = self.store.total_size()
        self.held_entries = self.store.count()

    def _attempt(self, work: Callable[..., object], *args: object) -> None:
        """Run `work`; a failure pauses writing, and the thread lives on."""
        try:
            work(*args)
        except Exception as error:
            self.store.counters.write_errors += 1
            self._paused_until = time.monotonic() + self.retry_after_s
            if not self._failed_once:
                self._failed_once = True
                log.warning(
                    "disk prefix cache cannot write; serving goes on, cached prefixes are "
                    "still read, and writing is retried later",
                    directory=str(self.store.directory),
                    error=f"{type(error).__name__}: {error}",
                    retry_after_s=self.retry_after_s,
                )


def _disk_full(error: OSError | sqlite3.Error) -> bool:
    if isinstance(error, OSError):
        return error.errno in (errno.ENOSPC, errno.EDQUOT)
    code = getattr(error, "sqlite_errorcode", None)  # Python 3.11 on
    return code == _SQLITE_FULL or (code is None and "disk is full" in str(error))
