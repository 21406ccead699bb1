"""Fixtures of the disk cache's tests: engines over the fake backend, each with its own
plugin instance on one shared cache directory, as separate server processes would be; and
failures of the directory (disk full, read-only) injected at the system-call level."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from diskkv_testing import CachedEngine, StartCache

from reame_core.backend.fake import FakeBackend
from reame_core.engine.engine import Engine
from reame_core.plugins import PluginHost
from reame_core.settings import Settings
from reame_diskkv.plugin import DiskPrefixCache


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "kv"


@pytest.fixture
def start_cache(cache_dir: Path) -> Iterator[StartCache]:
    """Start an engine with a fresh plugin on `cache_dir`; stopped after the test.
    Keyword arguments: `section` (more of the [plugins.diskkv] table) and FakeBackend
    options."""
    started: list[CachedEngine] = []

    def start(section: dict[str, Any] | None = None, **backend_options: Any) -> CachedEngine:
        backend = FakeBackend(**backend_options)
        cache = DiskPrefixCache()
        host = PluginHost(discover=False)
        host.register(cache, "diskkv")
        settings = Settings(plugins={"diskkv": {"dir": str(cache_dir), **(section or {})}})
        host.hook.reame_configure(settings=settings, model=backend.info, hook=host.hook)
        running = CachedEngine(Engine(backend, host).start(), cache, backend)
        started.append(running)
        return running

    yield start
    for running in started:
        running.engine.stop()


@pytest.fixture
def fail_writes_in(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path, int], None]:
    """Make every write(2) to a file under a directory fail with an errno (ENOSPC: the
    disk is full), as the kernel would; writes elsewhere go through."""

    def fail(directory: Path, code: int) -> None:
        real_write = os.write
        root = str(directory.resolve())

        def write(fd: int, data: Any) -> int:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(root):
                raise OSError(code, os.strerror(code))
            return real_write(fd, data)

        monkeypatch.setattr(os, "write", write)

    return fail


@pytest.fixture
def read_only(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path], None]:
    """Make a directory tree refuse to create files and directories with EROFS, as a
    read-only mount does (chmod cannot do it here: tests may run as root)."""

    def make_read_only(directory: Path) -> None:
        real_open, real_mkdir = os.open, os.mkdir
        root = str(directory)

        def guarded_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            if str(path).startswith(root) and flags & (os.O_CREAT | os.O_WRONLY | os.O_RDWR):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
            return real_open(path, flags, *args, **kwargs)

        def guarded_mkdir(path: Any, *args: Any, **kwargs: Any) -> None:
            if str(path).startswith(root):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
            real_mkdir(path, *args, **kwargs)

        monkeypatch.setattr(os, "open", guarded_open)
        monkeypatch.setattr(os, "mkdir", guarded_mkdir)

    return make_read_only
