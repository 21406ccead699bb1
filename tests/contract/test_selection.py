"""The selection hook's contract: `final=False` after each finished candidate may stop the
others, which end unfinished; `final=True` chooses what is returned."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from installed_plugins import InstalledPlugins

from reame_core.engine.engine import Engine
from reame_core.plugins import PluginHost
from reame_core.request import GenerationRequest, SamplingParams

MakeEngine = Callable[..., Engine]


@pytest.mark.xfail(strict=True, reason="stopped candidates end as if complete")
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
