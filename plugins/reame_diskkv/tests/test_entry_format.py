"""The bytes of an entry: what round-trips, and that no damage goes unnoticed."""

from __future__ import annotations

import numpy as np
import pytest
import zstandard

from reame_diskkv.entry_format import (
    Codec,
    CorruptEntry,
    codec_for,
    decode,
    encode,
    join_planes,
    read_header,
    split_planes,
    verify,
)

TOKENS = tuple(range(500, 700))


def f16_state(size: int, seed: int = 0) -> bytes:
    """Bytes shaped like llama.cpp KV: small normally distributed f16 values."""
    values = np.random.default_rng(seed).standard_normal(size // 2) * 0.5
    return values.astype(np.float16).tobytes() + b"\x01" * (size % 2)


def entry(state: bytes, codec: Codec = Codec.ZSTD_BYTE_PLANES) -> bytes:
    return encode(fingerprint="fp-1", model="smol", tokens=TOKENS, state=state, codec=codec)


@pytest.mark.parametrize("codec", list(Codec))
@pytest.mark.parametrize("size", [0, 1, 2, 4097])
def test_state_round_trips_through_an_entry(codec: Codec, size: int) -> None:
    state = f16_state(size)

    assert decode(entry(state, codec), fingerprint="fp-1", tokens=TOKENS) == state


def test_header_names_model_tokens_and_sizes() -> None:
    state = f16_state(1000)

    header = verify(entry(state))

    assert (header.fingerprint, header.model, header.tokens) == ("fp-1", "smol", TOKENS)
    assert header.state_size == 1000 and header.codec is Codec.ZSTD_BYTE_PLANES


@pytest.mark.parametrize("size", [0, 1, 6, 7])
def test_byte_planes_put_even_bytes_first_and_join_back(size: int) -> None:
    state = bytes(range(size))

    planes = split_planes(state)

    assert planes[: size // 2] == state[0 : 2 * (size // 2) : 2]
    assert join_planes(planes) == state


def test_byte_planes_compress_f16_kv_better_than_plain_zstd() -> None:
    state = f16_state(1 << 20)
    compress = zstandard.ZstdCompressor(level=3).compress

    assert len(compress(split_planes(state))) < 0.95 * len(compress(state))


def test_sixteen_bit_kv_gets_byte_planes_and_other_kv_plain_zstd() -> None:
    assert codec_for("f16") is Codec.ZSTD_BYTE_PLANES
    assert codec_for("q8_0") is Codec.ZSTD


def test_every_damaged_byte_is_detected() -> None:
    data = entry(f16_state(300))
    for offset in range(len(data)):
        damaged = bytearray(data)
        damaged[offset] ^= 0x01
        with pytest.raises(CorruptEntry):
            decode(bytes(damaged), fingerprint="fp-1", tokens=TOKENS)


@pytest.mark.parametrize("kept", [0, 7, 35, 100, -33, -1])
def test_truncated_entry_is_detected(kept: int) -> None:
    with pytest.raises(CorruptEntry):
        decode(entry(f16_state(300))[:kept], fingerprint="fp-1", tokens=TOKENS)


def test_entry_with_bytes_appended_is_detected() -> None:
    with pytest.raises(CorruptEntry, match="truncated"):
        decode(entry(f16_state(300)) + b"\0", fingerprint="fp-1", tokens=TOKENS)


def test_intact_entry_of_another_model_is_refused() -> None:
    with pytest.raises(CorruptEntry, match="fingerprint"):
        decode(entry(f16_state(300)), fingerprint="fp-2", tokens=TOKENS)


def test_intact_entry_of_other_tokens_is_refused() -> None:
    with pytest.raises(CorruptEntry, match="tokens"):
        decode(entry(f16_state(300)), fingerprint="fp-1", tokens=TOKENS[:-1])


def test_header_of_another_format_version_is_refused() -> None:
    data = bytearray(entry(f16_state(300)))
    data[8] = 2

    with pytest.raises(CorruptEntry, match="format version 2"):
        read_header(bytes(data))
