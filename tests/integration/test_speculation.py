"""Speculation on the real model: drafts never change what the plain path would say.

Verifying k drafts computes them as one micro-batch, which is bit-identical to decoding them
one by one for some models, builds and CPUs and not for others; the server checks which
(reame_core/backend/pass_check.py). Where it is, greedy outputs with drafts must equal the
plain path token for token; elsewhere up to a first divergence, where the plain path must
have been at a near-tie, no more often than the measured drift allows (see near_tie.py). The
draft-model pair is made here: a Q8_0 copy of SmolLM2 is the target and the packaged Q4_1
file drafts for it (same vocabulary), from the Q4_0 copy the draft source makes of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import pytest
from near_tie import (
    TOP,
    VERIFY_FLIP_RATE_Q4_1,
    VERIFY_FLIP_RATE_Q8_0,
    assert_near_ties,
    plain_run,
    verification_is_exact,
)

from reame_core.backend.base import Batch
from reame_core.backend.llama import LlamaBackend, _header_only, _meta
from reame_core.builtins.draft_model import MIN_COPIED, DraftModel, check_same_vocabulary
from reame_core.chat import encode_chat
from reame_core.engine.engine import Engine
from reame_core.errors import ModelLoadError
from reame_core.models.draft_copy import FOLDER, copy_name, q4_0_copy
from reame_core.plugins import PluginHost
from reame_core.request import FinishEvent, GenerationRequest, SamplingParams
from reame_core.runtime import start_runtime
from reame_core.settings import Settings

MakeEngine = Callable[..., Engine]

REWRITES = (
    "Copy this text exactly: The quick brown fox jumps over the lazy dog near the river "
    "bank. Every morning the farmer walks to the market with a basket of fresh apples.",
    "Fix the typos: The wether was nice, so we walkd to the park and sat on a bench "
    "under the big oak tree untill the sun went down behind the hills.",
    "Convert to a bulleted list: apples, oranges, bananas, grapes, pears, plums, cherries.",
    "Repeat after me: one small step for a man, one giant leap for mankind.",
    "Translate to French: the cat sleeps on the warm red chair by the window.",
    "Copy this list exactly: red, green, blue, yellow, purple, orange, black, white.",
    "Rewrite in the past tense: She walks to school and reads a book on the bus.",
    "Correct the spelling: I recieved the pakage yesterday and it was definately broken.",
)
MAX_TOKENS = 32


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
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=TOP)
    return GenerationRequest(prompt, params)


def test_prompt_lookup_output_follows_the_plain_path(
    backend: LlamaBackend, make_engine: MakeEngine, verification_exact: bool
) -> None:
    prompts = [encode_chat(backend.info, [{"role": "user", "content": text}]) for text in REWRITES]
    plain_engine = make_engine(backend)
    plain = [plain_run(plain_engine, greedy(p)) for p in prompts]
    plain_engine.stop()
    engine = make_engine(backend, speculate="on")
    results = [engine.generate(greedy(p)) for p in prompts]
    engine.stop()

    accepted = sum(r.usage.draft_accepted.get("prompt_lookup", 0) for r in results)
    assert accepted > 0, "the rewrites should let prompt lookup draft"
    drafted = [result.candidates[0].tokens for result in results]
    assert_near_ties(plain, drafted, VERIFY_FLIP_RATE_Q4_1, exact=verification_exact)


def test_draft_model_output_follows_the_plain_path(
    q8_backend: LlamaBackend, smollm2_path: Path, make_engine: MakeEngine, tmp_path: Path
) -> None:
    exact = verification_is_exact(q8_backend, tmp_path / "check")
    prompts = [encode_chat(q8_backend.info, [{"role": "user", "content": t}]) for t in REWRITES]
    plain_engine = make_engine(q8_backend)
    plain = [plain_run(plain_engine, greedy(p)) for p in prompts]
    plain_engine.stop()
    for seq_id in range(q8_backend.info.n_seq_max):
        q8_backend.seq_rm(seq_id, -1, -1)
    settings = Settings(
        draft_model=str(smollm2_path), speculate="on", threads=2, cache_dir=tmp_path
    )
    runtime = start_runtime(
        settings, backend=q8_backend, plugins=PluginHost(["prompt_lookup"], discover=False)
    )
    try:
        draft = runtime.plugins.manager.get_plugin("draft_model").backend
        assert draft.path == tmp_path / FOLDER / copy_name(smollm2_path), "drafts from its copy"
        results = [runtime.engine.generate(greedy(p)) for p in prompts]
    finally:
        runtime.engine.stop()

    accepted = sum(r.usage.draft_accepted.get("draft_model", 0) for r in results)
    proposed = sum(r.usage.draft_proposed.get("draft_model", 0) for r in results)
    assert accepted > proposed // 2, (accepted, proposed)  # Q4_0 guesses Q8_0 well
    drafted = [result.candidates[0].tokens for result in results]
    assert_near_ties(plain, drafted, VERIFY_FLIP_RATE_Q8_0, exact=exact)


def test_draft_mirrors_copy_a_shared_system_prompt_and_follow_the_plain_path(
    q8_backend: LlamaBackend,
    smollm2_path: Path,
    make_engine: MakeEngine,
    tmp_path: Path,
    generate_together: Callable[[Engine, list[GenerationRequest]], list[FinishEvent]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    system = " ".join(REWRITES[4:])  # one long system prompt before every request
    prompts = [
        encode_chat(
            q8_backend.info,
            [{"role": "system", "content": system}, {"role": "user", "content": text}],
        )
        for text in REWRITES[:3]
    ]
    exact = verification_is_exact(q8_backend, tmp_path / "check")
    plain_engine = make_engine(q8_backend)
    plain = [plain_run(plain_engine, greedy(p)) for p in prompts]
    plain_engine.stop()
    for seq_id in range(q8_backend.info.n_seq_max):
        q8_backend.seq_rm(seq_id, -1, -1)
    copied: list[int] = []
    copy_shared_start = DraftModel._copy_shared_start

    def counting(self: DraftModel, *args: Any) -> int:
        start = copy_shared_start(self, *args)
        copied.append(start - args[-1])
        return start

    monkeypatch.setattr(DraftModel, "_copy_shared_start", counting)
    settings = Settings(
        draft_model=str(smollm2_path), speculate="on", threads=2, cache_dir=tmp_path
    )
    runtime = start_runtime(
        settings, backend=q8_backend, plugins=PluginHost(["prompt_lookup"], discover=False)
    )
    try:
        results = generate_together(runtime.engine, [greedy(p) for p in prompts])
    finally:
        runtime.engine.stop()

    assert max(copied) >= MIN_COPIED, "a later mirror copied the system prompt"
    assert sum(r.usage.draft_accepted.get("draft_model", 0) for r in results) > 0
    drafted = [result.candidates[0].tokens for result in results]
    assert_near_ties(plain, drafted, VERIFY_FLIP_RATE_Q8_0, exact=exact)


def test_the_q4_0_copy_has_every_matrix_in_q4_0_and_the_same_vocabulary(
    backend: LlamaBackend, smollm2_path: Path, tmp_path: Path
) -> None:
    copy = q4_0_copy(smollm2_path, tmp_path, threads=2)
    assert copy is not None
    with _header_only(copy) as model:
        assert _meta(model, "general.file_type") == str(llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0)
    draft = LlamaBackend(copy, n_ctx_seq=256, n_seq_max=1, n_batch=64, n_threads=2)
    try:
        # Q4_0 stores 4.5 bits a weight; llama.cpp's own Q4_0 mix gives SmolLM2's tied
        # embeddings, its output layer, a wider type (5.35 bits a weight over the model).
        bits = llama_cpp.llama_model_size(draft._model) * 8
        assert bits / llama_cpp.llama_model_n_params(draft._model) < 4.6
        check_same_vocabulary(backend.info, draft.info)
        prompt = draft.tokenize("def add(a, b):\n    return", add_special=True, parse_special=False)
        batch = Batch()
        for position, token in enumerate(prompt):
            batch.add(token, position, 0, position == len(prompt) - 1)
        answer = draft.tokenize(" a", add_special=False, parse_special=False)
        assert int(np.argmax(draft.decode(batch)[0])) == answer[0]
    finally:
        draft.close()


@pytest.mark.gemma
def test_draft_model_with_another_vocabulary_is_refused(
    backend: LlamaBackend, gemma_path: Path
) -> None:
    settings = Settings(draft_model=str(gemma_path), threads=2)
    with pytest.raises(ModelLoadError, match="vocabulary"):
        start_runtime(settings, backend=backend, plugins=PluginHost(discover=False))
