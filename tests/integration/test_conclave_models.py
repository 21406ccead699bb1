"""Best-of-N voting on real models: the candidates are the tokens each seed gives alone.

The prompt is computed once; the first wave's candidates get its KV by copy and later
waves by restoring a snapshot. In the deterministic configuration (per-sequence KV,
attention along one path) neither changes a logit, so candidate i must produce exactly the tokens
of seed + i sampled alone — on SmolLM2 and on Gemma 3 270M, whose sliding-window cache
cannot be cut back and so exercises the snapshot on a model that forbids trimming.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from reame_conclave.plugin import Conclave
from reame_core.backend.base import Backend
from reame_core.backend.llama import LlamaBackend
from reame_core.chat import encode_chat
from reame_core.engine.engine import Engine
from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import SequenceView
from reame_core.plugins import PluginHost
from reame_core.request import GenerationRequest, SamplingParams
from reame_core.settings import Settings

MakeEngine = Callable[..., Engine]
QUESTION = "A shop sells 7 lamps on Monday and 5 on Tuesday. How many lamps in total?"


class Recorder:
    def __init__(self) -> None:
        self.tokens: dict[int, tuple[int, ...]] = {}

    @hookimpl
    def reame_generation_finished(self, seq: SequenceView, finish_reason: str, text: str) -> None:
        self.tokens[getattr(seq, "candidate", -1)] = tuple(seq.output_tokens)


def voting_engine(backend: Backend, make_engine: MakeEngine) -> tuple[Engine, Recorder]:
    host = PluginHost(discover=False)
    recorder = Recorder()
    host.register(Conclave(), "conclave")
    host.register(recorder, "recorder")
    host.hook.reame_configure(settings=Settings(), model=backend.info, hook=host.hook)
    return make_engine(backend, plugins=host), recorder


def check_candidates_equal_their_seeds_alone(
    backend: LlamaBackend, make_engine: MakeEngine, prompt: list[int]
) -> None:
    engine, recorder = voting_engine(backend, make_engine)
    params = SamplingParams(max_tokens=24, temperature=0.9, seed=40)
    vote = {"rule": "all", "wave": 2}
    request = GenerationRequest(prompt, params, extensions={"best_of": 5, "vote": vote})
    prefilled = engine.stats.prefill_tokens

    finish = engine.generate(request)

    assert finish.error is None
    assert engine.stats.prefill_tokens - prefilled == len(prompt)  # once for five
    assert finish.usage.prompt_tokens == len(prompt)
    assert finish.report["conclave"]["finished"] + finish.report["conclave"]["stopped"] == 5
    recorded = dict(recorder.tokens)
    assert sorted(recorded) == [0, 1, 2, 3, 4]
    assert len(set(recorded.values())) > 1  # sampled: the seeds differ
    for candidate, tokens in recorded.items():
        alone = engine.generate(
            GenerationRequest(prompt, SamplingParams(24, 0.9, seed=40 + candidate))
        )
        assert tokens == alone.candidates[0].tokens, f"candidate {candidate}"


def test_smollm2_candidates_in_waves_give_each_seeds_own_tokens(
    backend: LlamaBackend, make_engine: MakeEngine
) -> None:
    prompt = encode_chat(backend.info, [{"role": "user", "content": QUESTION}])
    check_candidates_equal_their_seeds_alone(backend, make_engine, prompt)


@pytest.mark.gemma
def test_gemma_sliding_window_candidates_in_waves_give_each_seeds_own_tokens(
    gemma: LlamaBackend, make_engine: MakeEngine
) -> None:
    prompt = gemma.tokenize(f"Question: {QUESTION}\nAnswer:", add_special=True, parse_special=False)
    check_candidates_equal_their_seeds_alone(gemma, make_engine, prompt)


def test_reame_run_with_best_of_answers_with_the_voted_reply() -> None:
    reame = Path(sys.executable).parent / "reame"
    done = subprocess.run(
        [str(reame), "run", QUESTION, "--best-of", "3", "--vote", "rule=all", "--max-tokens", "24"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
