"""Remembered answers: the whole answer of a request that alone fixes it, under its key
(`reame_core.engine.recall`), one small file each under ``answers/`` in the archive's
directory, so every process sharing the directory recalls what any of them answered.

A file is ``RMA1``, the 16-byte blake2b digest of the rest, then zstd of a JSON object:
the key, the tokens, the text and the finish reason. It is written under a temporary name
and renamed into place, so a reader finds a whole file or none; one that fails its digest
or names another key (a file damaged after it was written) is deleted, counted, and its
request computed again. Reads happen on the engine thread (one small file: tens of
microseconds; a miss is a failed open); writes and eviction on the shelf's own thread.
Past the budget the files written longest ago go first.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import threading
from dataclasses import dataclass
from pathlib import Path

import structlog
import zstandard

from reame_core.hooktypes import RecalledAnswer

log = structlog.get_logger(__name__)

LAYOUT = "answers"
MAGIC = b"RMA1"
_DIGEST = 16
_LEVEL = 3
MAX_PENDING = 1024
_STOP = object()


@dataclass
class ShelfCounters:
    """What the shelf did. `recalled`, `missed` and `damaged` are the engine thread's;
    the rest its own thread's."""

    recalled: int = 0
    missed: int = 0
    damaged: int = 0
    written: int = 0
    write_errors: int = 0
    evicted: int = 0


@dataclass(frozen=True)
class _Kept:
    key: str
    answer: RecalledAnswer


class AnswerShelf:
    def __init__(self, root: Path, budget: int) -> None:
        self.path = root / LAYOUT
        self.budget = budget
        self.counters = ShelfCounters()
        self._held = 0  # bytes on the shelf as its thread last counted, plus its writes
        self._jobs: queue.Queue[object] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="reame-answers", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ engine side

    def recall(self, key: str) -> RecalledAnswer | None:
        """The answer kept under `key`, or None (none kept, or a damaged one, deleted)."""
        path = self._file(key)
        try:
            data = path.read_bytes()
        except OSError:
            self.counters.missed += 1
            return None
        answer = _decode(data, key)
        if answer is None:
            self.counters.damaged += 1
            log.warning("damaged remembered answer deleted", file=str(path))
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        self.counters.recalled += 1
        return answer

    def remember(self, key: str, answer: RecalledAnswer) -> None:
        """Queue the answer for the shelf's thread (dropped if the queue is full)."""
        if self._jobs.qsize() < MAX_PENDING:
            self._jobs.put(_Kept(key, answer))

    def flush(self, timeout_s: float = 60.0) -> bool:
        """Wait until the answers queued so far are on disk; False on timeout."""
        done = threading.Event()
        self._jobs.put(done)
        return done.wait(timeout_s)

    def close(self, timeout_s: float = 60.0) -> None:
        self._jobs.put(_STOP)
        self._thread.join(timeout_s)

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        self._held = sum(size for _, size, _ in _files(self.path))
        while (job := self._jobs.get()) is not _STOP:
            if isinstance(job, threading.Event):
                job.set()
                continue
            assert isinstance(job, _Kept)
            try:
                self._held += self._write(job.key, job.answer)
                self.counters.written += 1
                if self._held > self.budget:
                    self._evict()
            except OSError as error:
                self.counters.write_errors += 1
                log.warning(
                    "could not remember an answer", error=f"{type(error).__name__}: {error}"
                )

    def _write(self, key: str, answer: RecalledAnswer) -> int:
        data = _encode(key, answer)
        path = self._file(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            temporary.write_bytes(data)
            os.replace(temporary, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()
        return len(data)

    def _evict(self) -> None:
        """Delete the files written longest ago until the shelf holds 90% of its budget."""
        files = sorted(_files(self.path))
        held = sum(size for _, size, _ in files)
        for _, size, path in files:
            if held <= 0.9 * self.budget:
                break
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                self.counters.evicted += 1
            held -= size
        self._held = held

    def _file(self, key: str) -> Path:
        return self.path / key[:2] / key[2:]


def usage(root: Path) -> tuple[int, int]:
    """(files, bytes) of the answers kept under an archive directory."""
    files = _files(root / LAYOUT)
    return len(files), sum(size for _, size, _ in files)


def purge(root: Path) -> tuple[int, int]:
    """Delete every remembered answer under an archive directory; (files, bytes) deleted."""
    deleted = freed = 0
    for _, size, path in _files(root / LAYOUT):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            deleted, freed = deleted + 1, freed + size
    return deleted, freed


def _files(shelf: Path) -> list[tuple[float, int, Path]]:
    """(modified, size, path) of every answer file on a shelf, other processes' included;
    not the temporary files a writer has not renamed into place yet."""
    found = []
    with contextlib.suppress(FileNotFoundError):
        for folder in os.scandir(shelf):
            if not folder.is_dir():
                continue
            for entry in os.scandir(folder.path):
                if entry.name.startswith("."):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    stat = entry.stat()
                    found.append((stat.st_mtime, stat.st_size, Path(entry.path)))
    return found


def _encode(key: str, answer: RecalledAnswer) -> bytes:
    body = json.dumps(
        {
            "key": key,
            "tokens": list(answer.tokens),
            "text": answer.text,
            "finish_reason": answer.finish_reason,
        },
        separators=(",", ":"),
    ).encode()
    payload = zstandard.ZstdCompressor(level=_LEVEL).compress(body)
    return MAGIC + hashlib.blake2b(payload, digest_size=_DIGEST).digest() + payload


def _decode(data: bytes, key: str) -> RecalledAnswer | None:
    head = len(MAGIC) + _DIGEST
    payload = data[head:]
    if data[: len(MAGIC)] != MAGIC or len(data) <= head:
        return None
    if hashlib.blake2b(payload, digest_size=_DIGEST).digest() != data[len(MAGIC) : head]:
        return None
    try:
        body = json.loads(zstandard.ZstdDecompressor().decompress(payload))
        tokens = tuple(int(t) for t in body["tokens"])
        text, reason = str(body["text"]), body["finish_reason"]
        if body["key"] != key or reason not in ("stop", "length"):
            return None
    except (zstandard.ZstdError, ValueError, KeyError, TypeError):
        return None
    return RecalledAnswer(tokens, text, reason)
