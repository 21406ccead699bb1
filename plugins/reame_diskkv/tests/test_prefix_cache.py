"""The disk prefix cache seen from requests, on the fake backend: what gets stored, what a
later engine (a restarted server, a second process) restores, and that every answer
equals the model's own greedy continuation whatever the cache held or suffered."""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import structlog
from diskkv_testing import SYSTEM, StartCache, entry_files, opening_length, temp_files

from reame_core.backend.fake import IM_END
from reame_core.engine.slots import common_prefix
from reame_core.request import FinishEvent
from reame_diskkv.entry_format import read_header

QUESTION = "Which ships are due on Tuesday?"
OTHER_QUESTION = "Who signs the harbour log?"
SYSTEM_B = "You keep the lighthouse log and answer in one line. " * 8
DOCUMENT = "Manifest of the Maria Stella, port of Trieste. " * 6


def tokens_of(finished: FinishEvent) -> list[int]:
    return list(finished.candidates[0].tokens)


# ------------------------------------------------------------------- restoring


def test_restarted_engine_restores_the_system_prompt_and_answers_identically(
    start_cache: StartCache,
) -> None:
    first = start_cache()
    prompt = first.chat(QUESTION)
    cold = first.generate(prompt)
    second = start_cache()

    warm = second.generate(prompt)

    assert tokens_of(warm) == tokens_of(cold) == second.reference(prompt)
    assert warm.usage.restored_tokens == warm.usage.cached_tokens == opening_length(prompt)
    assert second.stats()["hits"] == 1


def test_other_question_after_the_same_system_prompt_restores_it(
    start_cache: StartCache,
) -> None:
    first = start_cache()
    first.generate(first.chat(QUESTION))
    second = start_cache()
    prompt = second.chat(OTHER_QUESTION)

    warm = second.generate(prompt)

    assert tokens_of(warm) == second.reference(prompt)
    assert warm.usage.restored_tokens == opening_length(prompt)


def test_longer_snapshot_serves_a_shorter_shared_prefix_by_trimming(
    start_cache: StartCache,
) -> None:
    section = {"block_tokens": 64}
    first = start_cache(section)
    earlier = first.text(DOCUMENT + "Question: how many barrels of oil were loaded?")
    first.generate(earlier)
    second = start_cache(section)
    prompt = second.text(DOCUMENT + "Question: who is the captain?")
    shared = common_prefix(earlier, prompt)
    assert shared < first.stats()["tokens_written"]

    warm = second.generate(prompt)

    assert tokens_of(warm) == second.reference(prompt)
    assert warm.usage.restored_tokens == shared


def test_a_prompt_whose_next_turn_is_not_the_users_restores_the_system_prompt(
    start_cache: StartCache,
) -> None:
    # The snapshot takes in the user turn's opening; a prompt whose next turn is the
    # assistant's (an example answer) shares all but that, and restores it cut back.
    first = start_cache()
    earlier = first.chat(QUESTION)
    first.generate(earlier)
    second = start_cache()
    text = (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>assistant\nAye.<|im_end|>\n"
        f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n"
    )
    prompt = second.backend.tokenize(text, add_special=True, parse_special=True)

    warm = second.generate(prompt)

    assert tokens_of(warm) == second.reference(prompt)
    # Shared: the system message, its end, the newline and `<|im_start|>`.
    shared = earlier.index(IM_END) + 3
    assert warm.usage.restored_tokens == common_prefix(earlier, prompt) == shared


def test_model_that_cannot_be_trimmed_restores_only_whole_stored_prefixes(
    start_cache: StartCache,
) -> None:
    first = start_cache(prefix_trim_safe=False)
    first.generate(first.chat(QUESTION))
    second = start_cache(prefix_trim_safe=False)
    prompt = second.chat(OTHER_QUESTION)

    warm = second.generate(prompt)

    assert tokens_of(warm) == second.reference(prompt)
    # Its snapshot ends with the system message: one taking in the user turn's opening
    # could not serve a prompt whose next turn is another's.
    assert warm.usage.restored_tokens == prompt.index(IM_END) + 1


def test_model_that_cannot_be_trimmed_never_restores_a_longer_snapshot(
    start_cache: StartCache,
) -> None:
    section = {"block_tokens": 64}
    first = start_cache(section, prefix_trim_safe=False)
    first.generate(first.text(DOCUMENT + "Question: how many barrels of oil were loaded?"))
    second = start_cache(section, prefix_trim_safe=False)
    prompt = second.text(DOCUMENT + "Question: who is the captain?")

    warm = second.generate(prompt)

    assert tokens_of(warm) == second.reference(prompt)
    assert warm.usage.cached_tokens == 0
    assert second.stats()["bytes_read"] == 0


def test_prefix_held_in_a_slot_is_not_read_from_disk(start_cache: StartCache) -> None:
    running = start_cache()
    running.generate(running.chat(QUESTION))
    prompt = running.chat(OTHER_QUESTION)

    again = running.generate(prompt)

    assert again.usage.cached_tokens >= opening_length(prompt)
    assert again.usage.restored_tokens == 0
    assert running.stats()["bytes_read"] == 0


def test_entry_of_another_model_is_never_used_and_stays_for_it(
    start_cache: StartCache, cache_dir: Path
) -> None:
    first = start_cache(name="model-a")
    first.generate(first.chat(QUESTION))
    other = start_cache(name="model-b")
    prompt = other.chat(QUESTION)

    result = other.generate(prompt)

    assert tokens_of(result) == other.reference(prompt)
    assert result.usage.cached_tokens == 0
    assert len(entry_files(cache_dir)) == 2  # model-a's entry, and now model-b's own


# --------------------------------------------------------------------- storing


def test_system_prompt_is_stored_once_whoever_asks(
    start_cache: StartCache, cache_dir: Path
) -> None:
    first = start_cache()
    first.generate(first.chat(QUESTION))
    second = start_cache()

    second.generate(second.chat(OTHER_QUESTION))

    assert second.stats()["entries_written"] == 0
    assert len(entry_files(cache_dir)) == 1


def test_short_prompt_is_neither_stored_nor_looked_up(
    start_cache: StartCache, cache_dir: Path
) -> None:
    running = start_cache()

    running.generate(running.chat("Hi?", system="Be brief."))

    assert entry_files(cache_dir) == []
    assert running.stats()["misses"] == 0


def test_counters_tell_hits_misses_and_bytes_moved(
    start_cache: StartCache, cache_dir: Path
) -> None:
    first = start_cache()
    first.generate(first.chat(QUESTION))
    second = start_cache()
    second.generate(second.chat(QUESTION))
    (entry,) = entry_files(cache_dir)

    written, read = first.stats(), second.stats()

    assert (written["misses"], written["hits"], written["entries_written"]) == (1, 0, 1)
    assert written["bytes_written"] == read["bytes_read"] == entry.stat().st_size
    assert (read["hits"], read["misses"], read["corrupt"]) == (1, 0, 0)
    assert read["entries"] == 1 and read["bytes_on_disk"] == entry.stat().st_size


# ------------------------------------------------------------------- failures


def part_offsets(data: bytes) -> dict[str, int]:
    """The offset of one byte in every part of an entry (see entry_format)."""
    header = read_header(data)
    fingerprint = 36
    model = fingerprint + len(header.fingerprint)
    tokens = model + len(header.model)
    payload = tokens + 4 * len(header.tokens)
    return {
        "magic": 0,
        "format version": 8,
        "codec": 10,
        "fingerprint length": 12,
        "model name length": 14,
        "token count": 16,
        "state size": 20,
        "payload size": 28,
        "fingerprint": fingerprint + 3,
        "model name": model,
        "tokens": tokens + 4 * 10,
        "payload start": payload,
        "payload middle": (payload + len(data) - 32) // 2,
        "payload end": len(data) - 33,
        "checksum": len(data) - 1,
    }


PARTS = (
    "magic", "format version", "codec", "fingerprint length", "model name length",
    "token count", "state size", "payload size", "fingerprint", "model name", "tokens",
    "payload start", "payload middle", "payload end", "checksum",
)  # fmt: skip


@pytest.mark.parametrize("part", PARTS)
def test_damaged_entry_is_counted_deleted_and_computed_again(
    start_cache: StartCache, cache_dir: Path, part: str
) -> None:
    first = start_cache()
    prompt = first.chat(QUESTION)
    first.generate(prompt)
    (entry,) = entry_files(cache_dir)
    data = bytearray(entry.read_bytes())
    data[part_offsets(bytes(data))[part]] ^= 0x5A
    entry.write_bytes(bytes(data))
    second = start_cache()

    result = second.generate(prompt)

    assert tokens_of(result) == second.reference(prompt)
    assert result.usage.cached_tokens == 0
    assert second.stats()["corrupt"] == 1
    assert entry.read_bytes() != bytes(data)  # deleted, then stored again intact
    assert start_cache().generate(prompt).usage.restored_tokens == opening_length(prompt)


@pytest.mark.parametrize("kept", [0, 20, 200, -1], ids=["empty", "header", "middle", "end"])
def test_truncated_entry_is_counted_deleted_and_computed_again(
    start_cache: StartCache, cache_dir: Path, kept: int
) -> None:
    first = start_cache()
    prompt = first.chat(QUESTION)
    first.generate(prompt)
    (entry,) = entry_files(cache_dir)
    entry.write_bytes(entry.read_bytes()[:kept])
    second = start_cache()

    result = second.generate(prompt)

    assert tokens_of(result) == second.reference(prompt)
    assert second.stats()["corrupt"] == 1
    assert len(entry_files(cache_dir)) == 1


def test_entry_file_holding_another_prefix_is_treated_as_corrupt(
    start_cache: StartCache, cache_dir: Path
) -> None:
    first = start_cache()
    first.generate(first.chat(QUESTION, system=SYSTEM_B))
    (other,) = entry_files(cache_dir)
    first.generate(first.chat(QUESTION))
    (entry,) = [path for path in entry_files(cache_dir) if path != other]
    entry.write_bytes(other.read_bytes())  # a valid entry, under the wrong name
    second = start_cache()
    prompt = second.chat(QUESTION)

    result = second.generate(prompt)

    assert tokens_of(result) == second.reference(prompt)
    assert second.stats()["corrupt"] == 1


def test_full_disk_keeps_serving_and_says_so_once(
    start_cache: StartCache,
    cache_dir: Path,
    fail_writes_in: Callable[[Path, int], None],
) -> None:
    running = start_cache({"turns": 2})
    fail_writes_in(cache_dir, errno.ENOSPC)
    prompts = [running.chat(QUESTION), running.chat(OTHER_QUESTION, system=SYSTEM_B)]

    with structlog.testing.capture_logs() as logs:
        results = [running.generate(prompt) for prompt in prompts]

    for prompt, result in zip(prompts, results, strict=True):
        assert tokens_of(result) == running.reference(prompt)
    warnings = [log for log in logs if log["log_level"] == "warning"]
    assert len(warnings) == 1 and "No space left" in warnings[0]["error"]
    stats = running.stats()
    assert stats["write_errors"] >= 1 and stats["entries_written"] == 0
    assert entry_files(cache_dir) == temp_files(cache_dir) == []


def test_read_only_directory_turns_the_cache_off_and_says_so_once(
    start_cache: StartCache,
    cache_dir: Path,
    read_only: Callable[[Path], None],
) -> None:
    read_only(cache_dir)

    with structlog.testing.capture_logs() as logs:
        running = start_cache()
        prompts = [running.chat(QUESTION), running.chat(OTHER_QUESTION)]
        results = [running.generate(prompt) for prompt in prompts]

    for prompt, result in zip(prompts, results, strict=True):
        assert tokens_of(result) == running.reference(prompt)
    warnings = [log for log in logs if log["log_level"] == "warning"]
    assert len(warnings) == 1 and "off" in warnings[0]["event"]
    assert "Read-only" in warnings[0]["error"]
    assert not cache_dir.exists()


# ----------------------------------------------------------------- promises


def test_an_engine_behind_a_prefix_another_is_computing_waits_and_restores_it(
    start_cache: StartCache,
) -> None:
    # Prompt tokens cost 2 ms each: the first engine takes a while over its system prompt,
    # less than the second would wait before computing it too (at the rate it assumes).
    first, second = start_cache(token_cost_s=0.002), start_cache(token_cost_s=0.002)
    prompt, other = first.chat(QUESTION), second.chat(OTHER_QUESTION)
    done: list[FinishEvent] = []
    computing = threading.Thread(target=lambda: done.append(first.generate(prompt)))
    computing.start()
    deadline = time.monotonic() + 10
    while first.stats()["promises_made"] == 0 and time.monotonic() < deadline:
        time.sleep(0.005)

    behind = second.generate(other)
    computing.join()

    assert first.stats()["promises_made"] == 1
    assert second.engine.stats.prefix_waits == 1
    assert behind.usage.restored_tokens == opening_length(other)
    assert second.engine.stats.prefill_tokens == len(other) - opening_length(other)
    assert tokens_of(behind) == second.reference(other)
    assert tokens_of(done[0]) == first.reference(prompt)


def test_a_prefix_two_requests_promised_stays_promised_until_both_let_go(
    start_cache: StartCache,
) -> None:
    here, elsewhere = start_cache(), start_cache()
    prompt = here.chat(QUESTION)
    point = opening_length(prompt)
    model = here.backend.info

    def seen() -> int | None:
        return elsewhere.cache.reame_prefix_pending(tokens=prompt, have=0, model=model)

    for request_id in ("one", "two"):
        here.cache.reame_prefix_computing(
            tokens=prompt, points=[point], model=model, request_id=request_id
        )
    here.cache.reame_prefix_computing(tokens=prompt, points=[], model=model, request_id="one")
    still = seen()
    here.cache.reame_prefix_computing(tokens=prompt, points=[], model=model, request_id="two")

    assert still == point
    assert seen() is None
    assert here.stats()["promises_made"] == 2


def test_a_prefix_the_writer_refuses_is_no_longer_promised_by_this_process_only(
    start_cache: StartCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    here, elsewhere, third = start_cache(), start_cache(), start_cache()
    prompt = here.chat(QUESTION)
    point = opening_length(prompt)
    model = here.backend.info
    for running in (here, elsewhere):
        running.cache.reame_prefix_computing(
            tokens=prompt, points=[point], model=model, request_id="one"
        )
    assert here.cache._writer is not None
    monkeypatch.setattr(here.cache._writer, "submit", lambda snapshot: False)

    here.cache.reame_prefix_store(tokens=prompt[:point], state=b"state", model=model)

    assert here.stats()["snapshots_dropped"] == 1
    # Its own promise is gone: it waits for `elsewhere`, which is still computing it.
    assert here.cache.reame_prefix_pending(tokens=prompt, have=0, model=model) == point
    assert third.cache.reame_prefix_pending(tokens=prompt, have=0, model=model) == point
    elsewhere.cache.reame_prefix_computing(tokens=prompt, points=[], model=model, request_id="one")
    assert third.cache.reame_prefix_pending(tokens=prompt, have=0, model=model) is None
