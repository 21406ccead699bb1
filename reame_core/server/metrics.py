"""Prometheus metrics, names prefixed ``reame_``.

Request-level measurements (status, time to first token, inter-token latency) are recorded
by the API as they happen; engine and plugin counters are read from the engine at scrape
time by `EngineCollector`, so the engine thread never waits on the metrics code.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from reame_core.hooktypes import DISK_FAULTS

if TYPE_CHECKING:
    from reame_core.runtime import Runtime
    from reame_core.server.service import ServerState

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ServerMetrics:
    def __init__(self, state: ServerState) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "reame_requests",
            "HTTP requests by route and status",
            ["route", "status"],
            registry=self.registry,
        )
        self.time_to_first_token = Histogram(
            "reame_time_to_first_token_seconds",
            "Time from request to first token",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.inter_token_latency = Histogram(
            "reame_inter_token_latency_seconds",
            "Time between streamed token events",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(EngineCollector(state))

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))


class EngineCollector(Collector):
    def __init__(self, state: ServerState) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        runtime = self._state.runtime
        if runtime is None:
            return
        stats = runtime.engine.stats
        prompt = CounterMetricFamily(
            "reame_prompt_tokens", "Prompt tokens by how they were obtained", labels=["kind"]
        )
        prompt.add_metric(["computed"], stats.prefill_tokens)
        prompt.add_metric(["reused"], stats.reused_tokens)
        prompt.add_metric(["restored"], stats.restored_tokens)
        yield prompt
        yield _counter("reame_completion_tokens", "Tokens generated", stats.generated_tokens)
        yield _counter(
            "reame_recalled_requests",
            "Requests answered from a remembered answer, not computed",
            stats.recalled_requests,
        )
        yield _counter("reame_decode_steps", "Decode steps (one batch each)", stats.decode_steps)
        yield _counter("reame_batch_tokens", "Tokens decoded across all steps", stats.batch_tokens)
        yield _counter(
            "reame_filler_rows",
            "Throwaway rows that joined the decoding sequences into fewer passes",
            stats.filler_rows,
        )
        yield _counter("reame_decode_seconds", "Time spent in decode", stats.decode_seconds)
        yield _counter(
            "reame_prefix_waits",
            "Requests that waited for a prefix another process was computing, not computing it",
            stats.prefix_waits,
        )
        yield _counter(
            "reame_prefix_wait_seconds",
            "Time requests spent waiting for a prefix another process was computing",
            stats.prefix_wait_seconds,
        )
        yield _counter("reame_decode_errors", "Decode steps that failed", stats.decode_errors)
        yield _gauge("reame_queue_depth", "Requests waiting for a slot", stats.waiting_requests)
        yield _gauge(
            "reame_active_sequences", "Sequences prefilling or decoding", stats.active_sequences
        )
        yield _gauge(
            "reame_requests_in_flight", "Requests accepted and not finished", self._state.in_flight
        )
        yield from _model_server_protocol(runtime)
        share = runtime.engine.cpu_share
        if share is not None and share.active:
            yield _gauge("reame_decode_threads", "Threads decoding now", share.threads)
            yield _gauge(
                "reame_neighbour_cores",
                "CPU taken from this process's cores by other processes and steal, in cores",
                share.others,
            )
            yield _counter(
                "reame_decode_thread_changes", "Times contention changed the threads", share.changes
            )
        proposed = CounterMetricFamily(
            "reame_draft_tokens_proposed", "Draft tokens verified, by source", labels=["source"]
        )
        accepted = CounterMetricFamily(
            "reame_draft_tokens_accepted", "Draft tokens accepted, by source", labels=["source"]
        )
        enabled = GaugeMetricFamily(
            "reame_draft_source_enabled",
            "Whether the source's drafts pay over all requests (1), or are verified only "
            "where a request's own drafts do (0)",
            labels=["source"],
        )
        length = GaugeMetricFamily(
            "reame_draft_source_tokens",
            "Length of the source's last verified draft",
            labels=["source"],
        )
        for row in runtime.engine.governor.report()["sources"]:
            proposed.add_metric([row["source"]], row["proposed"])
            accepted.add_metric([row["source"]], row["accepted"])
            enabled.add_metric([row["source"]], float(row["enabled"]))
            length.add_metric([row["source"]], float(row["k"]))
        yield from (proposed, accepted, enabled, length)
        faults = CounterMetricFamily(
            "reame_disk_faults",
            "Faults plugins' disk stores detected and worked around, by store and kind",
            labels=["store", "kind"],
        )
        for result in runtime.plugins.hook.reame_collect_stats() or ():
            for group, counters in (result or {}).items():
                if group == DISK_FAULTS:
                    for store, kinds in counters.items():
                        for kind, value in kinds.items():
                            faults.add_metric([store, kind], float(value))
                    continue
                for name, value in counters.items():
                    yield _gauge(f"reame_{group}_{name}", f"{group}: {name}", value)
        yield faults


def _model_server_protocol(runtime: Runtime) -> Iterator[Metric]:
    """The gauges an inference gateway's endpoint picker scrapes (Gateway API Inference
    Extension, model server protocol: TotalQueuedRequests, TotalRunningRequests,
    KVCacheUtilization), named as vLLM names them, with Reame's prefix."""
    stats = runtime.engine.stats
    yield _gauge("reame_num_requests_waiting", "Requests queued for a slot", stats.waiting_requests)
    yield _gauge(
        "reame_num_requests_running", "Sequences in a slot (prefill or decode)",
        stats.active_sequences,
    )  # fmt: skip
    info = runtime.backend.info
    held = sum(len(slot.tokens) for slot in runtime.engine.slots.slots if slot.busy)
    yield _gauge(
        "reame_kv_cache_usage_perc",
        "Share of the KV cache's cells held by running sequences (0 to 1)",
        held / max(1, info.n_seq_max * info.n_ctx_seq),
    )


def _counter(name: str, documentation: str, value: Any) -> Metric:
    return CounterMetricFamily(name, documentation, value=float(value))


def _gauge(name: str, documentation: str, value: Any) -> Metric:
    return GaugeMetricFamily(name, documentation, value=float(value))
