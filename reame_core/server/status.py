"""`GET /status`: what the server runs on, what it is doing, and what it has saved since it
started, in one JSON body.

The web page's status view polls it; scripts may too. It reads what the engine, the
governor and the plugins already count (as `/metrics` and `/speculation` do) and holds no
state of its own: a chart over time is the reader's to keep.
"""

from __future__ import annotations

from typing import Any

from litestar import get
from litestar.datastructures import State

from reame_core.autoconfig.facts import read_host_facts
from reame_core.runtime import Runtime, determinism_note
from reame_core.server.service import ServerState


@get("/status")
async def status(state: State) -> dict[str, Any]:
    server: ServerState = state.server
    return status_report(server, server.ready())


def status_report(server: ServerState, runtime: Runtime) -> dict[str, Any]:
    info = runtime.backend.info
    stats = runtime.engine.stats
    speculation = runtime.engine.governor.report()
    facts = read_host_facts(runtime.settings.cache_path)
    plan = runtime.plan
    return {
        "model": {
            "name": info.name,
            "architecture": info.architecture,
            "slots": info.n_seq_max,
            "ctx_per_slot": info.n_ctx_seq,
            "kv_type": info.kv_type,
        },
        "host": {
            "arch": facts.arch,
            "physical_cores": facts.physical_cores,
            "logical_cpus": facts.logical_cpus,
            "memory_total": facts.memory_total,
            "memory_available": facts.memory_available,
            "disk_free": facts.disk_free,
            "disk_path": str(facts.disk_path),
        },
        # `reame config`'s rows: each setting with its value and why it was chosen.
        "configuration": [] if plan is None else [list(row) for row in plan.explain()],
        "warnings": [] if plan is None else list(plan.warnings),
        "guarantees": determinism_note(runtime.settings, runtime.passes),
        "load": {
            "slots_busy": stats.active_sequences,
            "queued": stats.waiting_requests,
            "in_flight": server.in_flight,
            "max_queue": runtime.settings.max_queue,
        },
        "tokens": {
            "prompt": stats.prompt_tokens,
            "computed": stats.prefill_tokens,
            "reused": stats.reused_tokens,
            "restored": stats.restored_tokens,
            "generated": stats.generated_tokens,
            "drafted": sum(row["proposed"] for row in speculation["sources"]),
            "accepted": sum(row["accepted"] for row in speculation["sources"]),
        },
        "requests": {
            "submitted": stats.requests_submitted,
            "finished": stats.requests_finished,
            "recalled": stats.recalled_requests,
        },
        "speculation": speculation,
        "plugins": plugin_counters(runtime),
        # The request fields enabled plugins handle: what the page may offer (a JSON
        # schema box for `response_format`, a best-of slider for `best_of`).
        "request_fields": sorted(runtime.request_extensions),
    }


def plugin_counters(runtime: Runtime) -> dict[str, dict[str, Any]]:
    """The plugins' counters by group (hook `reame_collect_stats`), as `/metrics` reads them."""
    groups: dict[str, dict[str, Any]] = {}
    for result in runtime.plugins.hook.reame_collect_stats() or ():
        for group, counters in (result or {}).items():
            groups.setdefault(group, {}).update(counters)
    return groups
