"""The index of a cache directory: which entries it holds, and the one that shares the
longest beginning with a prompt.

An sqlite database in WAL mode, so that several processes can share one directory:
readers never wait, and writers take turns through `writing()`, a transaction that holds
the database's write lock. Rows summarize entry files and can be rebuilt from them (see
`DiskStore.reconcile`); a file is the truth, a row may be stale.

Longest-prefix search over chained block hashes: an entry's tokens are cut into blocks of
`BLOCK` tokens, and the i-th block's hash covers the model fingerprint and every token up
to the end of that block. Equal hashes therefore mean equal prefixes of one model, and
if a prompt's i-th block hash is indexed so are all before it: a binary search over the
prompt's block hashes finds the deepest shared block in a few point queries, whatever
the number of entries. The exact shared length is then counted on the candidates' tokens.

Promises: a process computing a prefix it means to store says so (a row of `promises`,
named by the entry's key, with who promised it and until when), so that others behind
the same prefix wait for the entry instead of computing it too. Few are live at a time
(one per prompt being computed), so finding one compares each live row's tokens.

Each `PrefixIndex` holds one sqlite connection, used by one thread at a time.
"""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from reame_diskkv.entry_format import TOKEN_DTYPE, token_bytes

BLOCK = 32  # tokens per indexed block: entries shorter than this cannot be found
_CANDIDATES = 64  # entries compared token by token at one depth
_ANY_LENGTH = 1 << 62
WAL_PAGES = 64  # pages the write-ahead log holds before a checkpoint copies it back

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS entries (
        key TEXT PRIMARY KEY,
        fingerprint TEXT NOT NULL,
        model TEXT NOT NULL,
        n_tokens INTEGER NOT NULL,
        tokens BLOB NOT NULL,
        size INTEGER NOT NULL,
        last_used REAL NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS entries_by_last_use ON entries (last_used)",
    """CREATE TABLE IF NOT EXISTS blocks (
        hash BLOB NOT NULL,
        key TEXT NOT NULL,
        PRIMARY KEY (hash, key)
    ) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS blocks_by_key ON blocks (key)",
    """CREATE TABLE IF NOT EXISTS promises (
        key TEXT PRIMARY KEY,
        fingerprint TEXT NOT NULL,
        tokens BLOB NOT NULL,
        owner TEXT NOT NULL,
        until REAL NOT NULL
    )""",
)
_TABLES = ("entries", "blocks", "promises")


@dataclass(frozen=True)
class IndexedEntry:
    key: str
    tokens: tuple[int, ...]
    shared: int  # leading tokens equal to the prompt's


@dataclass(frozen=True)
class Promise:
    """A prefix another process is computing and means to store."""

    key: str
    n_tokens: int
    owner: str


@dataclass(frozen=True)
class ModelUsage:
    """What the cache holds for one model."""

    fingerprint: str
    model: str
    entries: int
    bytes: int
    tokens: int
    last_used: float


def entry_key(fingerprint: str, tokens: Sequence[int]) -> str:
    """The name of the entry holding `tokens` under model `fingerprint`."""
    digest = hashlib.blake2b(fingerprint.encode() + b"\0", digest_size=16)
    digest.update(token_bytes(tokens))
    return digest.hexdigest()


def block_hashes(fingerprint: str, tokens: Sequence[int]) -> list[bytes]:
    """One chained hash per full block of `tokens`."""
    data = token_bytes(tokens)
    step = BLOCK * TOKEN_DTYPE.itemsize
    chain = hashlib.blake2b(b"reame-kv-blocks\0" + fingerprint.encode(), digest_size=16).digest()
    hashes = []
    for start in range(0, len(data) - step + 1, step):
        chain = hashlib.blake2b(chain + data[start : start + step], digest_size=16).digest()
        hashes.append(chain)
    return hashes


def shared_length(stored: bytes, prompt: np.ndarray) -> int:
    tokens = np.frombuffer(stored, dtype=TOKEN_DTYPE)
    n = min(len(tokens), len(prompt))
    differ = np.flatnonzero(tokens[:n] != prompt[:n])
    return int(differ[0]) if differ.size else n


def _switch_to_wal(db: sqlite3.Connection, busy_timeout_s: float) -> None:
    """Put the database in WAL mode (a no-op once it is: the mode is stored in the file).
    Switching takes an exclusive lock, and sqlite answers "locked" at once, without its
    busy timeout, to the others of several processes opening a new directory together:
    they try again until the timeout."""
    deadline = time.monotonic() + busy_timeout_s
    pause = 0.001
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


class PrefixIndex:
    def __init__(self, path: Path, *, busy_timeout_s: float) -> None:
        self._busy_timeout_s = busy_timeout_s
        # isolation_level=None: no implicit transactions; `writing()` opens them.
        self._db = sqlite3.connect(
            path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        try:
            _switch_to_wal(self._db, busy_timeout_s)
            # A crash may lose the last rows, never corrupt the index: lost rows are
            # rebuilt from their files.
            self._db.execute("PRAGMA synchronous=NORMAL")
            # The write-ahead log would grow to 4 MiB between checkpoints and keep that size:
            # on a small disk of its own, the cache's largest file. Rows are small.
            self._db.execute(f"PRAGMA wal_autocheckpoint={WAL_PAGES}")
            self._db.execute(f"PRAGMA journal_size_limit={WAL_PAGES * 4096}")
            if not self._has_schema():  # creating it takes the write lock; reading does not
                with self.writing():
                    for statement in _SCHEMA:
                        self._db.execute(statement)
        except BaseException:
            self._db.close()
            raise

    def close(self) -> None:
        self._db.close()

    def _has_schema(self) -> bool:
        found = self._db.execute(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name IN (?, ?, ?)",
            _TABLES,
        ).fetchone()
        return bool(found[0] == len(_TABLES))

    @contextlib.contextmanager
    def writing(self, *, patience_s: float | None = None) -> Iterator[None]:
        """A transaction holding the directory's write lock (across processes), waiting at
        most `patience_s` for it (default: the connection's busy timeout). A failed
        COMMIT (the disk full under sqlite's journal) rolls back too: a transaction left
        open would refuse every later one."""
        if patience_s is not None:
            self._db.execute(f"PRAGMA busy_timeout = {int(patience_s * 1000)}")
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                raise
        finally:
            if patience_s is not None:
                self._db.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_s * 1000)}")

    # ---------------------------------------------------------------- queries

    def longest_prefix(
        self, fingerprint: str, tokens: Sequence[int], *, whole_within: int | None = None
    ) -> IndexedEntry | None:
        """The entry of model `fingerprint` sharing the most leading tokens with `tokens`
        (the shortest such entry on a tie). With `whole_within`, only entries whose tokens
        are all a prefix of `tokens`, at most `whole_within` of them, qualify."""
        hashes = block_hashes(fingerprint, tokens)
        depth = self._deepest(hashes)
        prompt = np.asarray(tokens, dtype=TOKEN_DTYPE)
        whole = whole_within is not None
        while depth > 0:
            if whole_within is not None:
                # A whole prefix shares all its full blocks: at this depth, look only at
                # entries ending in this block, longest first.
                longest = min(whole_within, BLOCK * (depth + 1) - 1)
                order = "DESC"
            else:
                longest, order = _ANY_LENGTH, "ASC"  # the shortest is the cheapest to read
            rows = self._db.execute(
                "SELECT e.key, e.tokens FROM blocks b JOIN entries e ON e.key = b.key "
                "WHERE b.hash = ? AND e.fingerprint = ? AND e.n_tokens <= ? "
                f"ORDER BY e.n_tokens {order} LIMIT ?",
                (hashes[depth - 1], fingerprint, longest, _CANDIDATES),
            ).fetchall()
            best: IndexedEntry | None = None
            for key, stored in rows:
                shared = shared_length(stored, prompt)
                if whole and shared * TOKEN_DTYPE.itemsize != len(stored):
                    continue
                if best is None or shared > best.shared:
                    held = np.frombuffer(stored, dtype=TOKEN_DTYPE)
                    best = IndexedEntry(key, tuple(int(t) for t in held), shared)
            if best is not None or not whole:
                return best
            depth -= 1  # a shorter entry may still be a whole prefix
        return None

    def _deepest(self, hashes: list[bytes]) -> int:
        """How many of the prompt's leading blocks some entry shares."""
        low, high = 0, len(hashes)
        while low < high:
            middle = (low + high + 1) // 2
            found = self._db.execute(
                "SELECT 1 FROM blocks WHERE hash = ? LIMIT 1", (hashes[middle - 1],)
            ).fetchone()
            if found:
                low = middle
            else:
                high = middle - 1
        return low

    def promised(
        self, fingerprint: str, tokens: Sequence[int], *, longer_than: int, now: float
    ) -> list[Promise]:
        """Live promises of model `fingerprint` whose tokens are all a prefix of `tokens`
        and more than `longer_than` of them, longest first."""
        rows = self._db.execute(
            "SELECT key, tokens, owner FROM promises "
            "WHERE fingerprint = ? AND until > ? AND length(tokens) > ? AND length(tokens) <= ? "
            "ORDER BY length(tokens) DESC",
            (
                fingerprint,
                now,
                longer_than * TOKEN_DTYPE.itemsize,
                len(tokens) * TOKEN_DTYPE.itemsize,
            ),
        ).fetchall()
        prompt = np.asarray(tokens, dtype=TOKEN_DTYPE)
        found = []
        for key, stored, owner in rows:
            n_tokens = len(stored) // TOKEN_DTYPE.itemsize
            if shared_length(stored, prompt) == n_tokens:
                found.append(Promise(key, n_tokens, owner))
        return found

    def has(self, key: str) -> bool:
        return (
            self._db.execute("SELECT 1 FROM entries WHERE key = ?", (key,)).fetchone() is not None
        )

    def entry_keys(self) -> set[str]:
        return {key for (key,) in self._db.execute("SELECT key FROM entries")}

    def total_size(self) -> int:
        return int(self._db.execute("SELECT COALESCE(SUM(size), 0) FROM entries").fetchone()[0])

    def count(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM entries").fetchone()[0])

    def by_last_use(self) -> Iterator[tuple[str, int]]:
        """(key, size) of every entry, least recently used first."""
        yield from self._db.execute("SELECT key, size FROM entries ORDER BY last_used, key")

    def usage(self) -> list[ModelUsage]:
        rows = self._db.execute(
            "SELECT fingerprint, model, COUNT(*), SUM(size), SUM(n_tokens), MAX(last_used) "
            "FROM entries GROUP BY fingerprint, model ORDER BY MAX(last_used) DESC"
        )
        return [ModelUsage(*row) for row in rows]

    # ---------------------------------------------------------------- changes

    def add(
        self,
        key: str,
        *,
        fingerprint: str,
        model: str,
        tokens: Sequence[int],
        size: int,
        when: float,
    ) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?, ?, ?, ?)",
            (key, fingerprint, model, len(tokens), token_bytes(tokens), size, when),
        )
        self._db.execute("DELETE FROM blocks WHERE key = ?", (key,))
        self._db.executemany(
            "INSERT INTO blocks VALUES (?, ?)",
            [(block, key) for block in block_hashes(fingerprint, tokens)],
        )

    def remove(self, key: str) -> None:
        self._db.execute("DELETE FROM blocks WHERE key = ?", (key,))
        self._db.execute("DELETE FROM entries WHERE key = ?", (key,))

    def promise(
        self, key: str, *, fingerprint: str, tokens: Sequence[int], owner: str, until: float
    ) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO promises VALUES (?, ?, ?, ?, ?)",
            (key, fingerprint, token_bytes(tokens), owner, until),
        )

    def withdraw(self, keys: Sequence[str], *, owner: str | None = None) -> None:
        """Drop the promises named `keys` (only `owner`'s, if given)."""
        if owner is None:
            self._db.executemany("DELETE FROM promises WHERE key = ?", [(k,) for k in keys])
        else:
            self._db.executemany(
                "DELETE FROM promises WHERE key = ? AND owner = ?", [(k, owner) for k in keys]
            )

    def drop_promises(self, *, before: float, owners: Sequence[str] = ()) -> None:
        """Drop promises that lapsed before `before`, and every promise of `owners`."""
        self._db.execute("DELETE FROM promises WHERE until <= ?", (before,))
        self._db.executemany("DELETE FROM promises WHERE owner = ?", [(o,) for o in owners])

    def promise_owners(self) -> set[str]:
        return {owner for (owner,) in self._db.execute("SELECT DISTINCT owner FROM promises")}

    def touch(self, key: str, when: float) -> None:
        self._db.execute("UPDATE entries SET last_used = ? WHERE key = ?", (when, key))
