"""The archive's directory: segment files, and the rules that let processes share it.

Layout: ``<root>/v1/<tokenizer fingerprint>/<writer>.<n>.seg``, where `writer` names one
process's appender (start time, host, pid, a random tag) and `n` counts its segments. A
tokenizer's records live apart from every other's: token ids mean nothing across
vocabularies.

The rules, which every process follows, so none can break another's reads:

- Only its writer appends to a segment, and only whole frames (`record_format`), each in
  one write(2) on an O_APPEND descriptor. A record is therefore either wholly in the file
  or cut short at its end (a kill during the write); readers skip what does not check
  out. A rename per record (the disk cache's temp-file rule) would copy the segment each
  time; framing gives the same guarantee for appends. A segment is never rewritten.
- At `segment_bytes` the writer seals its segment (fdatasync) and starts the next; a
  failed or short write abandons the segment the same way. A reader knows a segment is
  final when its writer has a later one, or its writer's process (on this host) is gone;
  until then an incomplete frame at its end is an append in progress, read again later.
- Any process may evict: the oldest segments (by modification time) go first until the
  whole directory fits the budget; a writer's open segment is evicted only after it is
  sealed. Readers treat a vanished file as evicted and forget its records.
- `purge` deletes every segment. A writer whose open segment was deleted notices (its
  link count is 0) and starts a new one.

A `SegmentDirectory` is used by one thread at a time.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from reame_palimpsest import record_format
from reame_palimpsest.record_format import Record

log = structlog.get_logger(__name__)

LAYOUT = "v1"
SUFFIX = ".seg"
_HOST = socket.gethostname().replace(".", "-").replace("_", "-")[:32] or "host"


@dataclass
class ReadCounters:
    """What reading the directory found. Written by the archive's thread only."""

    records_read: int = 0
    frames_damaged: int = 0  # frames that failed a check, torn appends included
    segments_damaged: int = 0


@dataclass
class _Tracked:
    offset: int = 0
    final: bool = False
    damaged: bool = False


@dataclass(frozen=True)
class SegmentName:
    writer: str
    number: int
    host: str
    pid: int

    @classmethod
    def parse(cls, name: str) -> SegmentName | None:
        stem, dot, number = name.removesuffix(SUFFIX).rpartition(".")
        parts = stem.split("_")
        if not name.endswith(SUFFIX) or not dot or len(parts) != 4 or not number.isdigit():
            return None
        try:
            return cls(stem, int(number), parts[1], int(parts[2]))
        except ValueError:
            return None


@dataclass
class Usage:
    """What the directory holds for one tokenizer fingerprint."""

    fingerprint: str
    segments: int = 0
    bytes: int = 0
    newest: float = 0.0


@dataclass
class SegmentDirectory:
    """One tokenizer's segments under `root`, with this process's appender and a reader
    of everyone else's; see the module docstring."""

    root: Path
    fingerprint: str
    segment_bytes: int = 8 << 20
    counters: ReadCounters = field(default_factory=ReadCounters)

    def __post_init__(self) -> None:
        self.path = self.root / LAYOUT / self.fingerprint
        self.path.mkdir(parents=True, exist_ok=True)
        self.writer = f"{time.time_ns():020d}_{_HOST}_{os.getpid()}_{secrets.token_hex(3)}"
        self._number = 0
        self._fd: int | None = None
        self._size = 0
        self._tracked: dict[str, _Tracked] = {}

    # ------------------------------------------------------------- appending

    def append(self, frame: bytes) -> str:
        """Append one frame to this process's open segment; the segment's name. An
        OSError abandons the segment (the next append starts another) and propagates."""
        if self._fd is not None and (
            self._size >= self.segment_bytes or os.fstat(self._fd).st_nlink == 0
        ):
            self.seal()
        if self._fd is None:
            self._number += 1
            self.path.mkdir(parents=True, exist_ok=True)  # again: a purge removes it
            self._fd = os.open(
                self.path / self.open_segment_name(),
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND,
                0o600,
            )
            self._size = 0
        try:
            written = os.write(self._fd, frame)
            if written != len(frame):
                raise OSError(f"short write: {written} of {len(frame)} bytes")
        except OSError:
            self._close(sync=False)
            raise
        self._size += written
        return self.open_segment_name()

    def open_segment_name(self) -> str:
        return f"{self.writer}.{self._number:06d}{SUFFIX}"

    def seal(self) -> None:
        """Make the open segment final: later appends go to a new one."""
        self._close(sync=True)

    def _close(self, *, sync: bool) -> None:
        if self._fd is None:
            return
        try:
            if sync:
                with contextlib.suppress(OSError):
                    os.fdatasync(self._fd)
        finally:
            os.close(self._fd)
            self._fd = None

    # ------------------------------------------------------------- reading

    def poll(self, limit_tokens: int | None = None) -> tuple[list[tuple[str, Record]], set[str]]:
        """Records appended by other writers since the last poll, oldest first, each with
        its segment's name, and the names of segments that vanished since. With
        `limit_tokens` (the first poll of a large archive) segments are read newest first
        until they hold that many tokens; older final segments are passed over for good."""
        names = {p.name for p in self.path.glob(f"*{SUFFIX}")}
        vanished = set(self._tracked) - names
        for name in vanished:
            del self._tracked[name]
        parsed = {n: s for n in names if (s := SegmentName.parse(n)) is not None}
        latest: dict[str, int] = {}
        for segment in parsed.values():
            latest[segment.writer] = max(latest.get(segment.writer, 0), segment.number)
        # Writers' names start with their start time: this is the order records were made.
        ordered = sorted(parsed.items(), key=lambda item: (item[1].writer, item[1].number))
        by_segment: list[list[tuple[str, Record]]] = []
        held = 0
        for name, segment in reversed(ordered):
            if segment.writer == self.writer:
                continue
            tracked = self._tracked.setdefault(name, _Tracked())
            if tracked.final:
                continue
            final = segment.number < latest[segment.writer] or not _alive(segment)
            if final and limit_tokens is not None and held >= limit_tokens:
                tracked.final = True  # older than what the index can hold: never read
                continue
            records = self._read(name, tracked, final=final)
            held += sum(len(r.tokens) for r in records)
            by_segment.append([(name, r) for r in records])
        found = [item for records in reversed(by_segment) for item in records]
        self.counters.records_read += len(found)
        return found, vanished

    def _read(self, name: str, tracked: _Tracked, *, final: bool) -> list[Record]:
        try:
            with open(self.path / name, "rb") as file:
                file.seek(tracked.offset)
                data = file.read()
        except FileNotFoundError:
            return []  # evicted meanwhile
        scan = record_format.scan(data, final=final)
        tracked.offset += scan.consumed
        tracked.final = final
        if scan.damaged:
            self.counters.frames_damaged += scan.damaged
            if not tracked.damaged:
                tracked.damaged = True
                self.counters.segments_damaged += 1
                log.warning(
                    "generation archive: damaged or torn records skipped; the rest of the "
                    "segment is read",
                    segment=name,
                    frames=scan.damaged,
                )
        return scan.records

    # ------------------------------------------------------------- budget

    def evict(self, budget: int) -> tuple[int, int]:
        """Delete the oldest segments of every fingerprint until all fit `budget` bytes;
        (segments, bytes) deleted. Segments another process deletes meanwhile are skipped."""
        files = []
        for path in (self.root / LAYOUT).glob(f"*/*{SUFFIX}"):
            with contextlib.suppress(FileNotFoundError):
                stat = path.stat()
                files.append((stat.st_mtime, path, stat.st_size))
        total = sum(size for _, _, size in files)
        deleted = freed = 0
        mine = self.path / self.open_segment_name() if self._fd is not None else None
        for _, path, size in sorted(files):
            if total <= budget:
                break
            if path == mine:
                self.seal()  # the next append starts a new segment
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                deleted += 1
                freed += size
            total -= size
        return deleted, freed

    def close(self) -> None:
        self.seal()


def usage(root: Path) -> list[Usage]:
    """What the archive under `root` holds, by tokenizer fingerprint."""
    found: dict[str, Usage] = {}
    for path in (root / LAYOUT).glob(f"*/*{SUFFIX}"):
        with contextlib.suppress(FileNotFoundError):
            stat = path.stat()
            entry = found.setdefault(path.parent.name, Usage(path.parent.name))
            entry.segments += 1
            entry.bytes += stat.st_size
            entry.newest = max(entry.newest, stat.st_mtime)
    return sorted(found.values(), key=lambda u: -u.newest)


def purge(root: Path) -> tuple[int, int]:
    """Delete every segment under `root`; (segments, bytes) deleted."""
    deleted = freed = 0
    for path in (root / LAYOUT).glob(f"*/*{SUFFIX}"):
        with contextlib.suppress(FileNotFoundError):
            size = path.stat().st_size
            path.unlink()
            deleted += 1
            freed += size
    for directory in (root / LAYOUT).glob("*"):
        with contextlib.suppress(OSError):
            directory.rmdir()  # empty now, unless a writer just started a segment there
    return deleted, freed


def _alive(segment: SegmentName) -> bool:
    """Whether the segment's writer may still append. A writer on another host is taken
    to be alive: its segments become final when it starts the next one."""
    if segment.host != _HOST:
        return True
    try:
        os.kill(segment.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
