"""What every test shares, in tests/ and in the plugins' own test folders."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def private_cache_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Caches under XDG_CACHE_HOME (the disk prefix cache's default directory among them)
    go to a temporary directory, for the tests and the `reame` processes they start: a
    test run never reads or fills the user's own."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        yield
