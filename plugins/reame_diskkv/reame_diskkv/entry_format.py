"""The bytes of one cache entry: what a valid entry is, and how a state is packed into one.

    offset  size  field
    0       8     magic b"REAMEKV\\0"
    8       2     format version (FORMAT_VERSION)
    10      2     codec: 1 zstd, 2 zstd over the state split into two byte planes
    12      2     F, bytes of the model fingerprint
    14      2     N, bytes of the model name
    16      4     T, prefix tokens
    20      8     bytes of the state, uncompressed
    28      8     P, bytes of the compressed payload
    36      F     model fingerprint (ModelInfo.fingerprint, UTF-8)
            N     model name (UTF-8, for `reame cache stats`)
            4*T   the prefix tokens, int32 little-endian
            P     the payload
    end-32  32    SHA-256 of every byte before it

All integers are little-endian. The state is llama.cpp's serialized sequence state; most
of it is f16 KV, whose high bytes (sign, exponent) repeat far more than its low bytes, so
for f16 and bf16 KV the even and odd bytes are compressed as two planes.

Pure functions on bytes: reading and writing files is the store's job. Any entry that is
not exactly right raises `CorruptEntry`; nothing here guesses.
"""

from __future__ import annotations

import enum
import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import zstandard

MAGIC = b"REAMEKV\0"
FORMAT_VERSION = 1
_FIXED = struct.Struct("<8sHHHHIQQ")
_CHECKSUM_SIZE = 32
MAX_MODEL_NAME = 256  # characters kept of the model name
TOKEN_DTYPE = np.dtype("<i4")


class Codec(enum.IntEnum):
    ZSTD = 1
    ZSTD_BYTE_PLANES = 2


class CorruptEntry(ValueError):
    """The bytes are not a valid entry for what was expected; the message says why."""


@dataclass(frozen=True)
class EntryHeader:
    """Everything in an entry but its payload."""

    codec: Codec
    fingerprint: str
    model: str
    tokens: tuple[int, ...]
    state_size: int
    payload_size: int

    @property
    def size(self) -> int:
        """Bytes of the whole entry this header describes."""
        return header_size(self) + self.payload_size + _CHECKSUM_SIZE


def codec_for(kv_type: str) -> Codec:
    """Byte planes pay only for 16-bit KV (measured 1.2x vs 1.1x for plain zstd on f16)."""
    return Codec.ZSTD_BYTE_PLANES if kv_type in ("f16", "bf16") else Codec.ZSTD


def header_size(header: EntryHeader) -> int:
    return (
        _FIXED.size
        + len(header.fingerprint.encode())
        + len(header.model.encode())
        + 4 * len(header.tokens)
    )


def token_bytes(tokens: Sequence[int]) -> bytes:
    return np.asarray(tokens, dtype=TOKEN_DTYPE).tobytes()


def encode(
    *,
    fingerprint: str,
    model: str,
    tokens: Sequence[int],
    state: bytes,
    codec: Codec,
    level: int = 3,
) -> bytes:
    """A complete entry holding `state`, the KV of `tokens` under model `fingerprint`."""
    planes = split_planes(state) if codec is Codec.ZSTD_BYTE_PLANES else state
    payload = zstandard.ZstdCompressor(level=level).compress(planes)
    fingerprint_bytes = fingerprint.encode()
    model_bytes = model[:MAX_MODEL_NAME].encode()
    head = _FIXED.pack(
        MAGIC,
        FORMAT_VERSION,
        codec,
        len(fingerprint_bytes),
        len(model_bytes),
        len(tokens),
        len(state),
        len(payload),
    )
    body = b"".join((head, fingerprint_bytes, model_bytes, token_bytes(tokens), payload))
    return body + hashlib.sha256(body).digest()


def read_header(data: bytes | memoryview) -> EntryHeader:
    """The header at the start of `data`, which may hold only the header's bytes.

    Checks the header's own consistency, not the checksum: `decode` does that.
    """
    view = memoryview(data)
    if len(view) < _FIXED.size:
        raise CorruptEntry(f"{len(view)} bytes: shorter than an entry header")
    magic, version, codec, n_fingerprint, n_model, n_tokens, state_size, payload_size = (
        _FIXED.unpack_from(view)
    )
    if magic != MAGIC:
        raise CorruptEntry("not a Reame KV cache entry (bad magic)")
    if version != FORMAT_VERSION:
        raise CorruptEntry(f"format version {version}, this Reame reads {FORMAT_VERSION}")
    if codec not in set(Codec):
        raise CorruptEntry(f"unknown codec {codec}")
    offset = _FIXED.size
    end = offset + n_fingerprint + n_model + 4 * n_tokens
    if len(view) < end:
        raise CorruptEntry(f"{len(view)} bytes: the header says it needs {end}")
    try:
        fingerprint = bytes(view[offset : offset + n_fingerprint]).decode()
        offset += n_fingerprint
        model = bytes(view[offset : offset + n_model]).decode()
        offset += n_model
    except UnicodeDecodeError as error:
        raise CorruptEntry(f"header text is not UTF-8 ({error.reason})") from None
    tokens = np.frombuffer(view[offset:end], dtype=TOKEN_DTYPE)
    return EntryHeader(
        codec=Codec(codec),
        fingerprint=fingerprint,
        model=model,
        tokens=tuple(int(token) for token in tokens),
        state_size=state_size,
        payload_size=payload_size,
    )


def verify(data: bytes | memoryview) -> EntryHeader:
    """The header of `data` once its size and checksum prove the entry whole and intact."""
    view = memoryview(data)
    header = read_header(view)
    if len(view) != header.size:
        raise CorruptEntry(f"{len(view)} bytes, the header says {header.size}: truncated?")
    if hashlib.sha256(view[:-_CHECKSUM_SIZE]).digest() != bytes(view[-_CHECKSUM_SIZE:]):
        raise CorruptEntry("checksum mismatch")
    return header


def decode(data: bytes | memoryview, *, fingerprint: str, tokens: Sequence[int]) -> bytes:
    """The state stored in `data`, which must be a whole, intact entry for `tokens` under
    model `fingerprint`."""
    view = memoryview(data)
    header = verify(view)
    if header.fingerprint != fingerprint:
        raise CorruptEntry("entry of another model or configuration (fingerprint differs)")
    if header.tokens != tuple(tokens):
        raise CorruptEntry("entry holds other tokens than its index row says")
    payload = view[header.size - _CHECKSUM_SIZE - header.payload_size : -_CHECKSUM_SIZE]
    try:
        unpacked: bytes = zstandard.ZstdDecompressor().decompress(
            payload, max_output_size=header.state_size
        )
    except zstandard.ZstdError as error:
        raise CorruptEntry(f"payload does not decompress ({error})") from None
    if len(unpacked) != header.state_size:
        raise CorruptEntry(f"payload holds {len(unpacked)} bytes, expected {header.state_size}")
    return join_planes(unpacked) if header.codec is Codec.ZSTD_BYTE_PLANES else unpacked


def split_planes(state: bytes) -> bytes:
    """Even bytes, then odd bytes (an odd last byte stays last)."""
    pairs = len(state) // 2
    words = np.frombuffer(state, dtype=np.uint8, count=2 * pairs).reshape(pairs, 2)
    planes: bytes = words.T.tobytes()
    return planes + state[2 * pairs :]


def join_planes(planes: bytes) -> bytes:
    """Inverse of `split_planes`."""
    pairs = len(planes) // 2
    flat = np.frombuffer(planes, dtype=np.uint8)
    words = np.empty((pairs, 2), dtype=np.uint8)
    words[:, 0] = flat[:pairs]
    words[:, 1] = flat[pairs : 2 * pairs]
    return words.tobytes() + planes[2 * pairs :]
