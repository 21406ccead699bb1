"""The `palimpsest` plugin: a draft source over the archive of finished generations.

On the engine thread: `reame_propose_drafts` looks the sequence's last tokens up in the
indexes the archive's thread last published (tens of µs, a few hundred right after a
decode; nothing while they are not built yet), each draft labelled with the length of its
match (`kind_of`), and `reame_generation_finished` queues a finished generation for that thread.
Everything that touches the disk happens there (`Archivist`).

What is recorded: for a candidate that finished "stop" or "length" (never one cut short:
"abandoned" by best-of-N selection, "cancelled", "error"), the last `prompt_tokens` tokens
of its prompt and its whole output, as token ids, under its tokenizer's fingerprint. Not
recorded: a request that says ``"palimpsest": false`` (nor is it drafted for from the
archive), or any request when the section says ``record = false``. The target model
verifies every drafted token, as for every draft source.

Whole answers too (`answers.py`, unless ``recall = false``): a request whose answer it
alone fixes (`reame_core.engine.recall`) is kept under its key when it ends complete
(`reame_remember_answer`), and the same request is answered from there after
(`reame_recall_answer`), not computed. A request that says ``"palimpsest": false`` is
neither kept nor answered from the shelf.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from pydantic import ValidationError

from reame_core.errors import RequestError
from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import (
    DISK_FAULTS,
    DiskNeed,
    DraftProposal,
    DraftRequest,
    ModelInfo,
    RecalledAnswer,
    SequenceView,
)
from reame_core.request import GenerationRequest
from reame_core.settings import Settings
from reame_palimpsest import cli
from reame_palimpsest.answers import AnswerShelf
from reame_palimpsest.archive_index import ANCHORS, MAX_MATCH, kind_of, lookup
from reame_palimpsest.archivist import Archivist
from reame_palimpsest.settings import (
    BUDGET_CAP,
    BUDGET_SHARE_OF_FREE_DISK,
    NAME,
    PalimpsestSettings,
)

FIELD = "palimpsest"
RECORDED = frozenset({"stop", "length"})


class Palimpsest:
    """See the module docstring. One instance serves one runtime at a time."""

    def __init__(self) -> None:
        self.settings = PalimpsestSettings.model_validate({})
        self.archivist: Archivist | None = None
        self.shelf: AnswerShelf | None = None
        self.lookups = 0
        self.drafts = 0
        self.lookup_seconds = 0.0
        self.not_recorded = 0  # finished generations left out: opted out, cut short

    # ------------------------------------------------------------ command line

    @hookimpl
    def reame_add_options(self, parser: argparse.ArgumentParser) -> None:
        cli.add_options(parser)

    @hookimpl
    def reame_add_commands(self, commands: argparse._SubParsersAction[Any]) -> None:
        cli.add_command(commands)

    # ----------------------------------------------------------------- planning

    @hookimpl
    def reame_disk_need(self, settings: Settings) -> DiskNeed:
        try:
            section = settings.plugin_section(NAME, PalimpsestSettings)
            directory = section.directory(settings.cache_path)
        except ValidationError:  # refused at configure, with its message
            directory = None
        return DiskNeed(
            NAME,
            "the archive of finished generations",
            BUDGET_SHARE_OF_FREE_DISK,
            BUDGET_CAP,
            directory=directory,
        )

    # ---------------------------------------------------------------- lifecycle

    @hookimpl
    def reame_configure(self, settings: Settings, model: ModelInfo) -> None:
        self.reame_shutdown()
        section = settings.plugin_section(NAME, PalimpsestSettings)
        self.settings = section
        anchors = sorted({k for k in ANCHORS if k > section.min_match} | {section.min_match})
        root = section.directory(settings.cache_path)
        self.archivist = Archivist(
            root,
            model.vocab.pieces,
            budget=section.budget_bytes(),
            memory_tokens=section.memory_tokens,
            segment_bytes=int(section.segment_bytes),
            poll_seconds=section.poll_seconds,
            anchors=anchors,
        )
        if section.recall:
            self.shelf = AnswerShelf(root, int(section.recall_budget))

    @hookimpl
    def reame_request_extensions(self) -> Mapping[str, str]:
        return {FIELD: "false: neither record this request in the generation archive nor "
                "draft it from there"}  # fmt: skip

    @hookimpl
    def reame_check_request(self, request: GenerationRequest, model: ModelInfo) -> None:
        value = request.extensions.get(FIELD)
        if value is not None and not isinstance(value, bool):
            raise RequestError(f"'{FIELD}' must be true or false", param=FIELD)

    def flush(self, timeout_s: float = 60.0) -> bool:
        """Wait until the generations finished so far are archived and indexed, and other
        processes' records read (tests, benchmarks, applications that exit right after a
        request); False on timeout."""
        shelved = self.shelf.flush(timeout_s) if self.shelf is not None else True
        return shelved and (self.archivist.flush(timeout_s) if self.archivist else True)

    @hookimpl
    def reame_shutdown(self) -> None:
        if self.archivist is not None:
            self.archivist.close()
            self.archivist = None
        if self.shelf is not None:
            self.shelf.close()
            self.shelf = None

    # ------------------------------------------------------------------ answers

    @hookimpl
    def reame_remember_answer(
        self, request: GenerationRequest, key: str, answer: RecalledAnswer
    ) -> None:
        if (
            self.shelf is not None
            and self.settings.record
            and request.extensions.get(FIELD) is not False
        ):
            self.shelf.remember(key, answer)

    @hookimpl
    def reame_recall_answer(
        self, request: GenerationRequest, key: str, model: ModelInfo
    ) -> RecalledAnswer | None:
        if self.shelf is None or request.extensions.get(FIELD) is False:
            return None
        return self.shelf.recall(key)

    # ----------------------------------------------------------------- drafting

    @hookimpl
    def reame_propose_drafts(self, requests: Sequence[DraftRequest]) -> list[DraftProposal]:
        archivist = self.archivist
        indexes = archivist.indexes if archivist is not None else ()
        if not indexes:
            return []
        s = self.settings
        proposals = []
        for request in requests:
            seq = request.seq
            if seq.extensions.get(FIELD) is False:
                continue
            started = time.perf_counter()
            tail = _tail(seq)
            drafted = lookup(
                tail,
                indexes,
                request.max_tokens,
                factor=s.draft_factor,
                min_share=s.min_share,
                min_backing=s.min_backing,
            )
            self.lookup_seconds += time.perf_counter() - started
            self.lookups += 1
            if drafted.tokens:
                self.drafts += 1
                proposals.append(
                    DraftProposal(seq, NAME, drafted.tokens, kind=kind_of(drafted.match))
                )
        return proposals

    @hookimpl
    def reame_generation_finished(self, seq: SequenceView, finish_reason: str, text: str) -> None:
        archivist = self.archivist
        if archivist is None or not self.settings.record:
            return
        output = seq.output_tokens
        if finish_reason not in RECORDED or seq.extensions.get(FIELD) is False or not output:
            self.not_recorded += 1
            return
        keep = self.settings.prompt_tokens
        prompt = seq.prompt_tokens[max(0, len(seq.prompt_tokens) - keep) :] if keep else []
        tokens = np.fromiter((*prompt, *output), dtype=np.uint32, count=len(prompt) + len(output))
        archivist.submit(tokens, len(prompt))

    # ---------------------------------------------------------------- reporting

    @hookimpl
    def reame_describe(self) -> str:
        recording = "recording" if self.settings.record else "not recording"
        return f"drafts from the archive of past generations ({recording}; reame palimpsest stats)"

    @hookimpl
    def reame_collect_stats(self) -> Mapping[str, Mapping[str, Any]] | None:
        archivist = self.archivist
        stats: dict[str, Any] = {
            "lookups": self.lookups,
            "drafts": self.drafts,
            "lookup_us_mean": round(1e6 * self.lookup_seconds / max(1, self.lookups), 2),
            "not_recorded": self.not_recorded,
        }
        if self.shelf is not None:
            stats.update({f"answers_{k}": v for k, v in vars(self.shelf.counters).items()})
        if archivist is not None:
            stats["ready"] = archivist.ready.is_set()
            stats["index_tokens"] = archivist.index_tokens
            stats.update(vars(archivist.counters))
            if archivist.directory is not None:
                stats.update(vars(archivist.directory.counters))
        faults = {
            "damaged_record": stats.get("frames_damaged", 0),
            "write_error": stats.get("write_errors", 0),
            "directory_unusable": stats.get("directory_unusable", 0),
        }
        return {NAME: stats, DISK_FAULTS: {NAME: faults}}


def _tail(seq: SequenceView) -> list[int]:
    """The sequence's last MAX_MATCH tokens (prompt, then output)."""
    output = seq.output_tokens
    if len(output) >= MAX_MATCH:
        return list(output[len(output) - MAX_MATCH :])
    prompt = seq.prompt_tokens
    return [*prompt[max(0, len(prompt) - MAX_MATCH + len(output)) :], *output]


plugin = Palimpsest()

# The `reame` entry point names this module: pluggy registers the hooks it finds here,
# which are the instance's.
reame_add_options = plugin.reame_add_options
reame_add_commands = plugin.reame_add_commands
reame_disk_need = plugin.reame_disk_need
reame_configure = plugin.reame_configure
reame_request_extensions = plugin.reame_request_extensions
reame_check_request = plugin.reame_check_request
reame_shutdown = plugin.reame_shutdown
reame_propose_drafts = plugin.reame_propose_drafts
reame_generation_finished = plugin.reame_generation_finished
reame_remember_answer = plugin.reame_remember_answer
reame_recall_answer = plugin.reame_recall_answer
reame_describe = plugin.reame_describe
reame_collect_stats = plugin.reame_collect_stats
