"""Fixtures shared by unit and integration tests: private model caches, a fake hub, and
the contract plugins installed through entry points.

No test may read or write the user's own Hugging Face cache, reach the real hub, or depend
on the caller's HF_* / REAME_* environment.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from fakehub import FakeHub
from installed_plugins import CONTRACT_PLUGINS, InstalledPlugins

from reame_core.plugins import ENTRY_POINT_GROUP

_HUB_VARIABLES = ("HF_HOME", "HF_HUB_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


@pytest.fixture(scope="session", autouse=True)
def scratch_reame_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every `reame` the tests start, in process or not, keeps its records (last use,
    verified files) in a scratch folder rather than the user's cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("REAME_CACHE_DIR", str(tmp_path_factory.mktemp("reame-cache")))
        yield


@pytest.fixture
def model_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the Hugging Face cache and Reame's own cache at fresh folders; returns the
    Hugging Face cache. The hub endpoint is one that cannot answer."""
    for name in _HUB_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    hf_cache = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(hf_cache))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("REAME_CACHE_DIR", str(tmp_path / "reame-cache"))
    return hf_cache


@pytest.fixture
def fake_hub(model_caches: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """A running `FakeHub` that HF_ENDPOINT points to; it serves nothing until `add`."""
    hub = FakeHub()
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    yield hub
    hub.close()


@pytest.fixture
def install_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[InstalledPlugins]:
    """Install contract plugins through entry points for one test (see `InstalledPlugins`)."""
    others = [entry.name for entry in metadata.entry_points(group=ENTRY_POINT_GROUP)]
    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.syspath_prepend(str(CONTRACT_PLUGINS))
    monkeypatch.syspath_prepend(str(site))
    yield InstalledPlugins(site, others)
    for module in [m for m in sys.modules if m.startswith("contract_plugins")]:
        del sys.modules[module]
