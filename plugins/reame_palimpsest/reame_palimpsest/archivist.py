"""The archive's own thread: it appends records, reads other processes' new ones, evicts,
and builds the indexes the engine thread drafts from.

The engine thread only queues records (`submit`) and reads `indexes`, a tuple the thread
replaces whole, never edits: no lock on the engine's path. Until the first index is built
(the tokenizer hashed, the directory read), `indexes` is empty and nothing is drafted:
start-up never waits for the archive.

Two indexes, like a two-level log-structured tree: `main` over the records known at the
last full build, and `fresh` over those since, extended whenever records arrive
(`ArchiveIndex.extended`: the new records' k-grams sorted and merged in, their counts
and directories brought up to date; about 2 ms for a generation at `FRESH_TOKENS` tokens
on the AVX-512 EPYC, where building `fresh` anew took 29 ms: benchmarks/palimpsest_lookup.py
--growth). When `fresh` outgrows that, it is merged into `main` the same way (0.22 s into 4M
tokens, against 3.1 s anew), and `fresh` starts empty.
Only when records of `main` vanished (their segment evicted or purged: they must go) or
the records outgrow `memory_tokens` is `main` built anew, from the newest records: three
quarters of `memory_tokens` in the second case (`REBUILT_SHARE`), so that many fills of
`fresh` merge before the next. Where only records of `fresh` vanished, `fresh` is built
anew. The thread runs at a lower CPU priority than decoding. At start only the newest
segments are read, enough for `memory_tokens`.

Every failure is counted and the thread lives on: a failed append (disk full) pauses
recording for `retry_after_s`, and is logged once; reading and drafting go on.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import structlog

from reame_palimpsest import record_format
from reame_palimpsest.archive_index import ArchiveIndex
from reame_palimpsest.record_format import Record
from reame_palimpsest.segments import SegmentDirectory

log = structlog.get_logger(__name__)

THREAD_NICENESS = 10
MAX_PENDING_RECORDS = 1024
FRESH_TOKENS = 65_536  # `fresh` holds at most this many tokens before it joins `main`
# Building `main` anew because the records outgrew `memory_tokens` keeps this share of it,
# so that `fresh` joins it by merging many times before it must be built anew again.
REBUILT_SHARE = 0.75


@dataclass
class WriteCounters:
    """What the thread wrote and built. Written by the archive's thread only, except
    `records_dropped` (the engine thread)."""

    records_written: int = 0
    tokens_written: int = 0
    records_dropped: int = 0  # the queue was full or recording paused
    write_errors: int = 0
    segments_evicted: int = 0
    bytes_evicted: int = 0
    builds: int = 0  # `main` built anew
    merges: int = 0  # `fresh` merged into `main`
    directory_unusable: int = 0  # the directory could not be used at start
    build_seconds: float = 0.0  # the last time `main` was built anew


@dataclass(frozen=True)
class _Pending:
    tokens: np.ndarray
    prompt_tail: int


_STOP = object()


def vocabulary_fingerprint(pieces: Sequence[bytes]) -> str:
    """What names a tokenizer: its token table, not the model file (a fine-tune or another
    quantization shares the archive) nor the KV layout (unlike `ModelInfo.fingerprint`)."""
    digest = hashlib.sha256()
    for piece in pieces:
        digest.update(len(piece).to_bytes(4, "little"))
        digest.update(piece)
    return digest.hexdigest()[:16]


class Archivist:
    """See the module docstring. `pieces` is called on the thread (hashing a large
    vocabulary is start-up work the server need not wait for)."""

    def __init__(
        self,
        root: Path,
        pieces: Callable[[], Sequence[bytes]],
        *,
        budget: int,
        memory_tokens: int,
        segment_bytes: int,
        poll_seconds: float,
        anchors: Sequence[int],
        retry_after_s: float = 300.0,
    ) -> None:
        self.root = root
        self.budget = budget
        self.memory_tokens = memory_tokens
        self.segment_bytes = segment_bytes
        self.poll_seconds = poll_seconds
        self.anchors = tuple(anchors)
        self.retry_after_s = retry_after_s
        self.counters = WriteCounters()
        self.directory: SegmentDirectory | None = None
        self.fingerprint: str | None = None
        self.indexes: tuple[ArchiveIndex, ...] = ()  # replaced whole by the thread
        self.ready = threading.Event()
        self._pieces = pieces
        self._records: list[tuple[str, Record]] = []  # every known record, oldest first
        self._main_count = 0  # how many of `_records` `main` covers (-1: it must be rebuilt)
        self._fresh_count = 0  # how many of the records after those `fresh` covers
        self._jobs: queue.Queue[object] = queue.Queue()
        self._paused_until = 0.0
        self._failed_once = False
        self._thread = threading.Thread(target=self._run, name="reame-palimpsest", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ engine side

    def submit(self, tokens: np.ndarray, prompt_tail: int) -> bool:
        """Queue a finished generation for the archive; False if it was dropped."""
        if time.monotonic() < self._paused_until or self._jobs.qsize() >= MAX_PENDING_RECORDS:
            self.counters.records_dropped += 1
            return False
        self._jobs.put(_Pending(tokens, prompt_tail))
        return True

    def flush(self, timeout_s: float = 60.0) -> bool:
        """Wait until the records queued so far are on disk and in the index, and other
        processes' records written so far are read; False on timeout."""
        done = threading.Event()
        self._jobs.put(done)
        return done.wait(timeout_s)

    def close(self, timeout_s: float = 60.0) -> None:
        self._jobs.put(_STOP)
        self._thread.join(timeout_s)

    @property
    def index_tokens(self) -> int:
        return sum(index.n_tokens for index in self.indexes)

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        with contextlib.suppress(AttributeError, OSError):  # per-thread nice: Linux only
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), THREAD_NICENESS)
        try:
            self.fingerprint = vocabulary_fingerprint(self._pieces())
            self.directory = SegmentDirectory(self.root, self.fingerprint, self.segment_bytes)
        except OSError as error:
            self.counters.directory_unusable += 1
            log.warning(
                "generation archive off: its directory cannot be used; serving without it",
                directory=str(self.root),
                error=f"{type(error).__name__}: {error}",
            )
            self.ready.set()
            self._drain_until_stop()
            return
        self._poll(limit_tokens=self.memory_tokens)
        self._build(full=True)
        self.ready.set()
        log.info(
            "generation archive ready",
            directory=str(self.directory.path),
            tokens=self.index_tokens,
            build_seconds=round(self.counters.build_seconds, 3),
        )
        next_poll = time.monotonic() + self.poll_seconds
        while True:
            try:
                job = self._jobs.get(timeout=max(0.0, next_poll - time.monotonic()))
            except queue.Empty:
                job = None
            waiting: list[threading.Event] = []
            appended = False
            while job is not None:  # everything queued, then one build
                if job is _STOP:
                    self.directory.close()
                    return
                if isinstance(job, _Pending):
                    appended |= self._append(job)
                elif isinstance(job, threading.Event):
                    waiting.append(job)
                job = self._next_job()
            polled = False
            if waiting or time.monotonic() >= next_poll:
                polled = self._poll()
                next_poll = time.monotonic() + self.poll_seconds
            if appended or polled:
                self._build(full=self._needs_full_build())
            for event in waiting:
                event.set()

    def _next_job(self) -> object | None:
        try:
            return self._jobs.get_nowait()
        except queue.Empty:
            return None

    def _drain_until_stop(self) -> None:
        while (job := self._jobs.get()) is not _STOP:
            if isinstance(job, threading.Event):
                job.set()

    def _append(self, pending: _Pending) -> bool:
        assert self.directory is not None
        frame = record_format.encode(pending.tokens, pending.prompt_tail)
        try:
            name = self.directory.append(frame)
            if self.budget:
                deleted, freed = self.directory.evict(self.budget)
                self.counters.segments_evicted += deleted
                self.counters.bytes_evicted += freed
        except OSError as error:
            self._failed(error)
            return False
        self._records.append((name, Record(pending.tokens, pending.prompt_tail)))
        self.counters.records_written += 1
        self.counters.tokens_written += len(pending.tokens)
        return True

    def _poll(self, *, limit_tokens: int | None = None) -> bool:
        """Read other writers' new records; True if anything changed."""
        assert self.directory is not None
        try:
            found, vanished = self.directory.poll(limit_tokens)
        except OSError as error:
            self._failed(error)
            return False
        vanished |= self._own_vanished()
        if vanished:
            covered = max(0, self._main_count)
            if any(n in vanished for n, _ in self._records[:covered]):
                self._main_count = -1  # `main` holds records that are gone: build it again
            elif any(n in vanished for n, _ in self._records[covered:]):
                self._fresh_count = 0  # `fresh` does: build it anew from the rest
            self._records = [(n, r) for n, r in self._records if n not in vanished]
        self._records += found
        return bool(found or vanished)

    def _own_vanished(self) -> set[str]:
        assert self.directory is not None
        own = {n for n, _ in self._records if n.startswith(self.directory.writer)}
        return {n for n in own if not (self.directory.path / n).exists()}

    def _needs_full_build(self) -> bool:
        if self._main_count < 0:
            return True
        return sum(len(r.tokens) for _, r in self._records[self._main_count :]) > FRESH_TOKENS

    def _build(self, *, full: bool) -> None:
        """Bring the indexes up to `_records`: the new records into `fresh` (built anew
        where it covers none of them), or (`full`) every record since `main` into `main`,
        or `main` anew where it must be."""
        since = self._records[self._main_count :] if self._main_count >= 0 else []
        if not full:
            fresh = self.indexes[1] if len(self.indexes) > 1 and self._fresh_count else None
            new = [r.tokens for _, r in since[self._fresh_count :]]
            grown = fresh.extended(new) if fresh is not None else ArchiveIndex(new, self.anchors)
            self.indexes = (*self.indexes[:1], grown)
            self._fresh_count = len(since)
            return
        total = sum(len(r.tokens) for _, r in self._records)
        if self._main_count >= 0 and self.indexes and total <= self.memory_tokens:
            main = self.indexes[0].extended([r.tokens for _, r in since])
            self.counters.merges += 1
        else:
            started = time.perf_counter()
            keep = (
                self.memory_tokens
                if total <= self.memory_tokens
                else int(REBUILT_SHARE * self.memory_tokens)
            )
            self._records = _newest_within(self._records, keep)
            main = ArchiveIndex([r.tokens for _, r in self._records], self.anchors)
            self.counters.builds += 1
            self.counters.build_seconds = time.perf_counter() - started
        self._main_count = len(self._records)
        self._fresh_count = 0
        self.indexes = (main,)

    def _failed(self, error: OSError) -> None:
        self.counters.write_errors += 1
        self._paused_until = time.monotonic() + self.retry_after_s
        if not self._failed_once:
            self._failed_once = True
            log.warning(
                "generation archive cannot write; serving goes on, drafts still come from "
                "what is archived, and recording is retried later",
                directory=str(self.root),
                error=f"{type(error).__name__}: {error}",
                retry_after_s=self.retry_after_s,
            )


def _newest_within(records: list[tuple[str, Record]], tokens: int) -> list[tuple[str, Record]]:
    """The newest records holding at most `tokens` tokens in all, oldest first."""
    kept = 0
    for i in range(len(records) - 1, -1, -1):
        kept += len(records[i][1].tokens)
        if kept > tokens:
            return records[i + 1 :]
    return records
