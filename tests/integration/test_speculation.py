"""Speculation on the real model: drafts never change what the plain path would say.

Verifying k drafts computes them as one micro-batch, which on this build (LLAMAFILE
kernels) is not bit-identical to decoding them one by one. So greedy outputs with drafts
must equal the plain path up to their first divergence, and there the plain path must have
been at a near-tie (see near_tie.py). The draft-model pair is made here: a Q8_0 copy of
SmolLM2 is the target and the packaged Q4_1 file drafts for it (same vocabulary).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import llama_cpp
import pytest
from near_tie import NEAR_TIE, top_two_gap

from reame_core.backend.base import Backend
from reame_core.backend.llama import LlamaBackend
from reame_core.chat import encode_chat
from reame_core.engine.engine import Engine
from reame_core.engine.slots import common_prefix
from reame_core.errors import ModelLoadError
from reame_core.plugins import PluginHost
from reame_core.request import GenerationRequest, SamplingParams
from reame_core.runtime import start_runtime
from reame_core.settings import Settings

MakeEngine = Callable[..., Engine]

REWRITES = (
    "Copy this text exactly: The quick brown fox jumps over the lazy dog near the river "
    "bank. Every morning the farmer walks to the market with a basket of fresh apples.",
    "Fix the typos: The wether was nice, so we walkd to the park and sat on a bench "
    "under the big oak tree untill the sun went down behind the hills.",
    "Convert to a bulleted list: apples, oranges, bananas, grapes, pears, plums, cherries.",
)
MAX_TOKENS = 48


@pytest.fixture(scope="session")
def smollm2_q8(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Q8_0 copy of SmolLM2: the target whose vocabulary the packaged Q4_1 file shares."""
    target = tmp_path_factory.mktemp("models") / "SmolLM2-135M-Instruct.Q8_0.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
    params.allow_requantize = True
    status = llama_cpp.llama_model_quantize(
        str(smollm2_path).encode(), str(target).encode(), params
    )
    assert status == 0, f"quantize failed ({status})"
    return target


@pytest.fixture(scope="module")
def q8_backend(smollm2_q8: Path, use_extra_bufts: bool) -> Iterator[LlamaBackend]:
    backend = LlamaBackend(
        smollm2_q8,
        n_ctx_seq=1024,
        n_seq_max=4,
        n_batch=512,
        n_threads=2,
        use_extra_bufts=use_extra_bufts,
    )
    yield backend
    backend.close()


def greedy(prompt: list[int]) -> GenerationRequest:
    return GenerationRequest(prompt, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))


def assert_follows_plain_path(
    backend: Backend, prompt: list[int], plain: tuple[int, ...], drafted: tuple[int, ...]
) -> None:
    split = common_prefix(plain, drafted)
    if split < len(plain):
        gap = top_two_gap(backend, [*prompt, *plain[:split]])
        assert gap < NEAR_TIE, f"diverged at token {split} where the plain path was sure ({gap})"


def test_prompt_lookup_output_follows_the_plain_path(
    backend: LlamaBackend, make_engine: MakeEngine
) -> None:
    prompts = [encode_chat(backend.info, [{"role": "user", "content": text}]) for text in REWRITES]
    plain_engine = make_engine(backend)
    plain = [plain_engine.generate(greedy(p)).candidates[0].tokens for p in prompts]
    plain_engine.stop()
    engine = make_engine(backend, speculate="on")
    results = [engine.generate(greedy(p)) for p in prompts]
    engine.stop()  # top_two_gap decodes on the backend itself

    accepted = sum(r.usage.draft_accepted.get("prompt_lookup", 0) for r in results)
    assert accepted > 0, "the rewrites should let prompt lookup draft"
    for prompt, reference, result in zip(prompts, plain, results, strict=True):
        assert_follows_plain_path(backend, prompt, reference, result.candidates[0].tokens)


def test_draft_model_output_follows_the_plain_path(
    q8_backend: LlamaBackend, smollm2_path: Path, make_engine: MakeEngine
) -> None:
    prompts = [encode_chat(q8_backend.info, [{"role": "user", "content": t}]) for t in REWRITES]
    plain_engine = make_engine(q8_backend)
    plain = [plain_engine.generate(greedy(p)).candidates[0].tokens for p in prompts]
    plain_engine.stop()
    for seq_id in range(q8_backend.info.n_seq_max):
        q8_backend.seq_rm(seq_id, -1, -1)
    settings = Settings(draft_model=str(smollm2_path), speculate="on", threads=2)
    runtime = start_runtime(
        settings, backend=q8_backend, plugins=PluginHost(["prompt_lookup"], discover=False)
    )
    try:
        results = [runtime.engine.generate(greedy(p)) for p in prompts]
    finally:
        runtime.engine.stop()

    accepted = sum(r.usage.draft_accepted.get("draft_model", 0) for r in results)
    proposed = sum(r.usage.draft_proposed.get("draft_model", 0) for r in results)
    assert accepted > proposed // 2, (accepted, proposed)  # Q4_1 guesses Q8_0 well
    for prompt, reference, result in zip(prompts, plain, results, strict=True):
        assert_follows_plain_path(q8_backend, prompt, reference, result.candidates[0].tokens)


@pytest.mark.gemma
def test_draft_model_with_another_vocabulary_is_refused(
    backend: LlamaBackend, gemma_path: Path
) -> None:
    settings = Settings(draft_model=str(gemma_path), threads=2)
    with pytest.raises(ModelLoadError, match="vocabulary"):
        start_runtime(settings, backend=backend, plugins=PluginHost(discover=False))
