"""A draft model's Q4_0 copy: the draft's speed decides whether drafting pays, its precision
only how often it guesses right.

The target verifies every drafted token, so what the draft model's weights are stored in
never changes an answer; what a drafted token costs decides whether a draft can pay at all.
On a CPU the format matters more than the size: llama.cpp repacks Q4_0 for its fastest
matrix kernels on x86 (AMX where the CPU has it, AVX2 and AVX-512 otherwise) and ARM (NEON,
i8mm), while a Q4_K_M file of a small model keeps most of its matrices in formats without
such kernels (Qwen2.5-Coder-0.5B's: Q5_0, and its output layer, over a third of the bytes
a token reads, in Q8_0). The copy is made once with
llama.cpp's own quantizer, every matrix Q4_0 (norms stay as they are), under the cache
directory's ``drafts/``, written to a temporary name and renamed when complete. Its name
carries the source's path, size and mtime, so a changed source gets a new copy (the old one
is removed) and no copy is ever read half-written.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import tempfile
import time
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

FOLDER = "drafts"
RECIPE = "q4_0-pure-1"  # part of every copy's key: a new recipe makes new copies
KEY = 8  # hex digits of each half of a copy's key


def q4_0_copy(source: Path, cache_dir: Path, *, threads: int) -> Path | None:
    """The Q4_0 copy of `source`, made now if there is none; None where llama.cpp's
    quantizer cannot make one (the caller then drafts from `source` itself)."""
    folder = cache_dir / FOLDER
    copy = folder / copy_name(source)
    if copy.is_file():
        return copy
    folder.mkdir(parents=True, exist_ok=True)
    fd, scratch = tempfile.mkstemp(dir=folder, prefix=f".{copy.name}.", suffix=".part")
    os.close(fd)
    started = time.perf_counter()
    try:
        status = _quantize(source, Path(scratch), threads)
        if status != 0:
            log.warning("no Q4_0 copy of the draft model", source=str(source), status=status)
            return None
        with open(scratch, "rb") as written:
            os.fsync(written.fileno())  # on disk before it has the name readers look for
        os.replace(scratch, copy)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(scratch)
    log.info(
        "draft model copied to Q4_0",
        source=str(source),
        copy=str(copy),
        seconds=round(time.perf_counter() - started, 1),
        megabytes=round(copy.stat().st_size / 1e6),
    )
    _remove_older_copies(folder, source, copy)
    return copy


def copy_name(source: Path) -> str:
    """``<stem>.<where><which>.q4_0.gguf``: `where` names the source's path, `which` its
    size, mtime and the recipe, so a new version of a file replaces its own copy only."""
    stat = source.stat()
    where = _key(str(source.resolve()))
    which = _key(f"{stat.st_size}|{stat.st_mtime_ns}|{RECIPE}")
    return f"{_stem(source)}.{where}{which}.q4_0.gguf"


def _quantize(source: Path, target: Path, threads: int) -> int:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
    params.allow_requantize = True
    params.pure = True  # the output layer and embeddings too, not llama.cpp's Q6_K for them
    params.nthread = max(1, threads)
    return int(llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), params))


def remove_copies(source: Path, cache_dir: Path) -> int:
    """Delete every copy made of `source` (`reame rm` of the model); the bytes freed."""
    freed = 0
    for copy in _copies(cache_dir / FOLDER, source):
        with contextlib.suppress(FileNotFoundError):
            size = copy.stat().st_size
            copy.unlink()
            freed += size
    return freed


def _remove_older_copies(folder: Path, source: Path, kept: Path) -> None:
    """Copies made from earlier versions of the same source file."""
    for other in _copies(folder, source):
        if other != kept:
            with contextlib.suppress(FileNotFoundError):
                other.unlink()
                log.info("older Q4_0 copy of the draft model removed", copy=str(other))


def _copies(folder: Path, source: Path) -> list[Path]:
    where = _key(str(source.resolve()))
    return list(folder.glob(f"{glob.escape(_stem(source))}.{where}{'?' * KEY}.q4_0.gguf"))


def _stem(source: Path) -> str:
    return source.name.removesuffix(".gguf")


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:KEY]
