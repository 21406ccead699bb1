from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from conclave_testing import Voting
from litestar import Litestar
from litestar.testing import TestClient
from pydantic import ValidationError

from reame_conclave.cli import vote_options
from reame_conclave.plugin import Conclave
from reame_core.backend.fake import FakeBackend
from reame_core.errors import RequestError
from reame_core.plugins import PluginHost
from reame_core.request import FinishEvent, GenerationRequest, SamplingParams
from reame_core.settings import Settings

MakeVoting = Callable[..., Voting]
Serve = Callable[[], TestClient[Litestar]]
PROMPT = [1, 72, 105, 33]


def ask(
    best_of: int | None = None,
    *,
    n: int = 1,
    seed: int = 11,
    max_tokens: int = 30,
    temperature: float | None = None,
    **vote: Any,
) -> GenerationRequest:
    extensions: dict[str, Any] = {} if best_of is None else {"best_of": best_of}
    if vote:
        extensions["vote"] = vote
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature or 0.7, seed=seed)
    unset = frozenset({"temperature"}) if temperature is None else frozenset()
    return GenerationRequest(PROMPT, params, n, extensions, unset=unset)


def conclave_report(finish: FinishEvent) -> dict[str, Any]:
    assert finish.error is None, finish.error
    report: dict[str, Any] = dict(finish.report["conclave"])
    return report


# ---------------------------------------------------------------- the plugin


def test_conclave_is_discovered_through_its_entry_point() -> None:
    records = {record.name: record for record in PluginHost().records()}
    record = records["conclave"]
    assert record.enabled
    assert record.distribution == "reame-conclave"
    assert {"reame_plan_candidates", "reame_select_candidates"} <= set(record.hooks)
    assert "best-of-N voting" in record.description


def test_conclave_can_be_disabled_per_deployment() -> None:
    record = next(r for r in PluginHost(["conclave"]).records() if r.name == "conclave")
    assert not record.enabled
    assert record.hooks == ()


def test_conclave_refuses_unknown_settings() -> None:
    host = PluginHost(discover=False)
    host.register(Conclave(), "conclave")
    settings = Settings(plugins={"conclave": {"no_such_option": 1}})
    with pytest.raises(ValidationError):
        host.hook.reame_configure(settings=settings, model=FakeBackend().info, hook=host.hook)


@pytest.mark.parametrize(
    ("extensions", "n", "param"),
    [
        ({"best_of": "5"}, 1, "best_of"),
        ({"best_of": True}, 1, "best_of"),
        ({"best_of": 0}, 1, "best_of"),
        ({"best_of": 17}, 1, "best_of"),
        ({"best_of": 2}, 3, "best_of"),
        ({"vote": {"rule": "all"}}, 1, "vote"),
        ({"best_of": 3, "vote": {"rule": "unanimity"}}, 1, "vote.rule"),
        ({"best_of": 3, "vote": {"confidence": 1.5}}, 1, "vote.confidence"),
        ({"best_of": 3, "vote": {"colour": "red"}}, 1, "vote.colour"),
        ({"best_of": 3, "vote": {"answer": "astrology"}}, 1, "vote.answer"),
        ({"best_of": 3, "vote": {"answer": "regex"}}, 1, "vote.pattern"),
        ({"best_of": 3, "vote": {"answer": "regex", "pattern": "("}}, 1, "vote.pattern"),
        ({"best_of": 3, "vote": "majority"}, 1, "vote"),
    ],
)
def test_a_bad_vote_is_refused_naming_the_field(
    voting: MakeVoting, extensions: dict[str, Any], n: int, param: str
) -> None:
    engine = voting().engine
    request = GenerationRequest(PROMPT, SamplingParams(max_tokens=4), n, extensions)

    with pytest.raises(RequestError) as refused:
        engine.check(request)

    assert refused.value.param == param


def test_best_of_one_or_equal_to_n_asks_for_no_vote(voting: MakeVoting) -> None:
    engine = voting().engine
    assert engine.check(ask(1)) is None
    assert engine.check(ask(3, n=3)) is None


# ------------------------------------------------------------------- engine


@pytest.mark.parametrize(("best_of", "wave"), [(4, None), (6, 2)])
def test_candidates_share_one_prefill_and_each_gives_its_seeds_own_tokens(
    voting: MakeVoting, best_of: int, wave: int | None
) -> None:
    # The first wave gets the prompt's KV by copy, later waves from its snapshot.
    run = voting(eos_every=5, n_seq_max=4)
    vote: dict[str, Any] = {"rule": "all", "answer": "length"}
    if wave is not None:
        vote["wave"] = wave
    finish = run.engine.generate(ask(best_of, **vote))

    report = conclave_report(finish)
    assert (report["finished"], report["not_started"]) == (best_of, 0)
    assert run.witness.most_at_once == (wave or best_of)
    assert run.engine.stats.prefill_tokens == len(PROMPT)  # computed once for all
    plain = voting(eos_every=5, n_seq_max=4).engine
    for candidate, ran in run.witness.by_candidate().items():
        alone = plain.generate(ask(seed=11 + candidate, temperature=0.7))
        assert ran.tokens == alone.candidates[0].tokens


def test_a_settled_vote_stops_the_running_candidates_and_frees_their_slots(
    voting: MakeVoting,
) -> None:
    run = voting(eos_every=5, n_seq_max=8)
    # Every text answers "x" (a third party's extractor): four agreeing votes settle it.
    finish = run.engine.generate(ask(8, answer="constant", max_tokens=40, seed=3))

    report = conclave_report(finish)
    assert report["tally"] == {"x": 4}
    assert (report["finished"], report["stopped"], report["not_started"]) == (4, 4, 0)
    assert [ran.reason for ran in run.witness.ran].count("abandoned") == 4
    assert run.engine.slots.free_count() == 8
    assert report["tokens_saved"] >= 0


def test_a_wave_that_settles_the_vote_leaves_the_next_unstarted(voting: MakeVoting) -> None:
    run = voting(eos_every=5, n_seq_max=4)
    # Three agreeing votes give 0.9375 < 0.95: a second wave runs, and its first finisher
    # settles it; the third wave never starts.
    finish = run.engine.generate(ask(9, answer="constant", wave=3))

    report = conclave_report(finish)
    assert report["tally"] == {"x": 4}
    assert report["finished"] == 4
    assert report["stopped"] == 2
    assert report["not_started"] == 3
    assert run.witness.started == 6
    assert report["tokens_saved"] > 0


def test_a_failing_extractor_counts_as_no_answer_and_the_engine_keeps_serving(
    voting: MakeVoting,
) -> None:
    run = voting(eos_every=5, n_seq_max=4)
    finish = run.engine.generate(ask(3, answer="broken"))

    assert conclave_report(finish)["tally"] == {}
    assert run.engine.generate(ask(seed=2, temperature=0.7)).error is None


def test_the_window_rule_stops_a_wave_of_three_that_agrees(voting: MakeVoting) -> None:
    run = voting(eos_every=5, n_seq_max=4)
    finish = run.engine.generate(ask(9, answer="constant", wave=3, rule="window"))

    report = conclave_report(finish)
    assert (report["finished"], report["not_started"]) == (3, 6)


def test_the_winner_is_the_candidate_of_the_most_common_answer(voting: MakeVoting) -> None:
    run = voting(eos_every=4, n_seq_max=6)
    finish = run.engine.generate(ask(6, rule="all", answer="length", max_tokens=12))

    report = conclave_report(finish)
    winner = finish.candidates[0]
    assert winner.finish_reason == "stop"
    assert report["answer"] == str(len(winner.text))
    assert report["tally"][report["answer"]] == max(report["tally"].values())


def test_n_choices_come_from_the_best_answers(voting: MakeVoting) -> None:
    run = voting(eos_every=4, n_seq_max=6)
    finish = run.engine.generate(ask(6, n=2, rule="all", answer="length", max_tokens=12))

    assert len(finish.candidates) == 2
    assert [c.candidate for c in finish.candidates] == [0, 1]  # numbered as choices


def test_the_plan_temperature_applies_only_when_the_request_sets_none(
    voting: MakeVoting,
) -> None:
    run = voting({"temperature": 0.4}, eos_every=4)
    run.engine.generate(ask(3, rule="all"))
    assert {ran.temperature for ran in run.witness.ran} == {0.4}

    run.witness.ran.clear()
    run.engine.generate(ask(3, rule="all", temperature=1.2))
    assert {ran.temperature for ran in run.witness.ran} == {1.2}


def test_a_wide_vote_and_small_requests_queued_behind_it_are_all_served(
    voting: MakeVoting,
) -> None:
    run = voting(eos_every=5, n_seq_max=4, step_cost_s=0.001)
    results: dict[str, FinishEvent] = {}

    def generate(name: str, request: GenerationRequest) -> None:
        results[name] = run.engine.generate(request)

    threads = [threading.Thread(target=generate, args=("wide", ask(16, rule="all", wave=2)))]
    threads += [
        threading.Thread(target=generate, args=(f"small{i}", ask(seed=i, temperature=0.7)))
        for i in range(5)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert sorted(results) == ["small0", "small1", "small2", "small3", "small4", "wide"]
    assert all(finish.error is None for finish in results.values())
    assert conclave_report(results["wide"])["finished"] == 16
    assert run.witness.most_at_once <= 4


def test_requests_queued_behind_a_vote_start_before_its_next_wave(voting: MakeVoting) -> None:
    # The first wave's candidates all end in one step (at max_tokens), freeing every slot.
    run = voting(n_seq_max=4, step_cost_s=0.002)
    wide = ask(8, rule="all", max_tokens=40)
    finished: list[str] = []
    all_done = threading.Semaphore(0)

    def done(request: GenerationRequest) -> Callable[[Any], None]:
        def emit(event: Any) -> None:
            if isinstance(event, FinishEvent):
                finished.append(request.request_id)
                all_done.release()

        return emit

    run.engine.submit(wide, done(wide))
    while run.witness.started < 4:  # the first wave holds every slot
        threading.Event().wait(0.002)
    small = [ask(seed=i, temperature=0.7, max_tokens=3) for i in range(3)]
    for request in small:
        run.engine.submit(request, done(request))
    for _ in range(4):
        assert all_done.acquire(timeout=30)

    # Fewer than n_seq_max of them: each took a slot before the second wave did, so each
    # ended long before the wide vote's 40-token second wave.
    assert finished[-1] == wide.request_id
    assert run.witness.started == 11


def test_cancelling_a_vote_ends_every_candidate_and_starts_no_more(
    voting: MakeVoting,
) -> None:
    run = voting(n_seq_max=4, step_cost_s=0.002)
    done = threading.Event()
    finished: list[FinishEvent] = []

    def emit(event: Any) -> None:
        if isinstance(event, FinishEvent):
            finished.append(event)
            done.set()

    ticket = run.engine.submit(ask(12, rule="all", wave=2, max_tokens=400), emit)
    while run.witness.started < 2:
        threading.Event().wait(0.005)
    ticket.cancel()

    assert done.wait(10)
    assert run.witness.started == 2
    assert {ran.reason for ran in run.witness.ran} == {"cancelled"}
    assert run.engine.slots.free_count() == 4


def test_stats_count_votes_stops_and_tokens_saved(voting: MakeVoting) -> None:
    run = voting(eos_every=5, n_seq_max=8)
    run.engine.generate(ask(8, answer="constant", max_tokens=40, seed=3))

    stats = run.conclave.reame_collect_stats()["conclave"]
    assert stats["requests"] == 1
    assert stats["stopped_early"] == 1
    assert stats["candidates_stopped"] == 4


# --------------------------------------------------------------------- API


def test_completions_return_the_winner_and_the_tally(serve: Serve) -> None:
    client = serve()
    body = {"prompt": "Vote.", "max_tokens": 8, "best_of": 5, "seed": 1}

    response = client.post("/v1/completions", json=body)

    assert response.status_code == 200, response.text
    data = response.json()
    assert len(data["choices"]) == 1
    report = data["conclave"]
    assert report["candidates"] == 5
    assert report["finished"] + report["stopped"] + report["not_started"] == 5
    assert sum(report["tally"].values()) <= report["finished"]  # cut off: no answer, no vote
    assert data["timings"]["prompt_n"] == data["usage"]["prompt_tokens"]


def test_chat_takes_best_of_as_an_extension(serve: Serve) -> None:
    client = serve()
    body = {
        "messages": [{"role": "user", "content": "Vote."}],
        "max_tokens": 8,
        "best_of": 3,
        "vote": {"rule": "all", "answer": "text"},
    }

    response = client.post("/v1/chat/completions", json=body)

    assert response.status_code == 200, response.text
    assert response.json()["conclave"]["finished"] == 3


def test_a_streamed_vote_sends_the_winner_once_decided_with_the_tally(serve: Serve) -> None:
    client = serve()
    body = {"prompt": "Vote.", "max_tokens": 8, "best_of": 3, "seed": 4, "stream": True}
    plain = client.post("/v1/completions", json={**body, "stream": False}).json()

    with client.stream("POST", "/v1/completions", json=body) as response:
        chunks = [
            json.loads(line[len("data: ") :])
            for line in response.iter_lines()
            if line.startswith("data: ") and line != "data: [DONE]"
        ]

    texts = [c["choices"][0]["text"] for c in chunks if c["choices"] and c["choices"][0]["text"]]
    assert texts == [plain["choices"][0]["text"]]  # one piece, the same winner
    assert {c["choices"][0]["index"] for c in chunks if c["choices"]} == {0}
    assert chunks[-1]["conclave"] == plain["conclave"]


def test_the_api_refuses_a_bad_vote_with_a_400_naming_the_field(serve: Serve) -> None:
    client = serve()
    body = {"prompt": "Vote.", "best_of": 3, "vote": {"rule": "unanimity"}}

    response = client.post("/v1/completions", json=body)

    assert response.status_code == 400
    assert response.json()["error"]["param"] == "vote.rule"
    assert client.get("/health").status_code == 200


# --------------------------------------------------------------------- CLI


def test_vote_options_read_key_value_pairs_with_numbers() -> None:
    assert vote_options("answer=number,rule=window,window=4,confidence=0.9") == {
        "answer": "number",
        "rule": "window",
        "window": 4,
        "confidence": 0.9,
    }


def test_reame_run_takes_best_of_and_vote_as_request_fields() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    PluginHost().hook.reame_add_request_options(parser=parser)
    options = parser.parse_args(["--best-of", "5", "--vote", "rule=all"])

    assert vars(options)["extensions.best_of"] == 5
    assert vars(options)["extensions.vote"] == {"rule": "all"}


def test_a_candidate_cut_off_after_its_answer_line_votes_with_it() -> None:
    from reame_core.hooktypes import CandidateView

    conclave = Conclave()
    views = [
        CandidateView(0, (1, 2), "7 + 5 = 12.\nAnswer: 12\nAlso", "length", -1.0),
        CandidateView(1, (1, 2), "7 + 5 = 12, so 13", "length", -1.0),
        CandidateView(2, (1, 2), "Answer: 12", "stop", -1.0),
    ]
    request = GenerationRequest(PROMPT, SamplingParams(), extensions={"best_of": 3})

    selection = conclave.reame_select_candidates(request=request, candidates=views, final=True)

    assert selection is not None
    assert selection.report["conclave"]["tally"] == {"12": 2}
