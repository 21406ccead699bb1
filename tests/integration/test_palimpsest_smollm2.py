"""The generation archive on the real model: drafts from it never change what the plain
path says (up to near-ties, see near_tie.py), and a second process drafts from what the
first one archived."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
from near_tie import TOP, VERIFY_FLIP_RATE_Q4_1, assert_near_ties, plain_run
from served import reame_serve

from reame_core.backend.llama import LlamaBackend
from reame_core.chat import encode_chat
from reame_core.engine.engine import Engine
from reame_core.plugins import PluginHost
from reame_core.request import GenerationRequest, SamplingParams
from reame_core.settings import Settings
from reame_palimpsest.plugin import Palimpsest

MakeEngine = Callable[..., Engine]
MAX_TOKENS = 48
PRODUCTS = (
    "Write a catalogue entry. Product: brass lantern. Material: brass. Price: 40 euros.",
    "Write a catalogue entry. Product: oak stool. Material: oak. Price: 65 euros.",
    "Write a catalogue entry. Product: wool blanket. Material: wool. Price: 80 euros.",
    "Write a catalogue entry. Product: glass vase. Material: glass. Price: 25 euros.",
)


def greedy(prompt: list[int]) -> GenerationRequest:
    return GenerationRequest(
        prompt, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=TOP)
    )


def archive_engine(
    backend: LlamaBackend, make_engine: MakeEngine, archive: Path
) -> tuple[Engine, Palimpsest]:
    """An engine whose only draft source is the archive on `archive`, its index loaded."""
    plugin = Palimpsest()
    plugins = PluginHost(["prompt_lookup", "draft_model"], discover=False)
    plugins.register(plugin, "palimpsest")
    # Drafting is watched here: repeats are not answered from the remembered answers.
    settings = Settings(plugins={"palimpsest": {"dir": str(archive), "recall": False}})
    plugins.hook.reame_configure(settings=settings, model=backend.info, hook=plugins.hook)
    assert plugin.archivist is not None and plugin.archivist.ready.wait(60)
    return make_engine(backend, speculate="on", plugins=plugins), plugin


def test_repeats_drafted_from_the_archive_follow_the_plain_path(
    backend: LlamaBackend, make_engine: MakeEngine, tmp_path: Path, verification_exact: bool
) -> None:
    prompts = [encode_chat(backend.info, [{"role": "user", "content": t}]) for t in PRODUCTS]
    plain_engine = make_engine(backend)
    plain = [plain_run(plain_engine, greedy(p)) for p in prompts]
    plain_engine.stop()

    engine, plugin = archive_engine(backend, make_engine, tmp_path)
    first = [engine.generate(greedy(p)) for p in prompts]
    assert plugin.flush()
    second = [engine.generate(greedy(p)) for p in prompts]
    engine.stop()

    # Where verifying drafts is not exact, a repeat follows its first run only up to the
    # first near-tie that verifying a draft flips; from there on it is new text, which the
    # archive does not know.
    assert sum(r.usage.draft_accepted.get("palimpsest", 0) for r in second) > 0
    for run in (first, second):
        drafted = [r.candidates[0].tokens for r in run]
        assert_near_ties(plain, drafted, VERIFY_FLIP_RATE_Q4_1, exact=verification_exact)


def serve(archive: Path, cache: Path, *flags: str) -> AbstractContextManager[str]:
    return reame_serve(
        "--parallel", "1", "--ctx", "1024", "--threads", "2", "--cache-dir", str(cache),
        "--palimpsest-dir", str(archive), "--disable-plugin", "prompt_lookup", *flags,
    )  # fmt: skip


def ask(url: str, text: str) -> dict[str, Any]:
    body = {
        "messages": [{"role": "user", "content": text}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
    }
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


def test_a_second_server_process_drafts_from_the_firsts_archive(tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    with serve(archive, tmp_path / "first", "--palimpsest-no-recall") as url:
        first = [ask(url, text) for text in PRODUCTS]
    assert list((archive / "v1").glob("*/*.seg")), "the first server archived nothing"

    with serve(archive, tmp_path / "second", "--palimpsest-no-recall") as url:
        second = [ask(url, text) for text in PRODUCTS]

    drafts = [reply["timings"].get("drafts", {}).get("palimpsest", {}) for reply in second]
    assert sum(d.get("accepted", 0) for d in drafts) > 0, drafts
    assert "palimpsest" not in first[0]["timings"].get("drafts", {})  # nothing archived yet


def test_a_second_server_process_answers_a_repeat_from_the_firsts_memory(
    tmp_path: Path,
) -> None:
    archive = tmp_path / "archive"
    with serve(archive, tmp_path / "first") as url:
        first = [ask(url, text) for text in PRODUCTS]
        again = ask(url, PRODUCTS[0])  # the same process remembers too

    with serve(archive, tmp_path / "second") as url:
        second = [ask(url, text) for text in PRODUCTS]

    assert all("recalled_n" not in reply["timings"] for reply in first)
    for before, after in zip([first[0], *first], [again, *second], strict=True):
        assert after["choices"][0]["message"] == before["choices"][0]["message"]
        assert after["choices"][0]["finish_reason"] == before["choices"][0]["finish_reason"]
        assert after["timings"]["recalled_n"] == after["usage"]["completion_tokens"]
        assert after["timings"]["predicted_n"] == 0
        assert (
            after["usage"]["prompt_tokens_details"]["cached_tokens"]
            == (after["usage"]["prompt_tokens"])
        )
