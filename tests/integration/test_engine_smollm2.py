"""The engine on the real SmolLM2-135M, deterministic configuration: exact equality everywhere.

Per-sequence KV and attention along one path make a sequence's logits independent of its batch
neighbours and of whether its prefix was computed, reused or copied, so every comparison
here is token-for-token. The last tests drive the `reame` command as a user would.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from reame_core.backend.base import Backend
from reame_core.backend.llama import LlamaBackend
from reame_core.backend.pass_check import PassCheck
from reame_core.chat import encode_chat
from reame_core.engine.engine import Engine
from reame_core.engine.slots import common_prefix
from reame_core.errors import ContextOverflowError
from reame_core.request import Event, FinishEvent, GenerationRequest, SamplingParams, TokenEvent

Forget = Callable[[Engine], None]
Together = Callable[[Engine, Sequence[GenerationRequest]], list[FinishEvent]]

REAME = Path(sys.executable).parent / "reame"


SYSTEM = (
    "You are the support assistant of Lanterna, a small company that sells handmade oil "
    "lamps, replacement wicks, glass chimneys and lamp oil to customers across Europe. "
    "Answer in a friendly, concise tone and never invent prices or delivery dates. Orders "
    "ship from Bologna within two working days; delivery inside Italy takes one to three "
    "days and elsewhere in the European Union three to seven days. Returns are accepted "
    "within thirty days if the lamp is unused and in its original box; the customer pays "
    "the return shipping unless the item arrived damaged. Lamp oil cannot be shipped by air, "
    "so it is never sent outside the European Union. Wicks come in three widths: narrow "
    "for the Piccola lamp, medium for the Classica and wide for the Grande. Glass chimneys "
    "are fragile and are packed in recycled paper. If a customer reports a broken chimney, "
    "apologise, ask for a photo and promise a replacement. If you do not know an answer, "
    "say so and suggest writing to the workshop."
)


def chat(backend: Backend, question: str, system: str | None = None) -> list[int]:
    head = [{"role": "system", "content": system}] if system else []
    return encode_chat(backend.info, [*head, {"role": "user", "content": question}])


def request(prompt: Sequence[int], n: int = 1, **params: Any) -> GenerationRequest:
    return GenerationRequest(list(prompt), SamplingParams(**params), n=n)


def tokens_of(finished: FinishEvent) -> tuple[int, ...]:
    assert finished.error is None, finished.error
    return finished.candidates[0].tokens


def is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class Watch:
    """One request's events, as the engine thread delivers them."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.done = threading.Event()
        self.texts: list[str] = []
        self.finished: FinishEvent | None = None
        self.finished_at = 0.0

    def __call__(self, event: Event) -> None:
        if isinstance(event, TokenEvent):
            self.texts.append(event.text)
            self.started.set()
        else:
            self.finished = event
            self.finished_at = time.perf_counter()
            self.done.set()

    def result(self, timeout: float = 60) -> FinishEvent:
        assert self.done.wait(timeout), "the request did not finish"
        assert self.finished is not None
        return self.finished


def wait_until(condition: Callable[[], bool], timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


# ------------------------------------------------------------------ batching


def test_eight_concurrent_greedy_generations_equal_eight_serial_runs(
    questions: tuple[str, ...],
    engine: Engine,
    backend: LlamaBackend,
    forget_kv: Forget,
    generate_together: Together,
) -> None:
    requests = [request(chat(backend, q), max_tokens=48, ignore_eos=True) for q in questions]
    serial = []
    for each in requests:
        forget_kv(engine)
        serial.append(tokens_of(engine.generate(each)))
    forget_kv(engine)
    steps_before = engine.stats.decode_steps

    together = generate_together(engine, requests)

    assert [tokens_of(finished) for finished in together] == serial
    # They really shared decode steps: serially this takes 8 x 48 steps.
    assert engine.stats.decode_steps - steps_before < 2 * 48


def test_seeded_sampled_request_gives_the_same_tokens_alone_and_batched(
    questions: tuple[str, ...],
    engine: Engine,
    backend: LlamaBackend,
    forget_kv: Forget,
    generate_together: Together,
) -> None:
    seeded = request(
        chat(backend, "Invent a name for a lamp shop."),
        max_tokens=32,
        temperature=0.9,
        seed=1234,
        ignore_eos=True,
    )
    alone = tokens_of(engine.generate(seeded))
    forget_kv(engine)
    neighbours = [
        request(chat(backend, questions[0]), max_tokens=40, ignore_eos=True),
        request(chat(backend, questions[1]), max_tokens=40, temperature=0.7, seed=5),
        request(chat(backend, questions[2]), max_tokens=40, temperature=1.2),
    ]

    batched = generate_together(engine, [neighbours[0], seeded, *neighbours[1:]])

    assert tokens_of(batched[1]) == alone


def test_long_prompt_prefilled_beside_a_running_generation_gives_the_alone_tokens(
    engine: Engine, backend: LlamaBackend, forget_kv: Forget
) -> None:
    # About 420 tokens: prefilled in several chunks while the other request decodes.
    prompt = chat(backend, "Write a haiku about rain.", f"{SYSTEM} {SYSTEM}")
    alone = tokens_of(engine.generate(request(prompt, max_tokens=32, ignore_eos=True)))
    forget_kv(engine)
    # Raw text shares no leading token with a chat prompt: nothing can be reused. The story
    # takes slot 1 and the prompt slot 2; llama.cpp splits a batch of adjacent sequences
    # into ubatches with an equal number of tokens from each.
    story = backend.tokenize(
        "Once upon a time, by the sea,", add_special=False, parse_special=False
    )
    running = Watch()
    ticket = engine.submit(request(story, max_tokens=400, ignore_eos=True), running)
    assert running.started.wait(30)

    beside = engine.generate(request(prompt, max_tokens=32, ignore_eos=True))
    still_running = not running.done.is_set()
    ticket.cancel()
    running.result()

    assert still_running
    assert beside.usage.cached_tokens == 0
    assert tokens_of(beside) == alone


def test_streams_around_a_slot_computing_a_prompt_give_their_alone_tokens(
    engine: Engine, backend: LlamaBackend, forget_kv: Forget
) -> None:
    # Raw texts with different first tokens: no request reuses another's KV.
    def text(words: str) -> list[int]:
        return backend.tokenize(words, add_special=False, parse_special=False)

    first, short, third = text("Once upon a time,"), text("Dear customer,"), text("In 1887 the")
    long_prompt = text(f"Notes. {SYSTEM} {SYSTEM}")  # about 400 tokens: several chunks
    streams = [request(prompt, max_tokens=120, ignore_eos=True) for prompt in (first, third)]
    late = request(long_prompt, max_tokens=16, ignore_eos=True)
    alone = []
    for each in (*streams, late):
        forget_kv(engine)
        alone.append(tokens_of(engine.generate(each)))
    forget_kv(engine)
    fillers_before = engine.stats.filler_rows

    # Slots 0-2; the short request frees slot 1, which the long prompt then takes and
    # computes in chunks while slots 0 and 2 decode around it in one pass each step: with
    # KV streams slot 1 gets a filler row each step, with regions there is no gap to fill.
    watches = [Watch() for _ in range(3)]
    engine.submit(streams[0], watches[0])
    engine.submit(request(short, max_tokens=2, ignore_eos=True), watches[1])
    engine.submit(streams[1], watches[2])
    watches[1].result()
    beside = engine.generate(late)
    still_running = not (watches[0].done.is_set() or watches[2].done.is_set())

    assert still_running
    assert (engine.stats.filler_rows > fillers_before) == (not backend.regions)
    assert [tokens_of(watches[i].result()) for i in (0, 2)] == alone[:2]
    assert tokens_of(beside) == alone[2]


# ------------------------------------------------------------- prefix reuse


def test_shared_system_prompt_is_reused_and_gives_the_cold_tokens(
    engine: Engine, backend: LlamaBackend, forget_kv: Forget
) -> None:
    prompt_a = chat(backend, "Do you ship lamp oil to Norway?", SYSTEM)
    prompt_b = chat(backend, "My glass chimney arrived broken. What now?", SYSTEM)
    shared = common_prefix(prompt_a, prompt_b)
    assert shared > 200

    engine.generate(request(prompt_a, max_tokens=24))
    warm = engine.generate(request(prompt_b, max_tokens=32, ignore_eos=True))
    forget_kv(engine)
    cold = engine.generate(request(prompt_b, max_tokens=32, ignore_eos=True))

    assert warm.usage.cached_tokens == shared - shared % backend.info.chunk_grid
    assert cold.usage.cached_tokens == 0
    assert tokens_of(warm) == tokens_of(cold)


def test_repeated_identical_prompt_gives_the_cold_tokens(
    engine: Engine, backend: LlamaBackend
) -> None:
    prompt = chat(backend, "Explain gravity briefly.", SYSTEM)
    cold = engine.generate(request(prompt, max_tokens=48, ignore_eos=True))

    again = engine.generate(request(prompt, max_tokens=48, ignore_eos=True))

    assert cold.usage.cached_tokens == 0
    assert again.usage.cached_tokens > 200
    assert tokens_of(again) == tokens_of(cold)


def test_second_chat_turn_gives_the_cold_tokens(
    engine: Engine, backend: LlamaBackend, forget_kv: Forget
) -> None:
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Name a famous painter."},
    ]
    first = engine.generate(request(encode_chat(backend.info, messages), max_tokens=64))
    messages += [
        {"role": "assistant", "content": first.candidates[0].text},
        {"role": "user", "content": "Say that again, but shorter."},
    ]
    second_turn = encode_chat(backend.info, messages)

    warm = engine.generate(request(second_turn, max_tokens=48, ignore_eos=True))
    forget_kv(engine)
    cold = engine.generate(request(second_turn, max_tokens=48, ignore_eos=True))

    assert warm.usage.cached_tokens > 200
    assert tokens_of(warm) == tokens_of(cold)


def test_where_rows_do_not_depend_on_their_pass_second_turns_reuse_the_answers(
    backend: LlamaBackend,
    make_engine: Callable[..., Engine],
    forget_kv: Forget,
    generate_together: Together,
    pass_check: PassCheck,
) -> None:
    """Where the server's check finds a row's logits the same whatever pass computes it, the
    engine reuses a generated answer's KV as it is (`rows_exact`): answers written beside one
    another, with drafts verified, and the next turns must give a cold run's tokens."""
    if not pass_check.exact:
        pytest.skip(f"here rows depend on their pass ({pass_check}): answers are recomputed")
    engine = make_engine(backend, rows_exact=True, speculate="on")
    questions = ["Name a famous painter.", "Repeat after me: the lamp is lit, the lamp is lit."]
    conversations = [
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}] for q in questions
    ]
    first_prompts = [encode_chat(backend.info, messages) for messages in conversations]
    firsts = generate_together(engine, [request(p, max_tokens=64) for p in first_prompts])
    second_turns, answers = [], []
    for messages, first in zip(conversations, firsts, strict=True):
        answers.append(first.candidates[0].tokens)
        messages += [
            {"role": "assistant", "content": first.candidates[0].text},
            {"role": "user", "content": "Say that again, but shorter."},
        ]
        second_turns.append(encode_chat(backend.info, messages))

    warm = [engine.generate(request(turn, max_tokens=48, ignore_eos=True)) for turn in second_turns]
    cold = []
    for turn in second_turns:
        forget_kv(engine)
        cold.append(engine.generate(request(turn, max_tokens=48, ignore_eos=True)))

    for prompt, answer, turn, hot, computed in zip(
        first_prompts, answers, second_turns, warm, cold, strict=True
    ):
        # All but the answer's last token are in the KV (it and verified drafts after it,
        # such as the end of the turn, may be too).
        reused = hot.usage.cached_tokens
        assert reused >= common_prefix([*prompt, *answer[:-1]], turn) > len(prompt)
        assert tokens_of(hot) == tokens_of(computed)


def test_session_turns_compute_only_the_new_message_and_give_the_cold_tokens(
    engine: Engine, backend: LlamaBackend, forget_kv: Forget
) -> None:
    questions = ["Name a famous painter.", "Where was he born?", "Name one of his works."]
    messages = [{"role": "system", "content": SYSTEM}]
    for turn, question in enumerate(questions):
        messages.append({"role": "user", "content": question})
        prompt = encode_chat(backend.info, messages)
        session = GenerationRequest(prompt, SamplingParams(max_tokens=24), session_id="talk")
        # Between turns the idle engine recomputes the answer as a prompt chunk.
        assert wait_until(lambda: not engine.busy)
        warm = engine.generate(session)
        if turn > 0:
            new_message = encode_chat(backend.info, [{"role": "user", "content": question}])
            computed = warm.usage.computed_prompt_tokens
            # Reuse stops at the grid point below the turn's end: a few more are computed.
            most = len(new_message) + 8 + backend.info.chunk_grid
            assert computed <= most, (computed, len(new_message))
            assert wait_until(lambda: not engine.busy)
            forget_kv(engine)
            cold = engine.generate(request(prompt, max_tokens=24))
            assert tokens_of(warm) == tokens_of(cold)
            # Put the conversation back in its pinned slot for the next turn.
            forget_kv(engine)
            assert tokens_of(engine.generate(session)) == tokens_of(cold)
        messages.append({"role": "assistant", "content": warm.candidates[0].text})


def test_requests_sent_together_behind_one_prompt_compute_it_once_and_give_the_cold_tokens(
    engine: Engine, backend: LlamaBackend, forget_kv: Forget, generate_together: Together
) -> None:
    questions = ["Which wick fits the Classica lamp?", "Do you ship lamp oil to Norway?"]
    prompts = [chat(backend, question, SYSTEM) for question in questions]
    requests = [request(prompt, max_tokens=24, ignore_eos=True) for prompt in prompts]
    before = engine.stats.prefill_tokens

    together = generate_together(engine, requests)
    computed = engine.stats.prefill_tokens - before
    cold = []
    for one in requests:
        forget_kv(engine)
        cold.append(engine.generate(one))

    shared = common_prefix(*prompts)
    on_grid = shared - shared % backend.info.chunk_grid
    assert shared > 200
    # The second waited for the first to compute the system prompt, then copied it.
    assert [f.usage.cached_tokens for f in together] == [0, on_grid]
    assert computed == len(prompts[0]) + len(prompts[1]) - on_grid
    assert [tokens_of(f) for f in together] == [tokens_of(c) for c in cold]


def test_prefix_copied_from_a_busy_slot_gives_the_cold_tokens(
    engine: Engine, backend: LlamaBackend, forget_kv: Forget
) -> None:
    prompt_a = chat(backend, "Write a long essay about the history of oil lamps.", SYSTEM)
    prompt_b = chat(backend, "Which wick fits the Classica lamp?", SYSTEM)
    long_run = Watch()
    ticket = engine.submit(request(prompt_a, max_tokens=400, ignore_eos=True), long_run)
    assert long_run.started.wait(30)

    warm = engine.generate(request(prompt_b, max_tokens=24, ignore_eos=True))
    still_running = not long_run.done.is_set()
    ticket.cancel()
    long_run.result()
    forget_kv(engine)
    cold = engine.generate(request(prompt_b, max_tokens=24, ignore_eos=True))

    assert still_running
    shared = common_prefix(prompt_a, prompt_b)
    assert shared > 200
    assert warm.usage.cached_tokens == shared - shared % backend.info.chunk_grid
    assert tokens_of(warm) == tokens_of(cold)


# ------------------------------------------------------------- cancellation


def test_cancelled_generation_ends_promptly_and_the_engine_keeps_serving(
    engine: Engine, backend: LlamaBackend
) -> None:
    long_run = Watch()
    ticket = engine.submit(
        request(chat(backend, "Tell me a very long story."), max_tokens=400, ignore_eos=True),
        long_run,
    )
    assert long_run.started.wait(30)

    cancelled_at = time.perf_counter()
    ticket.cancel()
    finished = long_run.result()

    (candidate,) = finished.candidates
    assert candidate.finish_reason == "cancelled"
    assert len(candidate.tokens) < 400
    assert long_run.finished_at - cancelled_at < 2.0
    after = engine.generate(request(chat(backend, "What is 2+2?"), max_tokens=12, ignore_eos=True))
    assert after.error is None
    assert after.candidates[0].finish_reason == "length"
    assert len(after.candidates[0].tokens) == 12


def test_cancelling_one_of_eight_busy_slots_lets_a_queued_ninth_request_start(
    questions: tuple[str, ...], engine: Engine, backend: LlamaBackend
) -> None:
    runs = [Watch() for _ in questions]
    tickets = [
        engine.submit(request(chat(backend, q), max_tokens=400, ignore_eos=True), run)
        for q, run in zip(questions, runs, strict=True)
    ]
    for run in runs:
        assert run.started.wait(60)
    ninth = Watch()
    engine.submit(request(chat(backend, "Say hi."), max_tokens=8, ignore_eos=True), ninth)

    queued = wait_until(lambda: engine.stats.waiting_requests == 1)
    waited = not ninth.started.wait(0.3)
    tickets[3].cancel()
    ninth_result = ninth.result(timeout=30)
    for ticket in tickets:
        ticket.cancel()
    outcomes = [run.result() for run in runs]

    assert queued and waited
    assert outcomes[3].candidates[0].finish_reason == "cancelled"
    assert ninth_result.candidates[0].finish_reason == "length"
    assert len(ninth_result.candidates[0].tokens) == 8


# ------------------------------------------------------------------- limits


def test_prompt_longer_than_the_context_is_refused_at_submit(
    engine: Engine, backend: LlamaBackend
) -> None:
    too_long = backend.tokenize("lamp " * 1100, add_special=True, parse_special=False)
    assert len(too_long) > backend.info.n_ctx_seq

    with pytest.raises(ContextOverflowError):
        engine.submit(request(too_long, max_tokens=8), lambda event: None)

    after = engine.generate(request(chat(backend, "What is 2+2?"), max_tokens=8, ignore_eos=True))
    assert len(tokens_of(after)) == 8


# --------------------------------------------------------------- candidates


def test_n_candidates_share_one_prefill_and_candidate_i_samples_with_seed_plus_i(
    engine: Engine, backend: LlamaBackend
) -> None:
    prompt = chat(backend, "Invent a name for a lamp shop.")
    sampled: dict[str, Any] = {"max_tokens": 24, "temperature": 0.9, "ignore_eos": True}
    prefilled_before = engine.stats.prefill_tokens

    group = engine.generate(request(prompt, n=3, seed=77, **sampled))

    assert engine.stats.prefill_tokens - prefilled_before == len(prompt)
    candidates = [candidate.tokens for candidate in group.candidates]
    assert len(set(candidates)) == 3
    singles = [
        tokens_of(engine.generate(request(prompt, seed=77 + i, **sampled))) for i in range(3)
    ]
    assert candidates == singles


# --------------------------------------------------------------------- text


def test_multibyte_characters_split_across_tokens_stream_without_replacement_chars(
    engine: Engine, backend: LlamaBackend
) -> None:
    line = "café — naïve — 東京"
    prompt = backend.tokenize(f"{line}\n" * 3, add_special=False, parse_special=False)
    watch = Watch()

    engine.submit(request(prompt, max_tokens=40, stop=("\n",)), watch)
    finished = watch.result()

    (candidate,) = finished.candidates
    assert candidate.text == line
    assert "".join(watch.texts) == candidate.text
    assert not any("\ufffd" in text for text in watch.texts)
    pieces = [backend.token_bytes(token) for token in candidate.tokens]
    assert any(not is_utf8(piece) for piece in pieces), "no character was split across tokens"


def test_stop_string_cuts_the_plain_text_before_its_first_occurrence(
    engine: Engine, backend: LlamaBackend
) -> None:
    prompt = chat(backend, "Explain gravity briefly.")
    plain = engine.generate(request(prompt, max_tokens=48)).candidates[0]
    middle = len(plain.text) // 2
    stop = plain.text[middle : middle + 5]

    stopped = engine.generate(request(prompt, max_tokens=48, stop=(stop,))).candidates[0]

    assert stopped.text == plain.text[: plain.text.index(stop)]
    assert stopped.finish_reason == "stop"
    assert len(stopped.tokens) < len(plain.tokens)


# -------------------------------------------------------------------- engine


def test_a_new_engine_on_a_used_backend_serves_requests(
    engine: Engine, backend: LlamaBackend
) -> None:
    prompt = chat(backend, "What is the capital of France?")
    first = tokens_of(engine.generate(request(prompt, max_tokens=8, ignore_eos=True)))
    engine.stop()

    restarted = Engine(backend, speculate="off").start()  # as the `engine` fixture
    try:
        again = restarted.generate(request(prompt, max_tokens=8, ignore_eos=True))
    finally:
        restarted.stop()

    assert again.error is None, again.error
    assert tokens_of(again) == first


# ---------------------------------------------------------------------- CLI


def reame(
    *args: str, stdin: str | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(REAME), *args],
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_reame_run_answers_a_prompt_and_exits() -> None:
    done = reame("run", "Say hello", "--max-tokens", "16")

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()


def test_reame_run_answers_from_the_piped_text() -> None:
    question = "What is the name of the ship? Answer with the name only."

    piped = reame("run", question, "--max-tokens", "12", stdin="The ship is named Calypso.")
    alone = reame("run", question, "--max-tokens", "12")

    assert piped.returncode == 0, piped.stderr
    assert "Calypso" in piped.stdout  # greedy decoding: the answer comes from the piped text
    assert "Calypso" not in alone.stdout


def test_reame_run_with_a_missing_model_file_fails_with_a_clear_message(tmp_path: Path) -> None:
    done = reame("run", "missing.gguf", "hi", cwd=tmp_path)

    assert done.returncode != 0
    assert "missing.gguf" in done.stderr
    assert "not found" in done.stderr.lower()
    assert "Traceback" not in done.stderr


def test_reame_plugins_lists_the_builtin_and_installed_plugins() -> None:
    done = reame("plugins")

    assert done.returncode == 0, done.stderr
    for name in ("verification", "selection", "diskkv", "palimpsest", "suggeritore", "conclave"):
        assert name in done.stdout
