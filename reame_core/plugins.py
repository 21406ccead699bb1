"""Finding, registering and listing plugins.

Reame's own features are registered first, from `BUILTIN_PLUGINS`, through the same hooks
a third party uses; then every installed distribution's entry point in the ``reame``
group is loaded. Any plugin, built-in or installed, can be disabled by name per
deployment (``--disable-plugin NAME``, ``REAME_DISABLE_PLUGINS``).
"""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, replace
from importlib import metadata
from types import CodeType
from typing import TYPE_CHECKING, Any

import pluggy
import structlog

from reame_core import hookspecs
from reame_core.errors import ModelLoadError, SettingsError
from reame_core.hooktypes import DiskNeed, ModelInfo

if TYPE_CHECKING:
    from reame_core.settings import Settings

log = structlog.get_logger(__name__)

ENTRY_POINT_GROUP = "reame"
# A module, or "module:Class" for a plugin with state of its own (one instance per host).
BUILTIN_PLUGINS: tuple[tuple[str, str], ...] = (
    ("verification", "reame_core.builtins.verification"),
    ("selection", "reame_core.builtins.selection"),
    ("prompt_lookup", "reame_core.builtins.prompt_lookup:PromptLookup"),
    ("draft_model", "reame_core.builtins.draft_model:DraftModel"),
)


@dataclass(frozen=True)
class PluginRecord:
    name: str
    distribution: str
    version: str
    enabled: bool
    builtin: bool
    hooks: tuple[str, ...] = ()
    description: str = ""
    error: str = ""


class PluginHost:
    """Owns the pluggy manager: what is registered, and the record of what was found."""

    def __init__(self, disabled: Iterable[str] = (), *, discover: bool = True) -> None:
        self.manager = pluggy.PluginManager(hookspecs.PROJECT)
        self.manager.add_hookspecs(hookspecs)
        self._disabled = set(disabled)
        self._records: dict[str, PluginRecord] = {}
        core = _distribution_of("reame_core")
        for name, module_name in BUILTIN_PLUGINS:
            if self._skip(name, core, builtin=True):
                continue
            self._register(_builtin(module_name), name, core, builtin=True)
        if discover:
            for entry_point in metadata.entry_points(group=ENTRY_POINT_GROUP):
                self._load(entry_point)

    @property
    def hook(self) -> Any:
        return self.manager.hook

    def register(self, plugin: object, name: str) -> None:
        """Register a plugin object in-process (tests, embedding applications)."""
        if self._skip(name, ("<in-process>", ""), builtin=False):
            return
        self._register(plugin, name, ("<in-process>", ""), builtin=False)

    def records(self) -> list[PluginRecord]:
        return list(self._records.values())

    def disk_needs(self, settings: Settings) -> list[DiskNeed]:
        """What the enabled plugins ask of the disk, for the host plan."""
        return list(self.hook.reame_disk_need(settings=settings))

    def has_implementations(self, hook_name: str) -> bool:
        return bool(getattr(self.manager.hook, hook_name).get_hookimpls())

    def configure(self, settings: Settings, model: ModelInfo) -> None:
        """Call every plugin's `reame_configure`, in pluggy's order. A plugin whose
        configure fails unexpectedly is disabled, with the reason logged and kept in its
        record: the others, and the server, run without it. A plugin that refuses what the
        user configured (`SettingsError`, `ModelLoadError`: a bad option, a draft model of
        another vocabulary) stops the start with its message instead: running without what
        was asked for would hide the mistake."""
        arguments = {"settings": settings, "model": model, "hook": self.hook}
        for impl in reversed(self.hook.reame_configure.get_hookimpls()):
            try:
                impl.function(**{name: arguments[name] for name in impl.argnames})
            except (SettingsError, ModelLoadError):
                raise
            except Exception as error:
                reason = f"reame_configure raised {type(error).__name__}: {error}"
                log.exception("plugin failed to configure; disabled", plugin=impl.plugin_name)
                self.manager.unregister(name=impl.plugin_name)
                record = self._records.get(impl.plugin_name)
                if record is not None:
                    self._records[impl.plugin_name] = replace(record, enabled=False, error=reason)

    def culprit(self, error: BaseException) -> str | None:
        """The plugin hook an exception was raised in, as "plugin 'NAME' (hook)", from
        its traceback: the innermost frame that runs a registered hook implementation."""
        owners: dict[CodeType, str] = {}
        for caller in vars(self.manager.hook).values():
            for impl in caller.get_hookimpls():
                code = getattr(impl.function, "__code__", None)
                if code is not None:
                    owners[code] = f"plugin '{impl.plugin_name}' ({caller.name})"
        found = None
        for frame, _line in traceback.walk_tb(error.__traceback__):
            found = owners.get(frame.f_code, found)
        return found

    # ---------------------------------------------------------------- helpers

    def _skip(self, name: str, dist: tuple[str, str], *, builtin: bool) -> bool:
        if name not in self._disabled:
            return False
        self._records[name] = PluginRecord(name, dist[0], dist[1], False, builtin)
        return True

    def _register(self, plugin: object, name: str, dist: tuple[str, str], *, builtin: bool) -> None:
        self.manager.register(plugin, name=name)
        hooks = tuple(sorted(caller.name for caller in self.manager.get_hookcallers(plugin) or ()))
        describe = getattr(plugin, "reame_describe", None)
        description = describe() if callable(describe) else ""
        self._records[name] = PluginRecord(
            name, dist[0], dist[1], True, builtin, hooks, description
        )

    def _load(self, entry_point: metadata.EntryPoint) -> None:
        name = entry_point.name
        dist = entry_point.dist
        info = (dist.name, dist.version) if dist is not None else ("?", "?")
        if self._skip(name, info, builtin=False):
            return
        try:
            plugin = entry_point.load()
        except Exception as error:  # a broken plugin must not take the server down
            log.error("plugin failed to load", plugin=name, error=str(error))
            self._records[name] = PluginRecord(
                name, info[0], info[1], False, False, error=f"{type(error).__name__}: {error}"
            )
            return
        self._register(plugin, name, info, builtin=False)


def _builtin(target: str) -> object:
    module_name, _colon, factory = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, factory)() if factory else module


def _distribution_of(package: str) -> tuple[str, str]:
    for dist_name in metadata.packages_distributions().get(package, []):
        return dist_name, metadata.version(dist_name)
    return "reame", "unknown"
