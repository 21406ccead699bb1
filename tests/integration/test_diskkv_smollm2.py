"""The disk prefix cache on the real SmolLM2-135M, deterministic configuration: a prefix
restored from disk gives the tokens of a cold prefill, bit for bit — whole, cut back to a
shorter shared prefix, a conversation through its last message, in a second server
process started after the first wrote it, and in a second server that waited for the
prefix while the first was computing it."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from served import reame_serve

from reame_core.backend.llama import LlamaBackend
from reame_core.chat import encode_chat, user_turn_opening
from reame_core.engine.engine import Engine
from reame_core.engine.slots import common_prefix
from reame_core.plugins import PluginHost
from reame_core.request import FinishEvent, GenerationRequest, SamplingParams
from reame_core.settings import Settings
from reame_diskkv.plugin import DiskPrefixCache

SYSTEM = (
    "You are the dispatcher of Ferrovie Alpine, a small mountain railway with four lines. "
    "Line A runs from Tirano to Bormio every hour from six in the morning to nine at night. "
    "Line B runs from Bormio to Livigno every two hours and stops at Valdidentro. Line C is "
    "a summer line from Livigno to the Forcola pass, running only from June to September. "
    "Line D connects Tirano with the Swiss border at Campocologno, with six trains a day. "
    "Tickets are sold at every station and on board; on board they cost one euro more. "
    "Bicycles travel free on lines A and B, and cost three euros on lines C and D. Dogs "
    "travel free if they are on a leash. Children under six travel free, and children "
    "under fourteen pay half. Groups of more than ten people must book two days ahead by "
    "writing to the dispatcher. When snow closes a line, buses replace the trains and "
    "tickets stay valid. Answer travellers briefly and politely, quote only the rules "
    "above, and if a question is not covered by them, say that the ticket office in "
    "Tirano will answer it."
)
QUESTIONS = ("Can I take my bicycle to the Forcola pass?", "How much does my child pay?")
LONG_QUESTION = (
    "which trains leave from platform 2, at what times do they leave on weekdays and on "
    "Sundays, and which of them carry bicycles up to the pass in the summer months?"
)
DOCUMENT = "\n".join(
    f"Train {i}: departs Tirano at {6 + i // 2}:{(i % 2) * 30:02d}, platform {1 + i % 3}."
    for i in range(30)
)


def chat(backend: LlamaBackend, question: str) -> list[int]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return encode_chat(backend.info, messages)


def completion(backend: LlamaBackend, text: str) -> list[int]:
    return backend.tokenize(text, add_special=True, parse_special=False)


@contextmanager
def cached_engine(
    backend: LlamaBackend, cache_dir: Path, **section: Any
) -> Iterator[tuple[Engine, DiskPrefixCache]]:
    """An engine with a fresh diskkv plugin on `cache_dir` and empty slots: a restarted
    server. Without `cache_dir`, no plugin: the cold reference."""
    for seq_id in range(backend.info.n_seq_max):
        backend.seq_rm(seq_id, -1, -1)
    cache = DiskPrefixCache()
    host = PluginHost(discover=False)
    host.register(cache, "diskkv")
    settings = Settings(plugins={"diskkv": {"dir": str(cache_dir), **section}})
    host.hook.reame_configure(settings=settings, model=backend.info, hook=host.hook)
    # Speculation off: on this build drafts are exact only up to near-ties (see conftest).
    engine = Engine(backend, host, speculate="off").start()
    try:
        yield engine, cache
    finally:
        engine.stop()


def greedy(engine: Engine, prompt: Sequence[int], session: str | None = None) -> FinishEvent:
    params = SamplingParams(max_tokens=32, ignore_eos=True)
    finished = engine.generate(GenerationRequest(list(prompt), params, session_id=session))
    assert finished.error is None, finished.error
    return finished


def tokens_of(finished: FinishEvent) -> tuple[int, ...]:
    return finished.candidates[0].tokens


def test_system_prompt_restored_from_disk_gives_the_cold_tokens(
    backend: LlamaBackend, tmp_path: Path
) -> None:
    prompts = [chat(backend, question) for question in QUESTIONS]
    with cached_engine(backend, tmp_path) as (engine, cache):
        cold = [greedy(engine, prompts[0])]
        assert cache.flush()
    with cached_engine(backend, tmp_path / "unused") as (engine, _):
        cold.append(greedy(engine, prompts[1]))

    warm = []
    for prompt in prompts:
        with cached_engine(backend, tmp_path) as (engine, _):
            warm.append(greedy(engine, prompt))

    end_of_turn = backend.tokenize("<|im_end|>", add_special=False, parse_special=True)
    system_end = prompts[0].index(end_of_turn[0]) + 1
    assert system_end > 200
    # The snapshot takes in the user turn's opening that follows (`<|im_start|>user`).
    opening = backend.tokenize("\n<|im_start|>user\n", add_special=False, parse_special=True)
    assert user_turn_opening(backend.info) == tuple(opening)
    shared = system_end + len(opening)
    for cold_run, warm_run in zip(cold, warm, strict=True):
        assert cold_run.usage.cached_tokens == 0
        assert warm_run.usage.restored_tokens == shared - shared % backend.info.chunk_grid
        assert tokens_of(warm_run) == tokens_of(cold_run)


def test_conversation_kept_on_disk_is_restored_through_its_last_message(
    backend: LlamaBackend, tmp_path: Path
) -> None:
    first = chat(backend, QUESTIONS[0])
    with cached_engine(backend, tmp_path, conversations=True) as (engine, cache):
        answer = greedy(engine, first, session="visitor").candidates[0].text
        assert cache.flush()
    second = encode_chat(
        backend.info,
        [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": QUESTIONS[0]},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": QUESTIONS[1]},
        ],
    )
    with cached_engine(backend, tmp_path / "unused") as (engine, _):
        cold = greedy(engine, second)

    with cached_engine(backend, tmp_path) as (engine, _):
        warm = greedy(engine, second, session="visitor")

    end_of_turn = backend.tokenize("<|im_end|>", add_special=False, parse_special=True)[0]
    question_end = [i + 1 for i, token in enumerate(first) if token == end_of_turn][1]
    assert common_prefix(first, second) >= question_end > first.index(end_of_turn) + 1
    assert warm.usage.restored_tokens == question_end - question_end % backend.info.chunk_grid
    assert tokens_of(warm) == tokens_of(cold)


def test_longer_snapshot_cut_back_to_a_shorter_shared_prefix_gives_the_cold_tokens(
    backend: LlamaBackend, tmp_path: Path
) -> None:
    earlier = completion(backend, f"{DOCUMENT}\nQuestion: {LONG_QUESTION}")
    prompt = completion(backend, f"{DOCUMENT}\nQuestion: when is the last train?")
    with cached_engine(backend, tmp_path, block_tokens=32) as (engine, cache):
        greedy(engine, earlier)
        assert cache.flush()
        stored = cache.reame_collect_stats()["diskkv"]["tokens_written"]  # type: ignore[index]
    with cached_engine(backend, tmp_path / "unused") as (engine, _):
        cold = greedy(engine, prompt)

    with cached_engine(backend, tmp_path) as (engine, _):
        warm = greedy(engine, prompt)

    shared = common_prefix(earlier, prompt)
    assert shared < stored
    assert warm.usage.restored_tokens == shared - shared % backend.info.chunk_grid
    assert tokens_of(warm) == tokens_of(cold)


# ------------------------------------------------------------- server processes


def cached_server(cache_dir: Path) -> AbstractContextManager[str]:
    # Speculation off, as in `cached_engine`: answers are compared bit for bit.
    return reame_serve(
        "--parallel", "2", "--ctx", "1024", "--threads", "2", "--kv-cache-dir", str(cache_dir),
        "--speculate", "off",
    )  # fmt: skip


def ask(url: str, question: str, system: str = SYSTEM) -> dict[str, Any]:
    body = {
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ],
        "max_tokens": 24,
        "temperature": 0,
    }
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    response.raise_for_status()
    return dict(response.json())


@pytest.mark.timeout(300)
def test_second_server_process_restores_what_the_first_wrote(tmp_path: Path) -> None:
    with cached_server(tmp_path) as url:
        first = ask(url, QUESTIONS[0])

    with cached_server(tmp_path) as url:
        second = ask(url, QUESTIONS[0])

    assert first["timings"]["restored_n"] == 0
    assert second["timings"]["restored_n"] > 200
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 200
    assert second["choices"][0]["message"] == first["choices"][0]["message"]


def metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def promises_in(cache_dir: Path) -> int:
    index = cache_dir / "v1" / "index.sqlite"
    if not index.exists():
        return 0
    db = sqlite3.connect(f"file:{index}?mode=ro", uri=True, timeout=5)
    try:
        return int(db.execute("SELECT COUNT(*) FROM promises").fetchone()[0])
    except sqlite3.OperationalError:  # the table not made yet
        return 0
    finally:
        db.close()


@pytest.mark.timeout(300)
def test_a_server_behind_a_prefix_another_is_computing_waits_and_restores_it(
    tmp_path: Path,
) -> None:
    # A system prompt of about 1,500 tokens: seconds of prefill on one thread each.
    system = f"{SYSTEM}\n{DOCUMENT}\n{DOCUMENT}"
    flags = (
        "--parallel", "2", "--ctx", "2048", "--threads", "1", "--kv-cache-dir", str(tmp_path),
        "--speculate", "off",
    )  # fmt: skip
    answers: dict[str, dict[str, Any]] = {}
    with reame_serve(*flags) as first, reame_serve(*flags) as second:
        computing = threading.Thread(
            target=lambda: answers.update(first=ask(first, QUESTIONS[0], system))
        )
        computing.start()
        deadline = time.monotonic() + 60
        while not promises_in(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.01)
        answers["second"] = ask(second, QUESTIONS[0], system)
        computing.join()
        waits = metric(second, "reame_prefix_waits_total")

    assert answers["first"]["timings"]["restored_n"] == 0
    assert waits == 1
    assert answers["second"]["timings"]["restored_n"] > 1000
    assert answers["second"]["choices"][0]["message"] == answers["first"]["choices"][0]["message"]
