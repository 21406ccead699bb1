"""The bytes of one archived generation (a record), as framed in a segment file.

    offset  size  field
    0       4     magic b"PLR1"
    4       4     P, bytes of the compressed payload
    8       4     T, tokens in the record
    12      4     of which the first K are the prompt's tail
    16      8     BLAKE2b-64 of bytes 0-16 and the payload
    24      P     zstd of the T tokens, uint32 little-endian

All integers are little-endian. A segment is frames back to back, nothing else: a reader
may start at any offset it has already read up to. A process killed during an append
leaves a frame cut short at the end of its segment; a damaged frame fails its checksum.
Either way the reader skips it and resynchronises on the next magic: nothing here guesses,
and a record that decodes is exactly the one that was written.

Pure functions on bytes: reading and writing files is the segments' job.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import numpy as np
import zstandard

MAGIC = b"PLR1"
_HEADER = struct.Struct("<4sIII")
_DIGEST_SIZE = 8
HEADER_SIZE = _HEADER.size + _DIGEST_SIZE
TOKEN_DTYPE = np.dtype("<u4")
MAX_TOKENS = 1 << 24  # a larger T is a damaged header, not a generation
_LEVEL = 3  # zstd level: tokens are small, and the engine's neighbour waits for the CPU


@dataclass(frozen=True)
class Record:
    """One finished generation: the tail of its prompt, then its output."""

    tokens: np.ndarray  # uint32
    prompt_tail: int  # how many of `tokens` came from the prompt


@dataclass(frozen=True)
class Scan:
    """What one pass over a byte range found.

    `consumed` bytes were settled (records and damage); the rest, from `consumed` on, is a
    frame not complete yet, to read again once its writer has appended more (or to count as
    torn once the writer is known to be gone). `damaged` counts frames that failed a check.
    """

    records: list[Record]
    consumed: int
    damaged: int


def encode(tokens: np.ndarray, prompt_tail: int) -> bytes:
    raw = np.ascontiguousarray(tokens, dtype=TOKEN_DTYPE).tobytes()
    payload = zstandard.ZstdCompressor(level=_LEVEL).compress(raw)
    head = _HEADER.pack(MAGIC, len(payload), len(tokens), prompt_tail)
    return head + _digest(head, payload) + payload


def scan(data: bytes, *, final: bool = False) -> Scan:
    """Every intact record in `data`, which starts at a frame boundary (or after damage).

    With `final` (no more bytes will ever be appended: the segment is sealed, or its writer
    is gone) a frame cut short is damage too, and everything is consumed.
    """
    records: list[Record] = []
    damaged = 0
    at = 0
    resyncing = False  # after damage, bytes up to the next magic are the same damage
    while at < len(data):
        start = data.find(MAGIC, at)
        if start < 0:
            # No frame starts here; unless final, keep what may be the start of a magic.
            keep = 0 if final else len(MAGIC) - 1
            tail = max(at, len(data) - keep)
            damaged += int(tail > at and not resyncing)
            return Scan(records, tail, damaged)
        if start > at and not resyncing:
            damaged += 1  # bytes that are no frame
        end = _frame_end(data, start)
        if end is None and not final:  # a frame not complete yet
            return Scan(records, start, damaged)
        record = _decode(data, start, end) if end is not None else None
        if record is None or end is None:
            damaged += int(not resyncing)
            resyncing = True
            at = start + 1
            continue
        records.append(record)
        resyncing = False
        at = end
    return Scan(records, at, damaged)


def _frame_end(data: bytes, start: int) -> int | None:
    """Where the frame at `start` ends, or None if `data` stops before that. A header
    that cannot be right ends the frame at once, so it decodes as damage."""
    if len(data) - start < HEADER_SIZE:
        return None
    _, size, count, prompt_tail = _HEADER.unpack_from(data, start)
    if count > MAX_TOKENS or prompt_tail > count or size > 8 * MAX_TOKENS + 1024:
        return start + HEADER_SIZE
    end = start + HEADER_SIZE + size
    return end if end <= len(data) else None


def _decode(data: bytes, start: int, end: int) -> Record | None:
    _, size, count, prompt_tail = _HEADER.unpack_from(data, start)
    if start + HEADER_SIZE + size != end:
        return None
    view = memoryview(data)
    head = view[start : start + _HEADER.size]
    digest = view[start + _HEADER.size : start + HEADER_SIZE]
    payload = view[start + HEADER_SIZE : end]
    if _digest(head, payload) != bytes(digest):
        return None
    try:
        raw = zstandard.ZstdDecompressor().decompress(payload, max_output_size=4 * count)
    except zstandard.ZstdError:
        return None
    if len(raw) != 4 * count:
        return None
    return Record(np.frombuffer(raw, dtype=TOKEN_DTYPE).astype(np.uint32), prompt_tail)


def _digest(head: bytes | memoryview, payload: bytes | memoryview) -> bytes:
    h = hashlib.blake2b(digest_size=_DIGEST_SIZE)
    h.update(head)
    h.update(payload)
    return h.digest()
