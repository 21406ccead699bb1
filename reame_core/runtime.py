"""Putting a running Reame together: settings -> plugins -> backend -> engine.

The CLI, the server and the benchmarks all start here, so every entry point runs the
same configuration for the same settings.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from reame_core.backend.base import Backend
from reame_core.engine.engine import Engine
from reame_core.models import resolve_model
from reame_core.plugins import PluginHost
from reame_core.settings import Settings

log = structlog.get_logger(__name__)


@dataclass
class Runtime:
    settings: Settings
    plugins: PluginHost
    backend: Backend
    engine: Engine

    def close(self) -> None:
        self.engine.stop()
        self.backend.close()


def load_backend(settings: Settings) -> Backend:
    from reame_core.backend.llama import LlamaBackend

    model = resolve_model(settings.model)
    return LlamaBackend(
        model.path,
        n_ctx_seq=settings.ctx,
        n_seq_max=settings.parallel,
        n_batch=settings.batch,
        n_threads=settings.n_threads,
        deterministic=settings.deterministic,
        name=model.name,
    )


def start_runtime(
    settings: Settings, *, backend: Backend | None = None, plugins: PluginHost | None = None
) -> Runtime:
    plugins = plugins or PluginHost(settings.disable_plugins)
    backend = backend or load_backend(settings)
    plugins.hook.reame_configure(settings=settings, model=backend.info)
    engine = Engine(
        backend,
        plugins,
        prefill_chunk=settings.prefill_chunk,
        draft_max=settings.draft_max,
        speculate=settings.speculate,
        max_sessions=settings.max_sessions,
        exact_reuse=settings.deterministic,
    ).start()
    log.info(
        "engine ready",
        model=backend.info.name,
        slots=backend.info.n_seq_max,
        ctx_per_slot=backend.info.n_ctx_seq,
        threads=settings.n_threads,
        deterministic=settings.deterministic,
        guarantees=determinism_note(backend, settings),
    )
    return Runtime(settings, plugins, backend, engine)


def determinism_note(backend: Backend, settings: Settings) -> str:
    """What the running configuration guarantees about repeatable outputs."""
    if not settings.deterministic:
        return "fast mode: outputs may differ slightly with batch neighbours and cache hits"
    exact = (
        "deterministic: batching, prefix reuse and candidate clones are bit-exact (generated "
        "tokens are reused only once recomputed as a prompt chunk)"
    )
    if backend.info.extra.get("llamafile"):
        return exact + "; speculative verification is exact only up to near-ties on this build"
    return exact + "; speculative verification is exact too"
