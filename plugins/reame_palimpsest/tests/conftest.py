"""Fixtures of the archive's tests: engines over the fake backend, each with its own plugin
instance on one shared archive directory, as separate server processes would be."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from palimpsest_testing import ArchivedEngine, StartArchive

from reame_core.backend.fake import FakeBackend
from reame_core.engine.engine import Engine
from reame_core.plugins import PluginHost
from reame_core.settings import Settings
from reame_palimpsest.plugin import Palimpsest

# Only the archive drafts, so every accepted draft is its own.
OTHER_SOURCES = ("prompt_lookup", "draft_model")


@pytest.fixture
def archive_dir(tmp_path: Path) -> Path:
    return tmp_path / "palimpsest"


@pytest.fixture
def start_archive(archive_dir: Path) -> Iterator[StartArchive]:
    """Start an engine with a fresh plugin on `archive_dir`, its index ready; stopped after
    the test. Keyword arguments: `section` (more of the [plugins.palimpsest] table) and
    FakeBackend options."""
    started: list[ArchivedEngine] = []

    def start(section: dict[str, Any] | None = None, **backend_options: Any) -> ArchivedEngine:
        backend = FakeBackend(**backend_options)
        archive = Palimpsest()
        host = PluginHost(OTHER_SOURCES, discover=False)
        host.register(archive, "palimpsest")
        # Drafting is what most tests watch: a repeated request would otherwise be answered
        # from the remembered answers, not drafted.
        table = {"dir": str(archive_dir), "recall": False, **(section or {})}
        settings = Settings(plugins={"palimpsest": table})
        host.hook.reame_configure(settings=settings, model=backend.info, hook=host.hook)
        assert archive.archivist is not None and archive.archivist.ready.wait(30)
        running = ArchivedEngine(Engine(backend, host, draft_max=16).start(), archive, backend)
        started.append(running)
        return running

    yield start
    for running in started:
        running.engine.stop()
