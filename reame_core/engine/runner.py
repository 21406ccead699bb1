"""The model runner: runs the scheduler's batches through the backend, and times them.

It owns how the model runs: each `backend.decode` with its timing (the counters, and the
governor's `DecodeCost` when anything can draft), the decoding thread count that follows
the CPU the neighbours leave (`CpuShare`, hook `reame_threads_changed`), and the
recomputation of a pinned session's answer as prompt chunks. It decides nothing about
what to decode (the scheduler) and reads no logits (the committer).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import structlog

from reame_core.backend.base import Backend, Batch, DecodeError
from reame_core.engine.cpu_share import CpuShare
from reame_core.engine.governor import Governor
from reame_core.engine.scheduler import DecodeCall
from reame_core.engine.slots import KVSlots
from reame_core.engine.stats import EngineStats

log = structlog.get_logger(__name__)


class ModelRunner:
    def __init__(
        self,
        backend: Backend,
        slots: KVSlots,
        governor: Governor,
        hook: Any,
        stats: EngineStats,
        cpu_share: CpuShare | None,
    ) -> None:
        self.backend = backend
        self.slots = slots
        self.governor = governor
        self.hook = hook
        self.stats = stats
        self.cpu_share = cpu_share
        self._drafting = bool(governor.sources)

    def run(self, call: DecodeCall) -> tuple[np.ndarray, float] | None:
        """Decode one call: its logits rows (valid until the next decode) and the seconds
        it took, or None when the backend could not decode it."""
        started = time.perf_counter()
        try:
            logits = self.backend.decode(call.batch)
        except DecodeError as error:
            self.stats.decode_errors += 1
            log.error("decode failed", error=str(error), batch=len(call.batch))
            return None
        finally:
            if call.fillers:
                self.slots.drop_fillers(call.fillers)
        elapsed = time.perf_counter() - started
        if self._drafting and call.priced:  # the governor prices drafts by what decodes cost
            self.governor.observe_decode(
                [(item.seq.seq_id, len(item.tokens)) for item in call.planned], elapsed
            )
        stats = self.stats
        stats.decode_steps += 1
        stats.decode_seconds += elapsed
        stats.batch_tokens += len(call.batch)
        stats.filler_rows += len(call.fillers)
        return logits, elapsed

    def refresh_session(self, session: str | None = None) -> bool:
        """Recompute a pinned session's generated tokens as prompt chunks, so its next turn
        can reuse them exactly (see `KVSlots`): when idle, or as that next turn arrives.
        Returns whether it did work."""
        slot = self.slots.stale_session(session)
        if slot is None:
            return False
        # From the last grid point the exact part reaches, and never a lone stale token.
        start = self.slots.reusable(slot.exact)
        if len(slot.tokens) - start == 1:
            start = self.slots.reusable(max(0, start - 1))
        tokens = slot.tokens[start:]
        self.slots.truncate(slot, start)
        n_batch = self.backend.info.n_batch
        while tokens:
            take = self.slots.chunk_end(start, start + len(tokens), n_batch, n_batch) - start
            batch = Batch()
            for offset, token in enumerate(tokens[:take]):
                batch.add(token, start + offset, slot.seq_id, False)
            try:
                self.backend.decode(batch)
            except DecodeError as error:
                log.warning("session refresh failed", error=str(error))
                self.slots.truncate(slot, 0)
                return True
            self.stats.decode_steps += 1
            self.stats.batch_tokens += take
            self.slots.appended(slot, tokens[:take], chunk=True)
            start += take
            tokens = tokens[take:]
        return True

    def idle(self) -> None:
        """The engine has nothing to do: neighbours' use of the cores stops counting.
        Called outside the step's error handling, so it never raises: a failed
        measurement costs a measurement, not the engine thread."""
        if self.cpu_share is not None:
            try:
                self.cpu_share.pause()
            except Exception:
                log.exception("could not pause the CPU share measurement")

    def resumed(self) -> None:
        """The engine has work again (see `CpuShare`); never raises, as `idle`."""
        if self.cpu_share is not None:
            try:
                self.cpu_share.resume()
            except Exception:
                log.exception("could not resume the CPU share measurement")

    def fit_threads(self) -> None:
        """Decode with as many threads as the cores neighbours leave free (`CpuShare`)."""
        share = self.cpu_share
        threads = share.update() if share is not None else None
        if share is None or threads is None:
            return
        self.backend.set_threads(threads)
        self.governor.threads_changed(threads)
        self.hook.reame_threads_changed(threads=threads)
        log.info(
            "decoding threads changed", threads=threads, neighbours_cores=round(share.others, 2)
        )
