from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from palimpsest_testing import FinishedSequence, StartArchive, accepted

from reame_core.backend.fake import FakeBackend, FakeVocabulary
from reame_core.cli import main as cli_main
from reame_core.engine.engine import Engine
from reame_core.errors import RequestError
from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import DraftRequest
from reame_core.plugins import PluginHost
from reame_core.request import GenerationRequest, SamplingParams
from reame_core.runtime import start_runtime
from reame_core.settings import Settings
from reame_palimpsest import record_format
from reame_palimpsest.plugin import Palimpsest

PROMPT = "Describe the lighthouse keeper's lantern for the harbour catalogue:"


def segment_files(archive_dir: Path) -> list[Path]:
    return sorted((archive_dir / "v1").glob("*/*.seg"))


def archived(archive_dir: Path) -> list[record_format.Record]:
    records = []
    for path in segment_files(archive_dir):
        records += record_format.scan(path.read_bytes(), final=True).records
    return records


def test_a_repeated_request_drafts_from_the_archive_and_generates_the_same_tokens(
    start_archive: StartArchive,
) -> None:
    server = start_archive()
    prompt = server.text(PROMPT)

    first = server.generate(prompt)
    second = server.generate(prompt)

    assert accepted(first) == 0
    assert accepted(second) > 0
    assert server.tokens(first) == server.tokens(second) == server.reference(prompt)


def test_a_second_process_drafts_from_the_firsts_archive(start_archive: StartArchive) -> None:
    writer, reader = start_archive(), start_archive()
    prompt = writer.text(PROMPT)

    writer.generate(prompt)
    assert reader.archive.flush()  # a poll: other writers' new records are read
    again = reader.generate(prompt)

    assert accepted(again) > 0
    assert reader.tokens(again) == reader.reference(prompt)
    assert reader.stats()["records_read"] == 1


def test_what_is_recorded_is_the_prompts_tail_then_the_output(
    start_archive: StartArchive, archive_dir: Path
) -> None:
    server = start_archive({"prompt_tokens": 8})
    prompt = server.text(PROMPT)

    output = server.tokens(server.generate(prompt))

    (record,) = archived(archive_dir)
    assert record.prompt_tail == 8
    assert record.tokens.tolist() == prompt[-8:] + output


def test_a_request_that_opts_out_is_neither_recorded_nor_drafted(
    start_archive: StartArchive, archive_dir: Path
) -> None:
    server = start_archive()
    prompt = server.text(PROMPT)

    server.generate(prompt, extensions={"palimpsest": False})
    assert archived(archive_dir) == []

    server.generate(prompt)
    opted_out = server.generate(prompt, extensions={"palimpsest": False})
    assert accepted(opted_out) == 0
    assert len(archived(archive_dir)) == 1


def test_a_server_that_does_not_record_still_drafts_from_the_archive(
    start_archive: StartArchive, archive_dir: Path
) -> None:
    recording = start_archive()
    silent = start_archive({"record": False})
    prompt = silent.text(PROMPT)

    silent.generate(prompt)
    assert archived(archive_dir) == []
    recording.generate(prompt)
    assert silent.archive.flush()

    assert accepted(silent.generate(prompt)) > 0
    assert len(archived(archive_dir)) == 1


@pytest.mark.parametrize("reason", ["abandoned", "cancelled", "error"])
def test_generations_cut_short_are_not_recorded(
    start_archive: StartArchive, archive_dir: Path, reason: str
) -> None:
    server = start_archive()
    seq = FinishedSequence(server.text(PROMPT), server.text(" a brass lantern")[1:])

    server.archive.reame_generation_finished(seq=seq, finish_reason=reason, text="")
    server.archive.reame_generation_finished(seq=seq, finish_reason="length", text="")
    assert server.archive.flush()

    assert len(archived(archive_dir)) == 1
    assert server.stats()["not_recorded"] == 1


def test_the_request_field_must_be_a_boolean(start_archive: StartArchive) -> None:
    server = start_archive()
    request = GenerationRequest(server.text(PROMPT), extensions={"palimpsest": "no"})

    with pytest.raises(RequestError) as refused:
        server.engine.check(request)

    assert refused.value.param == "palimpsest"


class OtherVocabulary(FakeVocabulary):
    """Another tokenizer: the same ids spell other bytes."""

    def pieces(self) -> Sequence[bytes]:
        return [piece[::-1] + b"~" for piece in super().pieces()]


def test_a_tokenizer_never_drafts_from_another_tokenizers_records(
    start_archive: StartArchive, archive_dir: Path
) -> None:
    writer = start_archive()
    other = start_archive(vocab=OtherVocabulary())
    prompt = writer.text(PROMPT)

    writer.generate(prompt)
    assert other.archive.flush()

    assert accepted(other.generate(prompt)) == 0
    assert other.stats()["records_read"] == 0
    assert len({p.parent.name for p in segment_files(archive_dir)}) == 2  # one each


def test_a_corrupted_segment_is_skipped_and_reported(
    start_archive: StartArchive, archive_dir: Path
) -> None:
    writer = start_archive()
    prompts = [writer.text(f"{PROMPT} item {i}") for i in range(3)]
    for prompt in prompts:
        writer.generate(prompt)
    (segment,) = segment_files(archive_dir)
    data = bytearray(segment.read_bytes())
    second = data.find(record_format.MAGIC, len(record_format.MAGIC))
    data[second + record_format.HEADER_SIZE + 3] ^= 0xFF  # in the second record's payload
    segment.write_bytes(bytes(data))

    writer.engine.stop()
    reader = start_archive()

    stats = reader.stats()
    assert stats["records_read"] == 2
    assert stats["frames_damaged"] == 1
    assert stats["segments_damaged"] == 1
    assert accepted(reader.generate(prompts[2])) > 0


def test_eviction_keeps_the_archive_within_its_budget_and_forgets_what_it_deleted(
    start_archive: StartArchive, archive_dir: Path
) -> None:
    budget = 16 << 10
    server = start_archive({"budget": budget, "segment_bytes": 4096})
    prompts = [server.text(f"Catalogue entry {i:03d}: {PROMPT}") for i in range(120)]
    for prompt in prompts:
        server.generate(prompt, speculate="off")

    assert server.archive.flush()

    assert sum(p.stat().st_size for p in segment_files(archive_dir)) <= budget
    assert server.stats()["segments_evicted"] > 0
    on_disk = sum(len(r.tokens) for r in archived(archive_dir))
    assert 0 < on_disk < sum(len(p) + 32 for p in prompts)
    assert server.stats()["index_tokens"] == on_disk


def test_lookups_wait_for_nothing_while_the_archive_loads(tmp_path: Path) -> None:
    loading = threading.Event()

    class SlowVocabulary(FakeVocabulary):
        def pieces(self) -> Sequence[bytes]:
            loading.wait(30)
            return super().pieces()

    backend = FakeBackend(vocab=SlowVocabulary())
    archive = Palimpsest()
    settings = Settings(plugins={"palimpsest": {"dir": str(tmp_path)}})
    archive.reame_configure(settings=settings, model=backend.info)
    try:
        seq = FinishedSequence([1, 2, 3, 4, 5], [6, 7, 8])
        assert archive.reame_propose_drafts([DraftRequest(seq, 8)]) == []
        assert archive.reame_collect_stats() is not None
        assert not archive.archivist or not archive.archivist.ready.is_set()
    finally:
        loading.set()
        archive.reame_shutdown()


def test_stats_and_purge_commands(
    start_archive: StartArchive, archive_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = start_archive()
    prompt = server.text(PROMPT)
    server.generate(prompt)

    assert cli_main.main(["palimpsest", "stats", "--palimpsest-dir", str(archive_dir)]) == 0
    shown = capsys.readouterr().out
    assert "1 segments" in shown and str(archive_dir) in shown

    assert cli_main.main(["palimpsest", "purge", "--palimpsest-dir", str(archive_dir)]) == 0
    assert "Deleted 1 segments" in capsys.readouterr().out
    assert segment_files(archive_dir) == []
    assert server.archive.flush()  # the running server forgets the purged records
    assert server.stats()["index_tokens"] == 0
    assert accepted(server.generate(prompt)) == 0


def test_the_record_flag_turns_recording_off() -> None:
    parser = cli_main.build_parser(PluginHost())

    recording = parser.parse_args(["serve"])
    silent = parser.parse_args(["serve", "--palimpsest-no-record"])

    assert "palimpsest" not in cli_main.settings_from(recording).plugins
    assert cli_main.settings_from(silent).plugins["palimpsest"]["record"] is False


def test_palimpsest_is_discovered_through_its_entry_point() -> None:
    record = next(r for r in PluginHost().records() if r.name == "palimpsest")

    assert record.enabled
    assert record.distribution == "reame-palimpsest"
    assert {"reame_propose_drafts", "reame_generation_finished"} <= set(record.hooks)


def test_disabling_the_plugin_leaves_no_trace(tmp_path: Path) -> None:
    record = next(r for r in PluginHost(["palimpsest"]).records() if r.name == "palimpsest")
    assert not record.enabled and record.hooks == ()

    settings = Settings(cache_dir=tmp_path, disable_plugins=["palimpsest"])
    outputs = []
    for _ in range(2):
        runtime = start_runtime(settings, backend=FakeBackend(), plugins=PluginHost(["palimpsest"]))
        try:
            prompt = FakeBackend().tokenize(PROMPT, add_special=True, parse_special=False)
            finished = runtime.engine.generate(
                GenerationRequest(prompt, SamplingParams(max_tokens=16))
            )
        finally:
            runtime.close()
        outputs.append(finished.candidates[0].tokens)
        assert "palimpsest" not in finished.usage.draft_proposed

    assert outputs[0] == outputs[1]
    assert not (tmp_path / "palimpsest").exists()


def test_records_hold_uint32_tokens() -> None:
    tokens = np.array([0, 1, 2**32 - 2], dtype=np.uint32)
    (record,) = record_format.scan(record_format.encode(tokens, 1)).records
    assert record.tokens.tolist() == tokens.tolist() and record.prompt_tail == 1


class Unanimous:
    @hookimpl
    def reame_answer_extractors(self) -> dict[str, Any]:
        return {"same": lambda text, argument: "x"}


def test_candidates_a_vote_stopped_are_not_recorded(archive_dir: Path) -> None:
    conclave = pytest.importorskip("reame_conclave.plugin")
    backend = FakeBackend(eos_every=5, n_seq_max=8)
    archive = Palimpsest()
    host = PluginHost(discover=False)
    host.register(archive, "palimpsest")
    host.register(conclave.Conclave(), "conclave")
    host.register(Unanimous(), "unanimous")
    settings = Settings(plugins={"palimpsest": {"dir": str(archive_dir)}})
    host.hook.reame_configure(settings=settings, model=backend.info, hook=host.hook)
    assert archive.archivist is not None and archive.archivist.ready.wait(30)
    engine = Engine(backend, host, speculate="off").start()
    try:
        # Every answer agrees: the majority rule stops the rest once the winner cannot change.
        vote = {"rule": "majority", "answer": "same"}
        params = SamplingParams(max_tokens=40, temperature=0.8, seed=3)
        finish = engine.generate(
            GenerationRequest([1, 2, 3], params, extensions={"best_of": 8, "vote": vote})
        )
    finally:
        engine.stop()
    assert archive.flush()

    report = finish.report["conclave"]
    assert report["stopped"] > 0
    assert len(archived(archive_dir)) == report["finished"]
    assert archive.reame_collect_stats()["palimpsest"]["not_recorded"] == report["stopped"]
