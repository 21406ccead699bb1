"""`reame config` and `reame run --explain`: the configuration a run would use, and why.

Nothing is downloaded or loaded. A known alias that is not downloaded yet is planned from
its registry card, so the answer to "does the 7B fit this box?" costs no download.
"""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from reame_core.autoconfig.facts import HostFacts, read_host_facts
from reame_core.autoconfig.plan import AttentionFacts, HostPlan, plan_host, size
from reame_core.backend.attention_timing import cached_timing
from reame_core.backend.probe import (
    BuildVerdict,
    ProbeSubject,
    attention_facts,
    read_verdict,
)
from reame_core.models import ModelStore, parse_model_name
from reame_core.models.errors import ModelNotDownloadedError
from reame_core.models.names import LocalModel
from reame_core.models.shape import ModelShape
from reame_core.plugins import PluginHost
from reame_core.settings import Settings


def config_command(settings: Settings, out: TextIO) -> int:
    needs = PluginHost(settings.disable_plugins).disk_needs(settings)
    facts = read_host_facts(settings.cache_path, [n.directory for n in needs if n.directory])
    model, shape, path = _model_shape(settings)
    build = read_verdict(settings.cache_path, ProbeSubject.here())
    timing = cached_timing(settings.cache_path, build, path) if build and path else None
    attention = attention_facts(timing)
    if timing is None and build is not None:
        # No timing of its own (not taken yet, or not needed): the row-exact path is the
        # build's own.
        attention = AttentionFacts(row_exact_flash=build.attention.row_exact_flash)
    plan = plan_host(settings, facts, shape, needs, attention)
    out.write(render(settings.model, model, facts, plan, build_note(build)))
    return 0


def build_note(verdict: BuildVerdict | None) -> str:
    """The cached build check's verdict in a line (config never runs the check itself)."""
    if verdict is None:
        return "not checked on this CPU yet: the first run checks it, or `reame doctor`"
    if not verdict.runs:
        return "cannot run on this CPU: `reame doctor` says why and how to fix it"
    if verdict.fell_back:
        return "runs on this CPU only without extra buffer types (slower prompts): `reame doctor`"
    return "runs on this CPU (details: `reame doctor`)"


def render(name: str, model: str, facts: HostFacts, plan: HostPlan, build: str = "") -> str:
    lines = [
        f"model    {name}: {model}",
        f"host     {facts.arch}, {facts.physical_cores} physical cores "
        f"({facts.logical_cpus} logical CPUs), {size(facts.memory_available)} of "
        f"{size(facts.memory_total)} memory available, {size(facts.disk_free)} free "
        f"in {facts.disk_path}",
        *([f"build    llama.cpp {build}"] if build else []),
        "",
    ]
    rows = plan.explain()
    width = max(len(label) for label, _ in rows)
    lines += [f"{label:<{width}}  {text}" for label, text in rows]
    lines += [f"warning: {warning}" for warning in plan.warnings]
    lines += ["", "Any value can be set by flag, REAME_* environment variable or config file."]
    return "\n".join(lines) + "\n"


def _model_shape(settings: Settings) -> tuple[str, ModelShape, Path | None]:
    """The model as `render` names it, its shape, and its file once downloaded."""
    from reame_core.backend.llama import read_model_shape

    store = ModelStore.in_cache_dir(settings.cache_path)
    ref = parse_model_name(settings.model)
    path: Path | None = store.locate(ref)
    if path is not None:
        return str(path), read_model_shape(path), path
    if not isinstance(ref, LocalModel) and ref.card is not None:
        card = ref.card
        return f"not downloaded yet; sized from {card.repo}/{card.file}", card.shape, None
    raise ModelNotDownloadedError(
        f"{ref.name} is not downloaded, and only its file tells its size; "
        f"run `reame pull {ref.name}` first."
    )
