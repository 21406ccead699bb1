"""The realistic workload: one office's day of requests, and what a replay of it is worth.

`data/trace.jsonl` (written by the repository's benchmarks/data/make_trace.py, seeded) holds
back-office clients extracting documents into one JSON schema behind one long shared system
prompt, chat sessions of three turns, rewrites of supplied prose and code, and a nightly
batch that sends earlier requests again byte for byte. Each line is one request: ``id``,
``kind``, ``at`` (seconds from the start of the day, or of the night for a rerun) and the
``body`` sent as is; a chat turn carries ``session``, ``system``, ``user`` and ``think``
(seconds after the previous answer) instead of messages.

`sliced` scales the day down for small hosts and `--quick`; `check`, `useful_text` and
`summary` turn a replay's outcomes (`replay.Outcome`) into its figures. Sending is
`replay.py`'s; this module does no I/O but reading the trace.
"""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reame_core.bench.schema_check import is_valid

if TYPE_CHECKING:
    from reame_core.bench.replay import Outcome

TRACE = Path(__file__).parent / "data" / "trace.jsonl"
SLICE_SEED = 15
# Arrivals on the trace's clock are one a second; `reame bench` replays them four times as
# fast, so that the server, not the arrivals, sets the completion time on a small host.
BENCH_PACE = 0.25

Request = dict[str, Any]
Count = Callable[[str], int]  # tokens in a text, by the model's tokenizer


def load_trace(path: Path = TRACE) -> list[Request]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _units(trace: Sequence[Request]) -> dict[str, list[Request]]:
    """The requests that go together, by the id of the first: a chat session's turns, or a
    request and the reruns of it."""
    units: dict[str, list[Request]] = {}
    first_of_session: dict[str, str] = {}
    for request in trace:
        if request["kind"] == "rerun":
            units[request["rerun_of"]].append(request)
        elif request["kind"] == "chat":
            key = first_of_session.setdefault(request["session"], request["id"])
            units.setdefault(key, []).append(request)
        else:
            units[request["id"]] = [request]
    return units


def sliced(trace: Sequence[Request], requests: int, seed: int = SLICE_SEED) -> list[Request]:
    """About `requests` requests of the trace, keeping its mix: whole chat sessions and
    requests with their reruns, taken in turn from each kind (in a seeded order that puts
    those rerun at night first, so a small slice still has a night), with the day's and the
    night's arrivals compressed in proportion so that they keep the trace's rate."""
    if requests >= len(trace):
        return list(trace)
    rng = random.Random(seed)
    by_kind: dict[str, list[list[Request]]] = {}
    for unit in _units(trace).values():
        by_kind.setdefault(unit[0]["kind"], []).append(unit)
    for units in by_kind.values():
        rng.shuffle(units)
        units.sort(key=lambda unit: unit[-1]["kind"] != "rerun")
    kept: set[str] = set()
    while len(kept) < requests and any(by_kind.values()):
        for units in by_kind.values():
            if units and len(kept) < requests:
                kept.update(request["id"] for request in units.pop(0))
    chosen = [dict(request) for request in trace if request["id"] in kept]
    for night in (False, True):
        timed = [r for r in trace if r["at"] is not None and (r["kind"] == "rerun") == night]
        share = sum(r["id"] in kept for r in timed) / max(1, len(timed))
        for request in chosen:
            if request["at"] is not None and (request["kind"] == "rerun") == night:
                request["at"] = round(request["at"] * share, 3)
    return chosen


def trace_for(requests: int, max_tokens: int) -> list[Request]:
    """The shipped trace, `sliced` to `requests`, no answer allowed more than `max_tokens`
    (a rerun keeps the body of the request it repeats)."""
    chosen = sliced(load_trace(), requests)
    for request in chosen:
        request["body"] = {**request["body"]}
        request["body"]["max_tokens"] = min(request["body"]["max_tokens"], max_tokens)
    return chosen


def check(outcomes: Sequence[Outcome], trace: Sequence[Request]) -> None:
    """Parse every structured answer and validate it against its request's own schema
    (sets each outcome's `valid`)."""
    schemas = {
        request["id"]: request["body"]["response_format"]["json_schema"]["schema"]
        for request in trace
        if "response_format" in request.get("body", {})
    }
    for outcome in outcomes:
        schema = schemas.get(outcome.id)
        if schema is None:
            continue
        try:
            outcome.valid = is_valid(json.loads(outcome.content), schema)
        except ValueError:  # not JSON
            outcome.valid = False


def useful_text(outcome: Outcome) -> str:
    """What the answer is worth to its client: a structured answer as compact JSON (the
    whitespace a server lets the model choose is nobody's output), an invalid one nothing."""
    if outcome.valid is None:
        return outcome.content if outcome.error is None else ""
    if not outcome.valid:
        return ""
    return json.dumps(json.loads(outcome.content), separators=(",", ":"), ensure_ascii=False)


@contextmanager
def token_counter(model_path: str | Path) -> Iterator[Count]:
    """The model's tokenizer alone (no weights), to count every server's answers alike."""
    import llama_cpp

    llm = llama_cpp.Llama(str(model_path), vocab_only=True, verbose=False)
    try:
        yield lambda text: len(llm.tokenize(text.encode(), add_bos=False, special=False))
    finally:
        llm.close()


def percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def summary(outcomes: Sequence[Outcome], count: Count) -> dict[str, Any]:
    """One replay's figures: completion time (first request sent to last answer in), useful
    output per second, time to first token and latency p50/p95, answers valid."""
    finished = [o for o in outcomes if o.error is None] or list(outcomes)
    end = max(o.sent + o.latency for o in outcomes)
    useful = sum(count(useful_text(o)) for o in outcomes)
    checked = [o for o in outcomes if o.valid is not None]
    by_kind: dict[str, list[float]] = {}
    for outcome in finished:
        by_kind.setdefault(outcome.kind, []).append(outcome.latency)
    reasons: dict[str, int] = {}
    for outcome in outcomes:
        reason = outcome.finish_reason or "none"
        reasons[reason] = reasons.get(reason, 0) + 1
    return {
        "requests": len(outcomes),
        "completion_s": round(end, 2),
        "useful_tokens": useful,
        "useful_tok_s": round(useful / end, 2) if end > 0 else 0.0,
        "completion_tokens": sum(int(o.usage.get("completion_tokens", 0)) for o in outcomes),
        "cached_prompt_tokens": sum(
            int((o.usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
            for o in outcomes
        ),
        "prompt_tokens": sum(int(o.usage.get("prompt_tokens", 0)) for o in outcomes),
        # What the server says it computed (llama-server's `timings` names, which Reame
        # shares): prompt tokens not taken from a cache, output tokens not recalled.
        "computed_prompt_tokens": sum(int(o.timings.get("prompt_n", 0)) for o in outcomes),
        "decoded_tokens": sum(int(o.timings.get("predicted_n", 0)) for o in outcomes),
        "ttft_p50_s": round(statistics.median(o.ttft for o in finished), 3),
        "ttft_p95_s": round(percentile([o.ttft for o in finished], 0.95), 3),
        "latency_p50_s": round(statistics.median(o.latency for o in finished), 3),
        "latency_p95_s": round(percentile([o.latency for o in finished], 0.95), 3),
        "mean_latency_by_kind_s": {k: round(statistics.mean(v), 2) for k, v in by_kind.items()},
        "valid": sum(bool(o.valid) for o in checked),
        "structured": len(checked),
        "errors": [f"{o.id}: {o.error}" for o in outcomes if o.error is not None],
        "finish_reasons": dict(sorted(reasons.items())),
    }
