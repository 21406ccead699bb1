"""The `diskkv` plugin: the engine's prefill hooks over a `DiskStore` and its writer thread.

On the engine thread: `reame_prefix_lookup` searches the index and, on a hit, reads and
checks one entry (the engine waits for the state, so a miss costs only index queries);
`reame_prefix_store_points` names the prefixes the policy wants and the directory lacks;
`reame_prefix_store` queues the state for the writer thread. Everything that writes
entries happens on that thread.

Processes sharing the directory (replicas of a fleet, servers behind one proxy) tell one
another what they are computing: `reame_prefix_computing` records, in the index, a promise
for each prefix this process will store (a small row, written on the engine thread), and
`reame_prefix_pending` finds another process's promise of a prefix of a prompt, so that
prompt waits for the entry instead of computing it twice.

Models whose KV cannot be cut back (sliding-window, recurrent, hybrid: `prefix_trim_safe`
is False) are served only entries whose tokens are all a prefix of the prompt.

If the directory cannot be used at start, the plugin says so once and does nothing: the
server serves without the disk cache.
"""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import structlog
from pydantic import ValidationError

from reame_core.chat import user_turn_opening
from reame_core.errors import RequestError
from reame_core.hookspecs import hookimpl
from reame_core.hooktypes import DISK_FAULTS, DiskNeed, ModelInfo, PrefixHit
from reame_core.settings import Settings
from reame_diskkv import cli
from reame_diskkv.entry_format import codec_for
from reame_diskkv.index import entry_key
from reame_diskkv.policy import SnapshotPolicy
from reame_diskkv.settings import BUDGET_CAP, BUDGET_SHARE_OF_FREE_DISK, NAME, DiskKVSettings
from reame_diskkv.store import CacheCounters, DiskStore, Snapshot, new_owner
from reame_diskkv.writer import SnapshotWriter

log = structlog.get_logger(__name__)

# The engine thread's store reads, deletes the rows of broken entries and records
# promises: it must never wait long for another process's write lock.
READER_BUSY_TIMEOUT_S = 0.25
# How long a promise holds if its process neither stores the prefix nor withdraws it (a
# process on another host that died: one on this host is seen gone at once).
PROMISE_S = 60.0


class DiskPrefixCache:
    """See the module docstring. One instance serves one runtime at a time."""

    def __init__(self) -> None:
        self._reader: DiskStore | None = None
        self._writer: SnapshotWriter | None = None
        self._policy = SnapshotPolicy()
        self._lookup_failed = False
        self._unusable = 0  # starts at which the directory could not be used
        self._reader_generation = 0  # the writer's generation the reader's index is of
        # Kept across restarts of the engine: the engine thread adds to the first, the
        # writer thread to the second.
        self._read_counters = CacheCounters()
        self._write_counters = CacheCounters()
        self._owner = new_owner()  # whose promises are this process's
        self._promised: dict[str, set[str]] = {}  # a request's id: its promises' keys
        self._holders: dict[str, set[str]] = {}  # a promise's key: the requests that made it
        self._openings: dict[str, tuple[int, ...]] = {}  # a model's fingerprint: `_opening`

    # ------------------------------------------------------------ command line

    @hookimpl
    def reame_add_options(self, parser: argparse.ArgumentParser) -> None:
        cli.add_options(parser)

    @hookimpl
    def reame_add_commands(self, commands: argparse._SubParsersAction[Any]) -> None:
        cli.add_cache_command(commands)

    # ----------------------------------------------------------------- planning

    @hookimpl
    def reame_disk_need(self, settings: Settings) -> DiskNeed:
        try:
            directory = settings.plugin_section(NAME, DiskKVSettings).directory()
        except ValidationError:  # refused at configure, with its message
            directory = None
        return DiskNeed(
            NAME,
            "the KV of shared prompt prefixes",
            BUDGET_SHARE_OF_FREE_DISK,
            BUDGET_CAP,
            directory=directory,
        )

    # ---------------------------------------------------------------- lifecycle

    @hookimpl
    def reame_configure(self, settings: Settings, model: ModelInfo) -> None:
        section = settings.plugin_section(NAME, DiskKVSettings)
        self.reame_shutdown()
        self._policy = SnapshotPolicy(
            section.turns, section.block_tokens, section.min_tokens, section.conversations
        )
        directory = section.directory()
        try:
            # The writer's store first: it creates the index, which may wait for the lock.
            writing = DiskStore(directory, counters=self._write_counters)
            try:
                reading = DiskStore(
                    directory,
                    counters=self._read_counters,
                    busy_timeout_s=READER_BUSY_TIMEOUT_S,
                )
            except BaseException:
                writing.close()
                raise
            budget = section.budget_bytes(held=writing.total_size())
        except (OSError, sqlite3.Error) as error:
            self._unusable += 1
            log.warning(
                "disk prefix cache off: its directory cannot be used; serving without it",
                directory=str(directory),
                error=f"{type(error).__name__}: {error}",
            )
            return
        self._reader = reading
        self._reader_generation = 0
        self._writer = SnapshotWriter(writing, budget=budget, level=section.compression_level)
        log.info(
            "disk prefix cache ready",
            directory=str(reading.directory),
            budget_bytes=budget,
            exact_prefixes_only=not model.prefix_trim_safe,
        )

    def flush(self, timeout_s: float = 120.0) -> bool:
        """Wait until the snapshots queued so far are on disk (benchmarks, tests, embedding
        applications that exit right after a request); False on timeout."""
        return self._writer.flush(timeout_s) if self._writer is not None else True

    @hookimpl
    def reame_shutdown(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._reader is not None:
            self._withdraw_all(self._reader)
            self._reader.close()
            self._reader = None

    # ------------------------------------------------------------------ prefill

    @hookimpl
    def reame_prefix_lookup(
        self, tokens: Sequence[int], reused: int, model: ModelInfo
    ) -> PrefixHit | None:
        reader = self._reader
        if reader is None or len(tokens) < self._policy.min_tokens:
            return None
        self._follow_writer(reader)
        counters = self._read_counters
        longest = len(tokens) - 2  # the engine computes the last two tokens itself
        try:
            found = reader.find(
                model.fingerprint,
                tokens,
                whole_within=None if model.prefix_trim_safe else longest,
            )
        except sqlite3.Error as error:
            self._say_lookup_failed(error)
            return None
        shared = min(found.shared, longest) if found else 0
        if found is None or not self._policy.worth_restoring(shared, len(found.tokens), reused):
            counters.misses += 1
            return None
        state = reader.load(found, model.fingerprint)
        if state is None:
            counters.misses += 1
            return None
        counters.hits += 1
        counters.restored_tokens += shared
        if self._writer is not None:
            self._writer.touch(found.key)
        longer = len(found.tokens) > shared
        return PrefixHit(shared, state, NAME, found.tokens if longer else None)

    @hookimpl
    def reame_prefix_store_points(
        self, tokens: Sequence[int], model: ModelInfo, session: str | None = None
    ) -> Iterable[int]:
        reader, writer = self._reader, self._writer
        if reader is None or writer is None or writer.paused:
            return []
        points = self._policy.points(
            tokens, model.eog, session=session is not None, opening=self._opening(model)
        )
        if not points:
            return []
        try:
            if model.prefix_trim_safe:
                # Any entry sharing at least a point's tokens serves it by trimming.
                found = reader.find(model.fingerprint, tokens, whole_within=None)
                covered = found.shared if found else 0
                return [point for point in points if point > covered]
            return [p for p in points if not reader.holds(model.fingerprint, tokens[:p])]
        except sqlite3.Error as error:
            self._say_lookup_failed(error)
            return []

    @hookimpl
    def reame_prefix_store(self, tokens: Sequence[int], state: bytes, model: ModelInfo) -> None:
        if self._writer is None:
            return
        snapshot = Snapshot(
            model.fingerprint, model.name, tuple(tokens), state, codec_for(model.kv_type)
        )
        promised = self._end_promise(snapshot.key)
        if not self._writer.submit(snapshot):
            self._read_counters.snapshots_dropped += 1
            if promised and self._reader is not None:  # another's promise of it stands
                self._call_index(self._reader.withdraw, [snapshot.key], owner=self._owner)

    @hookimpl
    def reame_prefix_computing(
        self, tokens: Sequence[int], points: Sequence[int], model: ModelInfo, request_id: str
    ) -> None:
        reader = self._reader
        if reader is None:
            return
        if self._writer is None or self._writer.paused:
            points = ()  # what it cannot write it does not promise
        before = self._promised.get(request_id, set())
        prefixes = [tokens[:point] for point in points]
        keys = [entry_key(model.fingerprint, prefix) for prefix in prefixes]
        if not keys and not before:
            return
        gone = before - set(keys)
        # A prefix another request here promised too stays promised.
        withdrawn = sorted(k for k in gone if self._holders.get(k, set()) <= {request_id})
        if not self._call_index(
            reader.promise,
            model.fingerprint,
            prefixes,
            owner=self._owner,
            until=time.time() + PROMISE_S,
            withdrawn=withdrawn,
        ):
            return  # as it was: what was promised is withdrawn when the request ends
        for key in gone:
            self._let_go(key, request_id)
        if keys:
            self._promised[request_id] = set(keys)
            for key in keys:
                self._holders.setdefault(key, set()).add(request_id)
            self._read_counters.promises_made += len(keys)
        else:
            self._promised.pop(request_id, None)

    @hookimpl
    def reame_prefix_pending(
        self, tokens: Sequence[int], have: int, model: ModelInfo
    ) -> int | None:
        reader = self._reader
        if reader is None or len(tokens) < self._policy.min_tokens:
            return None
        try:
            return reader.pending(
                model.fingerprint, tokens[: len(tokens) - 2], longer_than=have, owner=self._owner
            )
        except sqlite3.Error as error:
            self._say_lookup_failed(error)
            return None

    def _end_promise(self, key: str) -> bool:
        """The prefix `key` is being stored: forget its promise, whichever requests here
        made it (the writer thread ends it in the index once the entry is written);
        whether there was one."""
        holders = self._holders.pop(key, set())
        for request_id in holders:
            keys = self._promised[request_id]
            keys.discard(key)
            if not keys:
                del self._promised[request_id]
        return bool(holders)

    def _let_go(self, key: str, request_id: str) -> None:
        holders = self._holders.get(key)
        if holders is not None:
            holders.discard(request_id)
            if not holders:
                del self._holders[key]

    def _withdraw_all(self, reader: DiskStore) -> None:
        """Stopping: promises not kept yet are withdrawn (what is queued is still written)."""
        keys = sorted(self._holders)
        self._promised.clear()
        self._holders.clear()
        if keys:
            self._call_index(reader.withdraw, keys, owner=self._owner)

    def _call_index(self, work: Any, *args: Any, **kwargs: Any) -> bool:
        """Run a small write of promises on the engine thread; False if it failed (the
        index busy beyond the reader's timeout, the disk full): others then compute the
        prefix too, as they would without promises. Counted, not logged: a disk that
        refuses writes is the writer's to report."""
        try:
            work(*args, **kwargs)
        except sqlite3.Error:
            self._read_counters.promise_errors += 1
            return False
        return True

    def _follow_writer(self, reader: DiskStore) -> None:
        """Open the index again once the writer has made the directory anew: the old one
        was deleted with it."""
        writer = self._writer
        if writer is not None and writer.generation != self._reader_generation:
            self._reader_generation = writer.generation
            try:
                reader.reopen()
            except (OSError, sqlite3.Error) as error:
                self._say_lookup_failed(error)

    def _opening(self, model: ModelInfo) -> tuple[int, ...]:
        """The tokens a user's turn opens with in `model`'s template (`SnapshotPolicy`),
        worked out once per model; none where its state cannot be cut back to serve a
        prompt that goes on otherwise."""
        opening = self._openings.get(model.fingerprint)
        if opening is None:
            opening = ()
            if model.prefix_trim_safe:
                # A template may refuse a system message: then no opening.
                with contextlib.suppress(RequestError):
                    opening = user_turn_opening(model)
            self._openings[model.fingerprint] = opening
        return opening

    def _say_lookup_failed(self, error: OSError | sqlite3.Error) -> None:
        self._read_counters.index_errors += 1
        if not self._lookup_failed:
            self._lookup_failed = True
            log.warning("disk prefix cache: index lookup failed", error=str(error))

    # ---------------------------------------------------------------- reporting

    @hookimpl
    def reame_describe(self) -> str:
        return "disk prefix cache: shared prompt prefixes restored from disk (reame cache stats)"

    @hookimpl
    def reame_collect_stats(self) -> Mapping[str, Mapping[str, Any]] | None:
        counters = self._read_counters + self._write_counters
        stats: dict[str, Any] = counters.as_dict()
        writer = self._writer
        if writer is not None:
            stats.update(
                entries=writer.held_entries,
                bytes_on_disk=writer.held_bytes,
                budget_bytes=writer.budget,
            )
        faults = {
            "corrupt_entry": counters.corrupt,
            "read_error": counters.read_errors,
            "write_error": counters.write_errors,
            "index_error": counters.index_errors,
            "index_rebuilt": counters.indexes_rebuilt,
            "directory_unusable": self._unusable,
            "directory_deleted": counters.directories_recreated,
        }
        return {NAME: stats, DISK_FAULTS: {NAME: faults}}


plugin = DiskPrefixCache()
