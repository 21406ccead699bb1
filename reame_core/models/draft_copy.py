"""A draft model's Q4_0 copy: the draft's speed decides whether drafting pays, its precision
only how often it guesses right.

The target verifies every drafted token, so what the draft model's weights are stored in
never changes an answer; what a drafted token costs decides whether a draft can pay at all.
On a CPU the format matters more than the size: llama.cpp repacks Q4_0 for its fastest
matrix kernels on x86 (AMX where the CPU has it, AVX2 and AVX-512 otherwise) and ARM (NEON,
i8mm), while a Q4_K_M file of a small model keeps most of its matrices in formats without
such kernels (Qwen2.5-Coder-0.5B's: Q5_0) and its output layer, over a third of the bytes a
token reads, in Q8_0, twice Q4_0's bytes.

The copy is made once with llama.cpp's own quantizer, every matrix Q4_0 (norms stay as they
are), under the cache directory's ``drafts/``: one process at a time (a lock file), written
under a scratch name, fsynced and renamed, so no copy is ever read half-written. Its name is
the source's file name and a key of the source's path, size and mtime, so a new version of
the file replaces its copy. Where no copy can be made (no room, a read-only cache, a file
llama.cpp cannot quantize) the draft model is loaded from its file.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import structlog

from reame_core.autoconfig.facts import free_disk_bytes

try:
    import fcntl
except ImportError:  # not POSIX: two processes may both make a copy, one rename wins
    fcntl = None  # type: ignore[assignment]

log = structlog.get_logger(__name__)

FOLDER = "drafts"
RECIPE = "q4_0-pure-1"  # part of every copy's key: a new recipe makes new copies
KEY_DIGITS = 16
SUFFIX = ".q4_0.gguf"


def q4_0_copy(source: Path, cache_dir: Path, *, threads: int) -> Path | None:
    """The Q4_0 copy of `source`, made now if there is none; None where none can be made
    (the caller then drafts from `source` itself)."""
    folder = cache_dir / FOLDER
    copy = folder / copy_name(source)
    if copy.is_file():
        return copy
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if free_disk_bytes(folder) < source.stat().st_size:
            log.warning("no room for a Q4_0 copy of the draft model", folder=str(folder))
            return None
        with _lock(folder):
            if not copy.is_file() and not _make(source, copy, threads):
                return None
    except OSError as error:
        log.warning("no Q4_0 copy of the draft model", source=str(source), error=str(error))
        return None
    for older in _copies(folder, source):
        if older != copy:
            older.unlink(missing_ok=True)
            log.info("older Q4_0 copy of the draft model removed", copy=str(older))
    return copy


def remove_copies(source: Path, cache_dir: Path) -> int:
    """Delete every copy made of a file of `source`'s name, and what a crash left of one
    being made; the bytes freed."""
    folder = cache_dir / FOLDER
    freed = 0
    for path in [*_copies(folder, source), *_scratch_files(folder, source)]:
        with contextlib.suppress(FileNotFoundError):
            size = path.stat().st_size
            path.unlink()
            freed += size
    return freed


def copy_name(source: Path) -> str:
    """``<file name>.<key>.q4_0.gguf``, the key naming the source's path, size, mtime and
    the recipe."""
    stat = source.stat()
    identity = f"{source.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{RECIPE}"
    key = hashlib.sha256(identity.encode()).hexdigest()[:KEY_DIGITS]
    return f"{_stem(source)}.{key}{SUFFIX}"


def _make(source: Path, copy: Path, threads: int) -> bool:
    # One scratch name per copy: what a killed process left is overwritten by the next try.
    scratch = copy.with_name(f".{copy.name}.part")
    started = time.perf_counter()
    try:
        status = _quantize(source, scratch, threads)
        if status != 0:
            log.warning("no Q4_0 copy of the draft model", source=str(source), status=status)
            return False
        with open(scratch, "rb") as written:
            os.fsync(written.fileno())  # on disk before it has the name readers look for
        os.replace(scratch, copy)
    finally:
        scratch.unlink(missing_ok=True)
    log.info(
        "draft model copied to Q4_0",
        source=str(source),
        copy=str(copy),
        seconds=round(time.perf_counter() - started, 1),
        megabytes=round(copy.stat().st_size / 1e6),
    )
    return True


def _quantize(source: Path, target: Path, threads: int) -> int:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
    params.allow_requantize = True
    params.pure = True  # the output layer too (llama.cpp would give it Q6_K or Q8_0)
    params.nthread = max(1, threads)
    return int(llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), params))


@contextlib.contextmanager
def _lock(folder: Path) -> Iterator[None]:
    """Held while a copy is made: a second process starting meanwhile waits and uses it."""
    if fcntl is None:
        yield
        return
    with open(folder / ".lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _copies(folder: Path, source: Path) -> list[Path]:
    pattern = f"{glob.escape(_stem(source))}.{'?' * KEY_DIGITS}{SUFFIX}"
    return list(folder.glob(pattern))


def _scratch_files(folder: Path, source: Path) -> list[Path]:
    pattern = f".{glob.escape(_stem(source))}.{'?' * KEY_DIGITS}{SUFFIX}.part"
    return list(folder.glob(pattern))


def _stem(source: Path) -> str:
    return source.name.removesuffix(".gguf")
