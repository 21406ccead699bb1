"""`reame bench`'s `trace` workload: the shipped trace, its slices, the replay's timing and
conversation, the answers' validation and worth, and the arms' servers. The server is a
stub or the real app on the fake backend; no figure is asserted."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import pytest
from loopback import serve_on_loopback
from openai_stub import StubOpenAI

from reame_core.backend.fake import FakeBackend
from reame_core.bench.against import Server, normalized
from reame_core.bench.arms import run_trial
from reame_core.bench.replay import SESSION_HEADER, Outcome, replay, replay_sample
from reame_core.bench.schema_check import UncheckedSchema, is_valid
from reame_core.bench.trace import check, load_trace, sliced, summary, trace_for, useful_text
from reame_core.bench.trial import Trial
from reame_core.bench.workloads import BY_NAME, Arm, Size
from reame_core.plugins import PluginHost
from reame_core.settings import Settings

TRACE = load_trace()
SCHEMA = next(r for r in TRACE if r["kind"] == "extract")["body"]["response_format"]["json_schema"][
    "schema"
]
VALID = {
    "document_type": "invoice",
    "title": "Brass burners",
    "organization": "Officina Verdi",
    "contact_name": "Giulia Ferri",
    "date": "14 March 2024",
    "amount": 67.5,
    "currency": "EUR",
    "keywords": ["burner", "wick"],
}


def words(text: str) -> int:
    return len(text.split())


def stub_answer(body: dict[str, Any]) -> str:
    """A valid extraction for a schema request, a few words for any other."""
    return json.dumps(VALID) if "response_format" in body else "one two three"


# ------------------------------------------------------------------ the trace and its slices


def test_the_shipped_trace_has_every_kind_of_request() -> None:
    kinds = Counter(r["kind"] for r in TRACE)
    assert kinds == {"extract": 15, "chat": 9, "rewrite": 6, "rerun": 8}
    assert BY_NAME["trace"].full.requests == len(TRACE)


def test_a_slice_keeps_the_mix_whole_sessions_and_reruns_with_their_originals() -> None:
    part = sliced(TRACE, 9)
    assert 9 <= len(part) <= 11
    kinds = Counter(r["kind"] for r in part)
    assert kinds["extract"] and kinds["rewrite"] and kinds["chat"] and kinds["rerun"]
    ids = {r["id"] for r in part}
    assert all(r["rerun_of"] in ids for r in part if r["kind"] == "rerun")
    sessions = Counter(r["session"] for r in part if r["kind"] == "chat")
    assert all(count == 3 for count in sessions.values())


def test_a_slice_is_the_same_every_time_and_the_whole_trace_is_not_sliced() -> None:
    assert sliced(TRACE, 9) == sliced(TRACE, 9)
    assert sliced(TRACE, len(TRACE)) == TRACE


def test_a_slice_arrives_at_the_traces_rate_not_over_its_whole_day() -> None:
    part = sliced(TRACE, 9)
    day = [r["at"] for r in part if r["at"] is not None and r["kind"] != "rerun"]
    full_day = max(r["at"] for r in TRACE if r["at"] is not None and r["kind"] != "rerun")
    assert day == sorted(day) and max(day) < full_day / 3


def test_answers_are_capped_and_a_rerun_still_repeats_its_request() -> None:
    part = trace_for(9, 50)
    assert all(r["body"]["max_tokens"] <= 50 for r in part)
    by_id = {r["id"]: r for r in part}
    for rerun in (r for r in part if r["kind"] == "rerun"):
        assert rerun["body"] == by_id[rerun["rerun_of"]]["body"]
    assert any(r["body"]["max_tokens"] == 400 for r in load_trace())  # the file is untouched


# ------------------------------------------------------------------ answers


def test_a_complete_extraction_follows_the_schema() -> None:
    assert is_valid(VALID, SCHEMA)


@pytest.mark.parametrize(
    "change",
    [
        {"document_type": "letter"},
        {"amount": "67.5"},
        {"amount": True},
        {"currency": "EURO"},
        {"keywords": []},
        {"keywords": ["a", "b", "c", "d", "e"]},
        {"extra": 1},
    ],
)
def test_an_extraction_that_breaks_a_rule_does_not(change: dict[str, Any]) -> None:
    assert not is_valid({**VALID, **change}, SCHEMA)


def test_a_missing_field_breaks_the_schema() -> None:
    assert not is_valid({k: v for k, v in VALID.items() if k != "title"}, SCHEMA)


def test_a_schema_keyword_that_is_not_checked_is_refused() -> None:
    with pytest.raises(UncheckedSchema, match="pattern"):
        is_valid("x", {"type": "string", "pattern": "^x$"})


def test_structured_answers_are_checked_and_counted_compact_invalid_ones_not_at_all() -> None:
    extract = next(r for r in TRACE if r["kind"] == "extract")
    chat = next(r for r in TRACE if r["kind"] == "chat")
    good = Outcome(extract["id"], "extract", 0.0, content=json.dumps(VALID, indent=4))
    broken = Outcome(extract["id"], "extract", 0.0, content='{"document_type": "inv')
    answer = Outcome(chat["id"], "chat", 0.0, content="Buy flour and yeast.")
    failed = Outcome(chat["id"], "chat", 0.0, content="partial", error="timed out")
    check([good, broken, answer, failed], TRACE)
    assert (good.valid, broken.valid, answer.valid) == (True, False, None)
    assert useful_text(good) == json.dumps(VALID, separators=(",", ":"))
    assert useful_text(broken) == "" and useful_text(failed) == ""
    assert useful_text(answer) == "Buy flour and yeast."


def test_the_summary_counts_completion_ttft_and_valid_answers() -> None:
    outcomes = [
        Outcome("r00", "extract", 0.0, ttft=0.5, latency=2.0, content='"a b"', valid=True),
        Outcome("r01", "extract", 1.0, ttft=1.5, latency=3.0, content="a b c", valid=False),
        Outcome("r02", "chat", 2.0, ttft=0.2, latency=0.5, content="d"),
    ]
    figures = summary(outcomes, words)
    assert figures["completion_s"] == 4.0
    assert figures["useful_tokens"] == 3  # the invalid one is worth nothing
    assert (figures["valid"], figures["structured"]) == (1, 2)
    assert figures["ttft_p50_s"] == 0.5 and figures["ttft_p95_s"] == 1.5


# ------------------------------------------------------------------ the replay


def test_the_replay_sends_each_request_once_and_the_night_after_the_day() -> None:
    part = trace_for(9, 20)
    stub = StubOpenAI(answer=stub_answer)
    with stub.serving() as url:
        outcomes = replay(Server(normalized(url)), part, pace=0.0)
    assert [o.id for o in outcomes] == [r["id"] for r in part]
    assert all(o.error is None and o.finish_reason == "stop" for o in outcomes)
    assert len(stub.bodies) == len(part)
    day_done = max(o.sent + o.latency for o in outcomes if o.kind != "rerun")
    assert any(o.kind == "rerun" for o in outcomes)
    assert all(o.sent >= day_done for o in outcomes if o.kind == "rerun")


def test_the_replay_names_a_fleets_replica_that_answered() -> None:
    part = trace_for(3, 8)
    with StubOpenAI(answer=stub_answer).serving() as url:
        assert {o.replica for o in replay(Server(normalized(url)), part, pace=0.0)} == {""}
    stub = StubOpenAI(answer=stub_answer, reply_headers={"X-Reame-Replica": "replica-a"})
    with stub.serving() as url:
        outcomes = replay(Server(normalized(url)), part, pace=0.0)
    assert {o.replica for o in outcomes} == {"replica-a"}


def test_a_chat_turn_carries_the_conversation_so_far_and_its_session() -> None:
    turns = [r for r in TRACE if r["kind"] == "chat"][:3]
    stub = StubOpenAI(answer=lambda body: f"answer {len(body['messages'])}")
    with stub.serving() as url:
        replay(Server(normalized(url)), turns, pace=0.0)
    last = stub.bodies[-1]["messages"]
    assert [m["role"] for m in last] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert last[2]["content"] == "answer 2" and last[4]["content"] == "answer 4"
    assert last[-1]["content"] == turns[2]["user"]
    assert {h[SESSION_HEADER] for h in stub.headers} == {turns[0]["session"]}


def test_a_replay_sample_reports_useful_tokens_ttft_and_valid_answers() -> None:
    part = trace_for(9, 20)
    with StubOpenAI(answer=stub_answer).serving() as url:
        sample = replay_sample(Server(normalized(url)), part, 0.0, words, compare=True)
    structured = sum("response_format" in r["body"] for r in part)
    assert sample.detail["valid"] == f"{structured} of {structured}"
    assert sample.detail["errors"] == 0
    assert sample.tokens > 0 and sample.value == sample.detail["useful_tok_s"]
    assert {"ttft_p50_s", "ttft_p95_s", "completion_s"} <= set(sample.detail)
    assert sample.outputs is not None


def test_the_replay_keeps_the_servers_timings_and_the_summary_sums_the_work_done() -> None:
    """What a server says it computed (its `timings`) is kept per answer: a trace's work
    floor is priced from it (benchmarks/trace.py)."""
    part = [r for r in TRACE if r["kind"] == "rewrite"][:2]
    asked: list[tuple[list[str], dict[str, str]]] = []
    with fake_reame(asked) as serve, serve([], {}) as server:
        first = replay(server, part, pace=0.0)
        again = replay(server, part, pace=0.0)  # the same prompts: now found in a slot
    for outcome in first:
        assert outcome.error is None
        assert outcome.timings["predicted_n"] == outcome.usage["completion_tokens"] > 0
        cached = outcome.usage["prompt_tokens_details"]["cached_tokens"]
        assert outcome.timings["prompt_n"] + cached == outcome.usage["prompt_tokens"]
    figures = summary(first, words)
    assert figures["decoded_tokens"] == figures["completion_tokens"]
    assert (
        figures["computed_prompt_tokens"] + figures["cached_prompt_tokens"]
        == figures["prompt_tokens"]
    )
    repeated = summary(again, words)
    assert repeated["computed_prompt_tokens"] < repeated["prompt_tokens"]


def test_a_replay_where_every_request_fails_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="every request"):
        replay_sample(Server("http://127.0.0.1:9"), trace_for(3, 8), 0.0, words, compare=False)


# ------------------------------------------------------------------ the arms


def suggeritore() -> object:
    module = pytest.importorskip("reame_suggeritore.plugin")
    return module.Suggeritore()


@contextmanager
def fake_reame(asked: list[tuple[list[str], dict[str, str]]]) -> Iterator[Any]:
    """A `Lab.serve` that records what each arm asked for and serves the real app on the
    fake backend (Il Suggeritore answering the schema)."""

    @contextmanager
    def serve(flags: Sequence[str], env: Mapping[str, str]) -> Iterator[Server]:
        asked.append((list(flags), dict(env)))
        plugins = PluginHost(discover=False)
        plugins.register(suggeritore(), "suggeritore")
        backend = FakeBackend(n_ctx_seq=8192, n_seq_max=4)
        with serve_on_loopback(Settings(), backend=backend, plugins=plugins) as (url, _state):
            yield Server(url)

    yield serve


def run_arm(arm: Arm, scratch: Path, asked: list[tuple[list[str], dict[str, str]]]) -> Any:
    trial = Trial("trace", arm, 0, Size(4, 24), "fake", str(scratch))
    with fake_reame(asked) as serve:
        return run_trial(trial, serve=serve, counter=lambda: nullcontext(words))


def test_the_feature_arm_is_reames_defaults_with_empty_stores_of_its_own(tmp_path: Path) -> None:
    asked: list[tuple[list[str], dict[str, str]]] = []
    sample = run_arm("A", tmp_path, asked)
    ((flags, env),) = asked
    assert flags == ["--speculate", "auto"]
    assert Path(env["REAME_PLUGINS__DISKKV__DIR"]).parent == tmp_path
    assert Path(env["REAME_PLUGINS__PALIMPSEST__DIR"]).parent == tmp_path
    assert sample.detail["requests"] == len(trace_for(4, 24))
    assert sample.detail["errors"] == 0


def test_the_baseline_arm_turns_speculation_the_disk_cache_and_the_archive_off(
    tmp_path: Path,
) -> None:
    asked: list[tuple[list[str], dict[str, str]]] = []
    sample = run_arm("B", tmp_path, asked)
    ((flags, env),) = asked
    assert flags == [
        "--speculate", "off", "--disable-plugin", "diskkv", "--disable-plugin", "palimpsest"
    ]  # fmt: skip
    assert env == {}
    assert sample.detail["errors"] == 0
