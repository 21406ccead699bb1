"""The replayed workload's generator (benchmarks/data/make_trace.py): seeded, with the mix
of requests it promises, and the trace the package ships is the one it writes."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data"
SHIPPED = Path(__file__).resolve().parents[2] / "reame_core" / "bench" / "data" / "trace.jsonl"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_trace", DATA / "make_trace.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_trace = _generator().make_trace


def test_the_same_seed_gives_the_same_trace() -> None:
    assert make_trace(7) == make_trace(7)


def test_another_seed_gives_other_arrivals() -> None:
    assert [r["at"] for r in make_trace(7)] != [r["at"] for r in make_trace(8)]


def test_the_shipped_trace_is_what_the_generator_writes() -> None:
    committed = [json.loads(line) for line in SHIPPED.read_text().splitlines()]
    assert committed == make_trace()


def test_the_mix_of_requests() -> None:
    trace = make_trace()
    kinds = Counter(r["kind"] for r in trace)
    assert kinds == {"extract": 15, "chat": 9, "rewrite": 6, "rerun": 8}
    assert Counter(r["client"] for r in trace if r["kind"] == "extract") == {
        "billing": 5, "helpdesk": 5, "logistics": 5,
    }  # fmt: skip
    assert [r["id"] for r in trace] == [f"r{i:02d}" for i in range(len(trace))]


def test_extractions_share_one_long_system_prompt_and_ask_for_the_schema() -> None:
    extractions = [r["body"] for r in make_trace() if r["kind"] == "extract"]
    systems = {body["messages"][0]["content"] for body in extractions}
    assert len(systems) == 1 and len(systems.pop()) > 2000
    assert len({body["messages"][1]["content"] for body in extractions}) == len(extractions)
    assert all(body["response_format"]["type"] == "json_schema" for body in extractions)


def test_chat_sessions_take_their_turns_in_order() -> None:
    chats: dict[str, list[dict[str, Any]]] = {}
    for request in make_trace():
        if request["kind"] == "chat":
            chats.setdefault(request["session"], []).append(request)
    assert len(chats) == 3
    for turns in chats.values():
        assert [t["turn"] for t in turns] == [0, 1, 2]
        assert turns[0]["at"] is not None and turns[0]["think"] == 0
        assert all(t["at"] is None and t["think"] > 0 for t in turns[1:])
        assert "messages" not in turns[0]["body"]


def test_reruns_repeat_earlier_requests_byte_for_byte() -> None:
    trace = make_trace()
    by_id = {r["id"]: r for r in trace}
    reruns = [r for r in trace if r["kind"] == "rerun"]
    assert trace[-len(reruns) :] == reruns  # the night comes after the day
    assert Counter(by_id[r["rerun_of"]]["kind"] for r in reruns) == {"extract": 6, "rewrite": 2}
    assert len({r["rerun_of"] for r in reruns}) == len(reruns)
    for rerun in reruns:
        assert json.dumps(rerun["body"]) == json.dumps(by_id[rerun["rerun_of"]]["body"])


def test_arrivals_move_forward_within_the_day_and_the_night() -> None:
    trace = make_trace()
    day = [r["at"] for r in trace if r["kind"] != "rerun" and r["at"] is not None]
    night = [r["at"] for r in trace if r["kind"] == "rerun"]
    assert day == sorted(day) and night == sorted(night)
    assert day[0] > 0 and night[0] > 0
