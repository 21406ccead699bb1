"""Putting a running Reame together: settings -> model file -> host plan -> plugins ->
backend -> engine.

The CLI, the server and the benchmarks all start here, so every entry point runs the
same configuration for the same settings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import structlog

from reame_core.autoconfig.facts import read_host_facts
from reame_core.autoconfig.plan import HostPlan, plan_host
from reame_core.backend.attention_timing import time_attention
from reame_core.backend.base import Backend
from reame_core.backend.pass_check import PassCheck, check_passes
from reame_core.backend.probe import (
    BuildVerdict,
    attention_facts,
    ensure_build_runs,
)
from reame_core.engine.engine import Engine
from reame_core.hooktypes import DiskNeed
from reame_core.models import ModelStore, ResolvedModel
from reame_core.plugins import PluginHost
from reame_core.settings import Settings

log = structlog.get_logger(__name__)


@dataclass
class Runtime:
    settings: Settings
    plugins: PluginHost
    backend: Backend
    engine: Engine
    # The host plan the model was loaded with (None for a backend the caller supplied).
    plan: HostPlan | None = None
    # Whether a row's logits depend on the pass that computes it, for this model here
    # (None: not checked).
    passes: PassCheck | None = None
    _closed: bool = field(default=False, init=False, repr=False)

    @cached_property
    def request_extensions(self) -> Mapping[str, str]:
        """The request fields the enabled plugins handle (hook `reame_request_extensions`),
        each with its description; the API refuses any other field it does not know."""
        claimed: dict[str, str] = {}
        for fields in self.plugins.hook.reame_request_extensions():
            claimed.update(fields or {})
        return claimed

    def close(self) -> None:
        """Stop the engine (plugins flush in `reame_shutdown`) and free the model; once."""
        if self._closed:
            return
        self._closed = True
        self.engine.stop()
        self.backend.close()


@dataclass(frozen=True)
class Preparation:
    """The model file and the host plan a runtime would start with."""

    model: ResolvedModel
    plan: HostPlan


def prepare(
    settings: Settings, disk_needs: Sequence[DiskNeed] = (), build: BuildVerdict | None = None
) -> Preparation:
    """Find (or download) the model, then plan threads, context, slots, KV and attention for
    this host (`build`: the build check's verdict; on a build without the row-exact path the
    model's attention is timed the first time), and a disk budget for each of `disk_needs`
    (`PluginHost.disk_needs`)."""
    from reame_core.backend.llama import read_model_shape

    model = ModelStore.in_cache_dir(settings.cache_path).resolve(settings.model)
    facts = read_host_facts(settings.cache_path, [n.directory for n in disk_needs if n.directory])
    shape = read_model_shape(model.path)
    timing = time_attention(settings.cache_path, build, model.path) if build else None
    return Preparation(
        model, plan_host(settings, facts, shape, disk_needs, attention_facts(timing))
    )


def load_backend(
    settings: Settings, preparation: Preparation, *, use_extra_bufts: bool = True
) -> Backend:
    """The planned model in llama.cpp; `use_extra_bufts` as the build check decided."""
    from reame_core.backend.llama import LlamaBackend

    plan = preparation.plan
    return LlamaBackend(
        preparation.model.path,
        n_ctx_seq=plan.ctx.value,
        n_seq_max=plan.parallel.value,
        n_batch=plan.batch.value,
        n_threads=plan.threads.value,
        deterministic=settings.deterministic,
        flash_attn=plan.flash_attn.value,
        type_k=plan.kv_type_k.value,
        type_v=plan.kv_type_v.value,
        name=preparation.model.name,
        use_extra_bufts=use_extra_bufts,
        weights=plan.weights.value,
    )


def planned_backend(settings: Settings) -> Backend:
    """The configured model loaded as `start_runtime` loads it on this host: the build
    checked, the model's attention timed, and the host plan's context, slots, KV types and
    attention. For benchmarks that call llama.cpp without an engine."""
    build = ensure_build_runs(settings)
    preparation = prepare(settings, build=build)
    return load_backend(settings, preparation, use_extra_bufts=build.use_extra_bufts)


def start_runtime(
    settings: Settings,
    *,
    backend: Backend | None = None,
    plugins: PluginHost | None = None,
    build: BuildVerdict | None = None,
) -> Runtime:
    """Start an engine. Without a `backend`, check that the llama.cpp build runs on this
    CPU (once per build and CPU; `BuildCannotRunError` if not, `build` if the caller has
    checked), then load the configured model with a host plan.
    """
    plugins = plugins or PluginHost(settings.disable_plugins)
    plan = None
    passes = None
    if backend is None:
        # Before llama.cpp is loaded into this process: the check runs it in a child.
        build = build or ensure_build_runs(settings)
        preparation = prepare(settings, plugins.disk_needs(settings), build)
        plan = preparation.plan
        log.info("host configuration", **dict(preparation.plan.explain()))
        for warning in preparation.plan.warnings:
            log.warning("host configuration", problem=warning)
        settings = settings.with_plugin_defaults(preparation.plan.plugin_defaults())
        backend = load_backend(settings, preparation, use_extra_bufts=build.use_extra_bufts)
        if settings.deterministic:
            # On the fresh model, before any sequence holds KV.
            passes = check_passes(backend, settings.cache_path)
            # Every reader of the draft limit (the engine, a draft model timing its calls)
            # gets the one that keeps verification within the passes found exact.
            settings = settings.model_copy(update={"draft_max": draft_max(settings, passes)})
    plugins.configure(settings, backend.info)
    engine = Engine(
        backend,
        plugins,
        prefill_chunk=settings.prefill_chunk,
        draft_max=settings.draft_max,
        speculate=settings.speculate,
        adapt_threads=settings.adapt_threads,
        max_sessions=settings.max_sessions,
        sessions_first=settings.sessions_first,
        exact_reuse=settings.deterministic,
        rows_exact=passes is not None and passes.exact,
    ).start()
    log.info(
        "engine ready",
        model=backend.info.name,
        slots=backend.info.n_seq_max,
        ctx_per_slot=backend.info.n_ctx_seq,
        kv_type=backend.info.kv_type,
        deterministic=settings.deterministic,
        guarantees=determinism_note(settings, passes),
    )
    return Runtime(settings, plugins, backend, engine, plan, passes)


def draft_max(settings: Settings, passes: PassCheck | None) -> int:
    """The longest draft a sequence verifies: `settings.draft_max`, shortened where the
    pass check found verification exact only in shorter passes (`PassCheck.draft_cap`)."""
    cap = None if passes is None else passes.draft_cap
    return settings.draft_max if cap is None else min(settings.draft_max, cap)


def determinism_note(settings: Settings, passes: PassCheck | None = None) -> str:
    """What the running configuration guarantees about repeatable outputs; `passes` as
    `backend.pass_check` found them (None: not checked)."""
    if not settings.deterministic:
        return "fast mode: outputs may differ slightly with batch neighbours and cache hits"
    exact = "deterministic: batching, prefix reuse and candidate clones are bit-exact"
    recomputed = f"{exact} (generated tokens are reused only once recomputed as a prompt chunk)"
    if passes is None:
        return (
            f"{recomputed}; speculative verification is exact at least up to near-ties (not "
            "checked for this model)"
        )
    checked = "checked for this model, build and CPU"
    if passes.exact:
        return (
            f"{exact}, and a row's logits do not depend on the pass computing it ({checked}): "
            "generated tokens are reused as computed, and speculative verification is exact too"
        )
    cap = passes.draft_cap
    if cap is not None:
        return (
            f"{recomputed}; speculative verification is exact in passes of up to {cap + 1} "
            f"tokens, a draft of at most {cap} verified ({checked}); larger passes (several "
            "sequences verifying drafts together, prompt chunks) may differ at near-ties"
        )
    return f"{recomputed}; speculative verification is exact only up to near-ties ({checked})"
