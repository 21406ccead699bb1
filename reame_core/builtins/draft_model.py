"""Draft model: a smaller model of the same vocabulary guesses the target's next tokens.

Active when ``--draft-model NAME|PATH`` is set. The draft runs in its own llama.cpp context
on the engine thread, with one sequence mirroring each of the target's decoding sequences.
It drafts from a Q4_0 copy of the file (`reame_core.models.draft_copy`): the format
llama.cpp's CPU kernels run fastest, which can halve what a drafted token costs. Before each
proposal a mirror catches up with its sequence (prompt at first, then what was committed
since) after cutting back whatever the target rejected, so rollback needs no message; a new
mirror whose sequence starts as another mirror's does (a shared system prompt) copies that
start from it instead of computing it again. Drafts are the draft model's argmax, batched
across sequences, one decode per drafted position; a sequence stops drafting when the draft
model is unsure of its guess. Proposals are deterministic (q one-hot), which keeps
speculative sampling exact too.

Before the engine's first step it times a few of its own decodes, on the engine thread, and
gives the governor what a call costs (`reame_draft_cost`), so that on a host where it is
too slow next to verification it is never asked, not even once to read a prompt and show it.
Priced out so, it is asked to time them again now and then: a neighbour busy at start must
not keep it out for good.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import structlog
from pydantic import BaseModel, ConfigDict, Field

from reame_core.backend.base import Batch, DecodeError
from reame_core.engine.slots import common_prefix
from reame_core.errors import ModelLoadError
from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import (
    DraftCost,
    DraftProposal,
    DraftRequest,
    ModelInfo,
    SequenceView,
)
from reame_core.models.shape import KV_TYPE_BYTES, KVType
from reame_core.settings import Settings

if TYPE_CHECKING:
    from reame_core.backend.llama import LlamaBackend

log = structlog.get_logger(__name__)

NAME = "draft_model"
# Fewer tokens shared with another mirror are read again rather than copied from it.
MIN_COPIED = 32
# Decoded once, untimed, before the timed decodes: a fresh context's first decodes are slow.
WARM_UP_TEXT = "def mean(values: list[float]) -> float:\n    return sum(values) / len(values)\n"


class DraftModelSettings(BaseModel):
    """``[plugins.draft_model]``: when a guess is too unsure to propose, and which file
    drafts."""

    model_config = ConfigDict(extra="forbid")

    min_confidence: float = Field(
        0.5, ge=0.0, le=1.0, description="Stop a draft at a token the draft model gives less."
    )
    weights: Literal["q4_0", "file"] = Field(
        "q4_0",
        description="q4_0: draft from a Q4_0 copy of the model (made once under the cache "
        "directory), the format llama.cpp's CPU kernels run fastest; file: from the file as "
        "it is. Answers are the same either way: the target verifies every draft.",
    )


@dataclass
class _Mirror:
    seq_id: int
    tokens: list[int] = field(default_factory=list)  # held in the draft model's KV


class DraftModel:
    def __init__(self) -> None:
        self.settings = DraftModelSettings.model_validate({})
        self.backend: LlamaBackend | None = None
        self.cost: DraftCost | None = None
        self._longest = 32  # the longest draft it may be asked for (`draft_max`)
        self._mirrors: dict[int, _Mirror] = {}
        self._free: list[int] = []

    @hookimpl
    def reame_configure(self, settings: Settings, model: ModelInfo) -> None:
        self.settings = settings.plugin_section(NAME, DraftModelSettings)
        name = draft_model_name(settings)
        if name is None:
            return
        from reame_core.models import ModelStore
        from reame_core.models.draft_copy import q4_0_copy

        draft = ModelStore.in_cache_dir(settings.cache_path).resolve(name)
        copy = None
        if self.settings.weights == "q4_0":
            copy = q4_0_copy(draft.path, settings.cache_path, threads=model.n_threads)
        backend = None
        if copy is not None:
            try:
                backend = load_draft(copy, draft.name, model)
            except ModelLoadError as error:
                log.warning(
                    "the Q4_0 copy of the draft model did not load; removed, drafting from "
                    "its file",
                    copy=str(copy),
                    error=str(error),
                )
                copy.unlink(missing_ok=True)
                copy = None
        if backend is None:
            backend = load_draft(draft.path, draft.name, model)
        try:
            check_same_vocabulary(model, backend.info)
        except ModelLoadError:
            backend.close()
            if copy is not None:
                copy.unlink(missing_ok=True)  # no use to keep for a model it cannot serve
            raise
        self.backend = backend
        self._free = list(range(model.n_seq_max - 1, -1, -1))
        self._longest = max(1, settings.draft_max)
        log.info("draft model loaded", draft=draft.name, file=backend.path.name, target=model.name)

    @hookimpl
    def reame_draft_cost(self) -> DraftCost | None:
        if self.backend is None or not self._free:  # every sequence of it mirrors a request
            return None
        # On the engine thread, where its calls will run; anew each time it is asked.
        self.cost = time_a_call(self.backend, self._free[-1], drafted=self._longest)
        log.info(
            "draft model timed",
            ms_per_drafted_token=round(self.cost.seconds / self.cost.drafted * 1000, 2),
        )
        return self.cost

    @hookimpl
    def reame_describe(self) -> str:
        if self.backend is None:
            return "drafts with a smaller model: off (no --draft-model)"
        return f"drafts with {self.backend.info.name}"

    @hookimpl
    def reame_propose_drafts(self, requests: Sequence[DraftRequest]) -> list[DraftProposal] | None:
        backend = self.backend
        if backend is None:
            return None
        work = []
        for request in requests:
            mirror = self._mirror(request.seq)
            if mirror is not None:
                work.append((request, mirror))
        if not work:
            return None
        try:
            rows = self._catch_up(backend, work)
            drafts = self._draft(backend, work, rows)
        except DecodeError as error:
            log.warning("draft model failed; dropping its mirrors", error=str(error))
            for _request, mirror in work:
                backend.seq_rm(mirror.seq_id, 0)
                mirror.tokens.clear()
            return None
        return [
            DraftProposal(request.seq, NAME, tuple(tokens))
            for (request, _mirror), tokens in zip(work, drafts, strict=True)
            if tokens
        ]

    @hookimpl
    def reame_generation_finished(self, seq: SequenceView, finish_reason: str, text: str) -> None:
        mirror = self._mirrors.pop(seq.key, None)
        if mirror is not None and self.backend is not None:
            self.backend.seq_rm(mirror.seq_id, 0)
            self._free.append(mirror.seq_id)

    @hookimpl
    def reame_threads_changed(self, threads: int) -> None:
        if self.backend is not None:
            self.backend.set_threads(threads)

    @hookimpl
    def reame_shutdown(self) -> None:
        if self.backend is not None:
            self.backend.close()
            self.backend = None

    # ------------------------------------------------------------- drafting

    def _mirror(self, seq: SequenceView) -> _Mirror | None:
        mirror = self._mirrors.get(seq.key)
        if mirror is None:
            if not self._free:
                return None
            mirror = _Mirror(self._free.pop())
            self._mirrors[seq.key] = mirror
        return mirror

    def _catch_up(
        self, backend: LlamaBackend, work: list[tuple[DraftRequest, _Mirror]]
    ) -> list[np.ndarray]:
        """Bring every mirror to its sequence's tokens; the logits after the last one."""
        feeds = []
        for request, mirror in work:
            history = [*request.seq.prompt_tokens, *request.seq.output_tokens]
            keep = common_prefix(mirror.tokens, history)
            keep = min(keep, len(history) - 1)  # the last token is fed again for its logits
            if keep < len(mirror.tokens):
                backend.seq_rm(mirror.seq_id, keep)
                del mirror.tokens[keep:]
            keep = self._copy_shared_start(backend, mirror, history, keep)
            feeds.append(history[keep:])
        rows: list[np.ndarray | None] = [None] * len(work)
        batch, owners = Batch(), list[int]()
        room = backend.info.n_batch
        for index, ((_request, mirror), feed) in enumerate(zip(work, feeds, strict=True)):
            for offset, token in enumerate(feed):
                if len(batch) == room:
                    self._decode_into(backend, batch, owners, rows)
                    batch, owners = Batch(), []
                last = offset == len(feed) - 1
                batch.add(token, len(mirror.tokens), mirror.seq_id, last)
                mirror.tokens.append(token)
                if last:
                    owners.append(index)
        if len(batch):
            self._decode_into(backend, batch, owners, rows)
        caught_up = [row for row in rows if row is not None]
        assert len(caught_up) == len(work)  # every feed holds at least one token
        return caught_up

    def _copy_shared_start(
        self, backend: LlamaBackend, mirror: _Mirror, history: list[int], keep: int
    ) -> int:
        """Where `mirror` must read `history` from, once the longest start it shares with
        another mirror (a system prompt before another request) is copied from there
        instead of computed again; `keep` where no other mirror holds more of it."""
        if len(history) - 1 - keep < MIN_COPIED:
            return keep  # a mirror a few tokens behind, as at every step: nothing to copy
        donor, shared = None, keep
        for other in self._mirrors.values():
            if other is not mirror:
                common = min(common_prefix(other.tokens, history), len(history) - 1)
                if common > shared:
                    donor, shared = other, common
        if donor is None or shared - keep < MIN_COPIED:
            return keep
        backend.seq_cp(donor.seq_id, mirror.seq_id)
        backend.seq_rm(mirror.seq_id, shared)
        mirror.tokens[:] = history[:shared]
        return shared

    def _draft(
        self,
        backend: LlamaBackend,
        work: list[tuple[DraftRequest, _Mirror]],
        rows: list[np.ndarray],
    ) -> list[list[int]]:
        drafts: list[list[int]] = [[] for _ in work]
        live = list(range(len(work)))
        limit = self.settings.min_confidence
        while live:
            still = []
            for index in live:
                token, confidence = _argmax_with_confidence(rows[index])
                if confidence < limit:
                    continue
                drafts[index].append(token)
                if len(drafts[index]) < work[index][0].max_tokens:
                    still.append(index)
            live = still
            if not live:
                break
            batch = Batch()
            for index in live:
                mirror = work[index][1]
                batch.add(drafts[index][-1], len(mirror.tokens), mirror.seq_id, True)
                mirror.tokens.append(drafts[index][-1])
            logits = backend.decode(batch)
            for row, index in enumerate(live):
                rows[index] = np.array(logits[row], copy=True)
        return drafts

    @staticmethod
    def _decode_into(
        backend: LlamaBackend, batch: Batch, owners: list[int], rows: list[np.ndarray | None]
    ) -> None:
        logits = backend.decode(batch)
        for row, index in enumerate(owners):
            rows[index] = np.array(logits[row], copy=True)


def load_draft(path: Path, name: str, model: ModelInfo) -> LlamaBackend:
    """The draft model's context, sized and loaded as the target's was."""
    from reame_core.backend.llama import LlamaBackend

    type_k, type_v = _kv_types(model.kv_type)
    return LlamaBackend(
        path,
        n_ctx_seq=model.n_ctx_seq,
        n_seq_max=model.n_seq_max,
        n_batch=model.n_batch,
        n_threads=model.n_threads,
        name=name,
        # Load the way the target was: the build check may have ruled out the default,
        # and the host plan chose the faster attention for this CPU and its KV types, and
        # whether memory allows the weights read.
        use_extra_bufts=bool(model.extra.get("use_extra_bufts", True)),
        flash_attn=bool(model.extra.get("flash_attn", True)),
        weights="read" if model.extra.get("weights") == "read" else "mapped",
        type_k=type_k,
        type_v=type_v,
    )


def draft_model_name(settings: Settings) -> str | None:
    """The draft model to load: ``--draft-model``, where ``auto`` means the one the target's
    alias card names (none for models without a card or a same-vocabulary partner)."""
    if settings.draft_model != "auto":
        return settings.draft_model
    from reame_core.models.registry import card_for

    card = card_for(settings.model)
    if card is None or card.draft is None:
        log.info("no default draft model for this model", model=settings.model)
        return None
    return card.draft


def time_a_call(backend: LlamaBackend, seq_id: int, drafted: int, timed: int = 8) -> DraftCost:
    """What a call that reads one committed token and drafts `drafted` tokens (the longest
    draft asked for: the one that could pay best) costs: that many one-token decodes, each
    row read as drafting reads it, priced at the median of `timed` of them (one slow decode
    on a shared host does not decide). A short text is decoded first, untimed, in sequence
    `seq_id` (left empty afterwards): no later call pays a fresh context's first decodes."""
    tokens = backend.tokenize(WARM_UP_TEXT, add_special=False, parse_special=False)
    batch = Batch()
    for position, token in enumerate(tokens):
        batch.add(token, position, seq_id, position == len(tokens) - 1)
    seconds = []
    try:
        token, _ = _argmax_with_confidence(np.array(backend.decode(batch)[0], copy=True))
        for position in range(len(tokens), len(tokens) + timed):
            started = time.perf_counter()
            step = Batch()
            step.add(token, position, seq_id, True)
            token, _ = _argmax_with_confidence(np.array(backend.decode(step)[0], copy=True))
            seconds.append(time.perf_counter() - started)
    finally:  # the sequence is a free one, handed out empty to the next request
        backend.seq_rm(seq_id, 0)
    return DraftCost(drafted * statistics.median(seconds), drafted, caught_up=1)


def check_same_vocabulary(target: ModelInfo, draft: ModelInfo) -> None:
    """Refuse a draft model whose token ids mean other text than the target's."""
    theirs, mine = target.vocab.pieces(), draft.vocab.pieces()
    if len(mine) != len(theirs):
        raise ModelLoadError(
            f"The draft model {draft.name} has {len(mine)} tokens but {target.name} has "
            f"{len(theirs)}: a draft model must share the target's vocabulary."
        )
    for token, (piece, other) in enumerate(zip(theirs, mine, strict=True)):
        if other != piece:
            raise ModelLoadError(
                f"The draft model {draft.name} does not share {target.name}'s vocabulary: "
                f"token {token} is {other!r} there and {piece!r} here."
            )


def _argmax_with_confidence(row: np.ndarray) -> tuple[int, float]:
    token = int(np.argmax(row))
    shifted = np.exp(row - row[token])
    return token, float(1.0 / shifted.sum())


def _kv_types(kv_type: str) -> tuple[KVType | None, KVType | None]:
    """The target's KV types from its `ModelInfo.kv_type` ("f16", or "q8_0/f16" where they
    differ); None for what names no llama.cpp type (a fake backend's), the draft's default."""
    keys, _, values = kv_type.partition("/")
    values = values or keys
    if keys in KV_TYPE_BYTES and values in KV_TYPE_BYTES:
        return keys, values
    return None, None
