"""Remembered answers: a repeated request is answered from the shelf with the same output,
by this process or another on the same directory; damaged files are dropped and the
request computed; the budget holds; opting out and `recall = false` are honoured."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from palimpsest_testing import StartArchive

from reame_core.hooktypes import RecalledAnswer
from reame_core.plugins import PluginHost
from reame_core.settings import Settings
from reame_palimpsest import answers, cli
from reame_palimpsest.answers import AnswerShelf
from reame_palimpsest.plugin import Palimpsest

PROMPT = "Tag this order for the night batch: 12 lanterns, brass, harbour office."
ANSWER = RecalledAnswer((5, 6, 7), "brass lanterns", "stop")
KEY = "ab" + "c" * 62


def shelf_file(root: Path, key: str = KEY) -> Path:
    return root / answers.LAYOUT / key[:2] / key[2:]


def test_an_answer_kept_by_one_shelf_is_recalled_by_another(tmp_path: Path) -> None:
    writer, reader = AnswerShelf(tmp_path, 1 << 20), AnswerShelf(tmp_path, 1 << 20)
    try:
        assert reader.recall(KEY) is None
        writer.remember(KEY, ANSWER)
        assert writer.flush()

        assert reader.recall(KEY) == ANSWER
        assert reader.recall("cd" + "e" * 62) is None
    finally:
        writer.close()
        reader.close()


def test_a_damaged_answer_is_deleted_and_reported_missing(tmp_path: Path) -> None:
    shelf = AnswerShelf(tmp_path, 1 << 20)
    try:
        shelf.remember(KEY, ANSWER)
        assert shelf.flush()
        path = shelf_file(tmp_path)
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.write_bytes(bytes(data))

        assert shelf.recall(KEY) is None
        assert not path.exists()
        assert shelf.counters.damaged == 1
    finally:
        shelf.close()


def test_an_answer_filed_under_another_key_is_not_returned(tmp_path: Path) -> None:
    shelf = AnswerShelf(tmp_path, 1 << 20)
    other = "cd" + "e" * 62
    try:
        shelf.remember(KEY, ANSWER)
        assert shelf.flush()
        shelf_file(tmp_path, other).parent.mkdir(parents=True)
        shelf_file(tmp_path).rename(shelf_file(tmp_path, other))

        assert shelf.recall(other) is None
    finally:
        shelf.close()


def test_the_shelf_stays_within_its_budget_dropping_the_oldest(tmp_path: Path) -> None:
    long_answer = RecalledAnswer(tuple(range(400)), "x" * 2000, "length")
    shelf = AnswerShelf(tmp_path, 20_000)
    keys = [f"{i:02x}" + "0" * 62 for i in range(60)]
    try:
        for key in keys:
            shelf.remember(key, long_answer)
            assert shelf.flush()  # one at a time: their files' ages differ
        files, size = answers.usage(tmp_path)

        assert size <= 20_000
        assert 0 < files < len(keys)
        assert shelf.recall(keys[-1]) == long_answer
        assert shelf.recall(keys[0]) is None
    finally:
        shelf.close()


def test_a_leftover_temporary_file_is_neither_counted_nor_read(tmp_path: Path) -> None:
    path = shelf_file(tmp_path)
    path.parent.mkdir(parents=True)
    path.with_name(f".{path.name}.999.tmp").write_bytes(b"RMA1 half written")
    shelf = AnswerShelf(tmp_path, 1 << 20)
    try:
        assert answers.usage(tmp_path) == (0, 0)
        assert shelf.recall(KEY) is None
    finally:
        shelf.close()


def test_the_installed_plugin_exports_every_hook_its_class_implements() -> None:
    from reame_palimpsest import plugin as module

    hooks = [name for name in dir(Palimpsest) if name.startswith("reame_")]
    installed = PluginHost()

    assert [name for name in hooks if not hasattr(module, name)] == []
    assert installed.has_implementations("reame_recall_answer")
    assert installed.has_implementations("reame_remember_answer")


def test_a_repeated_request_is_recalled_not_computed(start_archive: StartArchive) -> None:
    server = start_archive({"recall": True})
    prompt = server.text(PROMPT)

    first = server.generate(prompt)
    decodes = len(server.backend.batch_sizes)
    again = server.generate(prompt)

    assert len(server.backend.batch_sizes) == decodes
    assert again.candidates == first.candidates
    assert again.usage.recalled_tokens == len(first.candidates[0].tokens)
    assert server.stats()["answers_recalled"] == 1


def test_another_process_recalls_what_the_first_answered(start_archive: StartArchive) -> None:
    writer, reader = start_archive({"recall": True}), start_archive({"recall": True})
    prompt = writer.text(PROMPT)

    first = writer.generate(prompt)
    again = reader.generate(prompt)

    assert again.usage.recalled_tokens > 0
    assert again.candidates == first.candidates


def test_opting_out_or_recall_off_computes_every_request(start_archive: StartArchive) -> None:
    server = start_archive({"recall": True})
    off = start_archive({"recall": False})
    prompt = server.text(PROMPT)
    private = {"palimpsest": False}

    server.generate(prompt, extensions=private)
    private_again = server.generate(prompt, extensions=private)
    server.generate(prompt)
    recall_off = off.generate(prompt)

    assert private_again.usage.recalled_tokens == 0
    assert recall_off.usage.recalled_tokens == 0
    assert answers.usage(server.archive.shelf.path.parent)[0] == 1  # only the one not opted out


def test_purge_deletes_the_answers_and_stats_shows_them(
    start_archive: StartArchive, archive_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = start_archive({"recall": True})
    server.generate(server.text(PROMPT))
    settings = Settings(plugins={"palimpsest": {"dir": str(archive_dir)}})

    cli.palimpsest_command(settings, argparse.Namespace(action="stats"))
    stats = capsys.readouterr().out
    cli.palimpsest_command(settings, argparse.Namespace(action="purge"))
    purged = capsys.readouterr().out

    assert "1 kept" in stats
    assert "1 remembered answers" in purged
    assert answers.usage(archive_dir) == (0, 0)
