"""What every test shares, in tests/ and in the plugins' own test folders."""

from __future__ import annotations

import contextlib
import secrets
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def private_cache_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Caches under XDG_CACHE_HOME (the disk prefix cache's default directory among them)
    go to a temporary directory, for the tests and the `reame` processes they start: a
    test run never reads or fills the user's own."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        yield


@dataclass
class SmallDisk:
    """A file system of a few megabytes mounted for one test, so that faults are the
    kernel's own, for sqlite's writes as much as for Python's: a tmpfs fills up (ENOSPC)
    and can be mounted read-only; an ext4 on a loop device also turns read-only under
    open files, as it does when its disk fails (``errors=remount-ro``)."""

    path: Path
    kind: str

    def fill(self, leave: int = 0) -> Path:
        """Take all the free space but about `leave` bytes; returns the file that holds it."""
        filler = self.path / f"filler-{secrets.token_hex(4)}"
        free = shutil.disk_usage(self.path).free - leave
        with filler.open("wb") as file, contextlib.suppress(OSError):
            while free > 0:
                free -= file.write(b"\0" * min(free, 1 << 16))
        return filler

    def remount(self, mode: str) -> None:
        """Remount "ro" or "rw" (the kernel refuses "ro" while a file is open to write)."""
        subprocess.run(["mount", "-o", f"remount,{mode}", str(self.path)], check=True)

    def fail(self) -> None:
        """An ext4 error, as a failing disk causes: the file system turns read-only at once,
        under every open file (ext4's own test hook, `trigger_fs_error`)."""
        assert self.kind == "ext4"
        device = subprocess.run(
            ["findmnt", "-n", "-o", "SOURCE", str(self.path)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        Path(f"/sys/fs/ext4/{Path(device).name}/trigger_fs_error").write_text("1")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[..., SmallDisk]]:
    """Mount a file system of `size` bytes, "tmpfs" or "ext4" (on a loop device), until
    the test ends. Skips the test where mounting is not permitted (not root, or a
    container without the capability)."""
    mounted: list[Path] = []

    def mount(size: int, kind: str = "tmpfs") -> SmallDisk:
        path = tmp_path / f"disk-{len(mounted)}"
        path.mkdir()
        if shutil.which("mount") is None:
            pytest.skip("no mount(8) here: the real-disk faults need one")
        if kind == "ext4":
            if shutil.which("mkfs.ext4") is None:
                pytest.skip("no mkfs.ext4 here: the failing-disk faults need one")
            image = tmp_path / f"disk-{len(mounted)}.img"
            with image.open("wb") as file:
                file.truncate(size)
            subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
            argv = ["mount", "-o", "loop,errors=remount-ro", str(image), str(path)]
        else:
            argv = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a {kind} here ({done.stderr.strip()}): needs root")
        mounted.append(path)
        return SmallDisk(path, kind)

    yield mount
    for path in mounted:
        subprocess.run(["umount", "--lazy", str(path)], check=False)
