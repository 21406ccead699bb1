"""PluginHost: built-ins and installed plugins found, registered, listed and disabled by name."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import DiskNeed
from reame_core.plugins import PluginHost, PluginRecord
from reame_core.settings import Settings

GOOD_PLUGIN = """
from reame_core.hookspecs import hookimpl


@hookimpl
def reame_describe():
    return "mine: proposes nothing yet"


@hookimpl
def reame_propose_drafts(requests):
    return []
"""

Install = Callable[..., None]


def record(host: PluginHost, name: str) -> PluginRecord:
    return next(r for r in host.records() if r.name == name)


@pytest.fixture
def install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Install]:
    """Install a one-module distribution with a ``reame`` entry point, on sys.path only."""
    modules: list[str] = []

    def install(dist: str, version: str, entry_point: str, module: str, source: str) -> None:
        (tmp_path / module).mkdir()
        (tmp_path / module / "__init__.py").write_text(source)
        info = tmp_path / f"{dist}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[reame]\n{entry_point} = {module}\n")
        modules.append(module)

    monkeypatch.syspath_prepend(str(tmp_path))
    yield install
    for module in modules:
        sys.modules.pop(module, None)


# ------------------------------------------------------------------------ built-ins


@pytest.mark.parametrize(
    ("name", "hook"),
    [("verification", "reame_verify_drafts"), ("selection", "reame_select_candidates")],
)
def test_builtins_are_registered_with_their_hooks(name: str, hook: str) -> None:
    host = PluginHost(discover=False)

    builtin = record(host, name)

    assert builtin.enabled and builtin.builtin
    assert hook in builtin.hooks
    assert builtin.description
    assert host.has_implementations(hook)


def test_disabling_a_builtin_by_name_records_it_disabled() -> None:
    host = PluginHost(disabled=["selection"], discover=False)

    selection = record(host, "selection")

    assert not selection.enabled and selection.builtin
    assert selection.hooks == ()
    assert not host.has_implementations("reame_select_candidates")
    assert record(host, "verification").enabled


# ------------------------------------------------------------------- in-process


class Describer:
    @hookimpl
    def reame_describe(self) -> str:
        return "describes itself"


def test_in_process_plugin_is_registered_with_its_hooks_and_description() -> None:
    host = PluginHost(discover=False)

    host.register(Describer(), "describer")

    registered = record(host, "describer")
    assert registered.enabled and not registered.builtin
    assert registered.hooks == ("reame_describe",)
    assert registered.description == "describes itself"
    assert "describes itself" in host.hook.reame_describe()


def test_disabled_in_process_plugin_is_not_registered() -> None:
    host = PluginHost(disabled=["describer"], discover=False)

    host.register(Describer(), "describer")

    assert not record(host, "describer").enabled
    assert "describes itself" not in host.hook.reame_describe()


class DiskUser:
    NEED = DiskNeed("disk_user", "its files", share=0.1, cap=1 << 30)

    @hookimpl
    def reame_disk_need(self, settings: Settings) -> DiskNeed:
        return self.NEED


def test_the_builtins_ask_for_no_disk() -> None:
    assert PluginHost(discover=False).disk_needs(Settings()) == []


def test_a_plugin_that_keeps_files_asks_for_disk_unless_disabled() -> None:
    enabled = PluginHost(discover=False)
    disabled = PluginHost(disabled=["disk_user"], discover=False)

    for host in (enabled, disabled):
        host.register(DiskUser(), "disk_user")

    assert enabled.disk_needs(Settings()) == [DiskUser.NEED]
    assert disabled.disk_needs(Settings()) == []


# ----------------------------------------------------------------- entry points


def test_installed_plugin_is_discovered_with_its_distribution_and_version(
    install: Install,
) -> None:
    install("mypkg", "0.1", "mine", "reame_test_mypkg", GOOD_PLUGIN)

    host = PluginHost()

    mine = record(host, "mine")
    assert (mine.distribution, mine.version) == ("mypkg", "0.1")
    assert mine.enabled and not mine.builtin
    assert mine.hooks == ("reame_describe", "reame_propose_drafts")
    assert mine.description == "mine: proposes nothing yet"
    assert host.has_implementations("reame_propose_drafts")


def test_disabled_installed_plugin_is_not_imported(install: Install) -> None:
    install("mypkg", "0.1", "mine", "reame_test_mypkg_off", GOOD_PLUGIN)

    host = PluginHost(disabled=["mine"])

    mine = record(host, "mine")
    assert not mine.enabled
    assert (mine.distribution, mine.version) == ("mypkg", "0.1")
    assert "reame_test_mypkg_off" not in sys.modules
    sources = host.hook.reame_propose_drafts.get_hookimpls()
    assert "mine" not in {impl.plugin_name for impl in sources}


def test_plugin_that_fails_to_import_is_recorded_with_its_error(install: Install) -> None:
    install("brokenpkg", "2.0", "broken", "reame_test_broken", "raise RuntimeError('no luck')\n")
    install("mypkg", "0.1", "mine", "reame_test_mypkg_ok", GOOD_PLUGIN)

    host = PluginHost()

    broken = record(host, "broken")
    assert not broken.enabled
    assert broken.error == "RuntimeError: no luck"
    assert (broken.distribution, broken.version) == ("brokenpkg", "2.0")
    assert record(host, "mine").enabled
    assert record(host, "verification").enabled
