"""The selection hook's contract: `final=False` after each finished candidate may stop the
others, which end unfinished; `final=True` chooses what is returned."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

import pytest
from installed_plugins import InstalledPlugins
from litestar import Litestar
from litestar.testing import TestClient

from reame_core.engine.engine import Engine
from reame_core.errors import RequestError
from reame_core.plugins import PluginHost
from reame_core.request import Event, GenerationRequest, SamplingParams, TokenEvent

MakeEngine = Callable[..., Engine]
Serve = Callable[[PluginHost], TestClient[Litestar]]


def test_stop_others_ends_the_unfinished_candidates_at_once(
    install_plugins: InstalledPlugins, make_engine: MakeEngine
) -> None:
    def request() -> GenerationRequest:
        # Candidate i samples with seed 5 + i: with these, candidate 0 ends first.
        return GenerationRequest(
            [1, 2, 3], SamplingParams(max_tokens=60, temperature=1.0, seed=5), n=3
        )

    free = make_engine(PluginHost(discover=False), eos_every=6).generate(request())
    voted_on = make_engine(install_plugins("first_finisher", "lifecycle"), eos_every=6)
    chosen = request()

    finish = voted_on.generate(chosen)

    lengths = sorted((len(r.tokens), r.candidate) for r in free.candidates)
    first = lengths[0][1]
    assert lengths[0][0] < lengths[1][0], "the candidates must not finish together"
    assert [r.candidate for r in finish.candidates] == [first]
    assert finish.candidates[0].tokens == free.candidates[first].tokens
    calls = install_plugins.module("first_finisher").calls
    assert calls == [False, True]
    finished = {
        int(e[2]): e[3] for e in install_plugins.module("lifecycle").events if e[0] == "finished"
    }
    stopped = [c for c in range(3) if c != first]
    assert finished[first] in ("stop", "length")
    assert {finished[c] for c in stopped} == {"abandoned"}
    # The others were cut short: each is a strict prefix of what it would have generated.
    by_candidate = {
        int(e[2]): e[4] for e in install_plugins.module("lifecycle").events if e[0] == "finished"
    }
    for c in stopped:
        full = free.candidates[c].text
        assert full.startswith(by_candidate[c]) and len(by_candidate[c]) < len(full)


def test_best_of_runs_n_candidates_streams_nothing_before_choosing_and_returns_the_likeliest(
    install_plugins: InstalledPlugins, make_engine: MakeEngine
) -> None:
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=7, ignore_eos=True)
    logprob_sums = [0.0, 0.0, 0.0]

    def add_up(event: TokenEvent) -> None:
        logprob_sums[event.candidate] += sum(item.logprob for item in event.logprobs)

    free = make_engine(PluginHost(discover=False)).generate(
        GenerationRequest([1, 2, 3], dataclasses.replace(params, logprobs=0), n=3), add_up
    )
    engine = make_engine(install_plugins("best_of"))
    events: list[Event] = []

    finish = engine.generate(
        GenerationRequest([1, 2, 3], params, extensions={"best_of": 3}), events.append
    )

    likeliest = max(range(3), key=lambda c: logprob_sums[c])
    (result,) = finish.candidates
    assert result.candidate == 0
    assert result.tokens == free.candidates[likeliest].tokens
    assert events == [TokenEvent(0, result.tokens, result.text)]


def test_best_of_streams_one_choice_through_the_api(
    install_plugins: InstalledPlugins, serve: Serve
) -> None:
    client = serve(install_plugins("best_of"))
    body = {"prompt": "Hi", "max_tokens": 6, "temperature": 1.0, "best_of": 3, "stream": True}

    reply = client.post("/v1/completions", json=body)

    chunks = [
        json.loads(line[len("data: ") :])
        for line in reply.text.splitlines()
        if line.startswith("data: {")
    ]
    indexes = {choice["index"] for chunk in chunks for choice in chunk["choices"]}
    assert reply.status_code == 200 and indexes == {0}


def test_per_step_selection_can_end_the_race_before_any_candidate_finishes(
    install_plugins: InstalledPlugins, make_engine: MakeEngine
) -> None:
    engine = make_engine(install_plugins("step_race", "lifecycle"))
    params = SamplingParams(max_tokens=20, temperature=1.0, seed=2, ignore_eos=True)

    finish = engine.generate(GenerationRequest([1, 2, 3], params, n=3))

    race = install_plugins.module("step_race")
    steps = [counts for final, counts in race.seen if not final]
    assert steps == [(k, k, k) for k in range(1, race.RACE_TOKENS + 1)]
    assert race.seen[-1][0] is True
    (kept,) = race.kept.values()
    assert [(r.candidate, len(r.tokens)) for r in finish.candidates] == [(kept, 20)]
    finished = {
        int(e[2]): e[3] for e in install_plugins.module("lifecycle").events if e[0] == "finished"
    }
    assert finished == {c: "length" if c == kept else "abandoned" for c in range(3)}


def test_a_request_waiting_for_many_slots_lets_smaller_ones_pass_but_not_forever(
    install_plugins: InstalledPlugins, make_engine: MakeEngine
) -> None:
    engine = make_engine(PluginHost(discover=False), start=False, n_seq_max=4)
    started: dict[str, int] = {}
    step = 0

    def submit(n: int, max_tokens: int) -> str:
        request = GenerationRequest([1, 2, 3], SamplingParams(max_tokens, ignore_eos=True), n=n)
        engine.submit(request, lambda event: started.setdefault(request.request_id, step))
        return request.request_id

    long = submit(2, 40)
    wide = submit(4, 4)  # needs every slot: waits for `long`
    small = [submit(1, 3)]
    while wide not in started:
        step += 1
        assert step < 200, "the wide request starved"
        engine.step()
        small.append(submit(1, 3))  # a stream of small requests keeps arriving
    overtook = [rid for rid in small if rid in started and started[rid] < started[wide]]
    assert started[long] == 1
    assert 1 <= len(overtook) <= 4  # smaller requests passed it, at most n_seq_max of them
    while engine.busy:
        engine.step()


def test_a_plan_wider_than_the_servers_slots_is_refused_at_submit(
    install_plugins: InstalledPlugins, make_engine: MakeEngine
) -> None:
    engine = make_engine(install_plugins("best_of"), n_seq_max=4)

    with pytest.raises(RequestError, match="5 candidates"):
        engine.submit(GenerationRequest([1, 2, 3], extensions={"best_of": 5}), lambda e: None)


def test_later_candidates_start_when_selection_asks_with_the_prompt_computed_once(
    install_plugins: InstalledPlugins, make_engine: MakeEngine
) -> None:
    params = SamplingParams(max_tokens=9, temperature=1.0, seed=21, ignore_eos=True)
    engine = make_engine(install_plugins("waves", "lifecycle"), n_seq_max=4)

    finish = engine.generate(GenerationRequest([1, 2, 3, 4], params, extensions={"waves": [5, 2]}))

    events = install_plugins.module("lifecycle").events
    order = [(e[0], int(e[2])) for e in events if e[0] in ("started", "finished")]
    assert order == [
        ("started", 0), ("started", 1), ("finished", 0), ("finished", 1),
        ("started", 2), ("started", 3), ("finished", 2), ("finished", 3),
        ("started", 4), ("finished", 4),
    ]  # fmt: skip
    assert engine.stats.prefill_tokens == 4
    assert finish.report == {"waves": {"ran": 5}}
    views = install_plugins.module("waves").views
    alone = make_engine(PluginHost(discover=False))
    for view in views:  # each later candidate decoded from the restored prompt KV
        seed = dataclasses.replace(params, seed=21 + view.candidate)
        assert (
            view.tokens
            == alone.generate(GenerationRequest([1, 2, 3, 4], seed)).candidates[0].tokens
        )


def test_the_final_selections_report_is_a_field_of_the_response(
    install_plugins: InstalledPlugins, serve: Serve
) -> None:
    client = serve(install_plugins("waves"))
    body = {"prompt": "Hi", "max_tokens": 4, "waves": [3, 3]}

    reply = client.post("/v1/completions", json=body)

    assert reply.status_code == 200
    assert reply.json()["waves"] == {"ran": 3}
    assert len(reply.json()["choices"]) == 1
