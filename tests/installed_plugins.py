"""Installing the contract plugins (tests/contract/contract_plugins) the way a third party's
plugins are installed, for one test: see `InstalledPlugins` and the `install_plugins` fixture."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import ModuleType

from reame_core.plugins import PluginHost

CONTRACT_PLUGINS = Path(__file__).parent / "contract"


class InstalledPlugins:
    """Contract plugins installed the way a third party's are: a distribution's metadata with
    a ``reame`` entry point per plugin, in a folder on sys.path (and, for processes the test
    starts, on `pythonpath`). Nothing is installed into the environment itself."""

    def __init__(self, site: Path, others: list[str]) -> None:
        self.site = site
        self.others = others  # installed plugins of the environment, kept out of the tests
        self.pythonpath = os.pathsep.join([str(site), str(CONTRACT_PLUGINS)])

    def __call__(self, *names: str) -> PluginHost:
        """Install the named modules of `contract_plugins` and discover them with a new
        `PluginHost`, the environment's own installed plugins disabled."""
        for module in [m for m in sys.modules if m.startswith("contract_plugins.")]:
            del sys.modules[module]  # each install starts from the module's fresh state
        info = self.site / "reame_contract_plugins-0.0.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: reame-contract-plugins\nVersion: 0.0\n"
        )
        lines = [f"{name} = contract_plugins.{name}" for name in names]
        (info / "entry_points.txt").write_text("[reame]\n" + "\n".join(lines) + "\n")
        importlib.invalidate_caches()
        return PluginHost(disabled=self.others)

    def module(self, name: str) -> ModuleType:
        """An installed plugin's module, to read what it recorded."""
        return sys.modules[f"contract_plugins.{name}"]
