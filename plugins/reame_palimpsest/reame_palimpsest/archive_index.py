"""The searchable form of the archive: where the recent tokens of a sequence occurred
before, and what followed them there.

Structure, chosen by measurement (benchmarks/palimpsest_lookup.py): the records' tokens
laid end to end in one uint32 array, a separator after each record, and for a few anchor
lengths k a table of every k-gram's hash beside the position that follows it, sorted by
hash and then position. A lookup hashes the sequence's last k tokens, finds their run in
the table with two binary searches, and compares the most recent occurrences backwards
against the sequence, all at once in numpy, to measure how long each match really is
(which also rules out hash collisions). The occurrences that match longest are the
"node" of SuffixDecoding's suffix tree; what followed them forms its continuation tree.
Longest anchor first, so a long match is found even where its short tail is common.

Why not a suffix array or automaton: a suffix array answers the same question with a
binary search whose every comparison is a slice of tokens, at Python speed (measured: 89 µs
on 1M tokens before counting any continuation, against 25 µs for a whole draft here on
1M or 4M tokens, and 10 µs for a miss); a suffix automaton in Python costs hundreds of
bytes per token. The tables cost 12 bytes a token per anchor (about 64 in all with five
anchors and the tokens; the timings above were measured with three), build in a few
vectorised passes, and answer in the same time whatever the archive's size.

The draft: from the matching occurrences, follow the continuation shared by the most of
them, multiplying each fork's share into the path's probability, and stop where that
falls below `min_share` (SuffixDecoding's rule). llama.cpp's n-gram cache instead counts
the next token of every 1-4-gram and drafts one token at a time while the most frequent
has enough samples and share; its contexts are at most 4 tokens, so after a long exact
match it still drafts as if the match were short. Here the length grows with the match:
at most `factor` times the match length, since a long match predicts a long continuation
and a short one a short one; the governor cuts it further to what its cost curve says
pays on this host.

A short match is often a single past record that happened to share a few tokens: the
name of the same colour, the same price, and then that record's own next field. So while
the match behind a drafted token is shorter than `TRUSTED`, the token must also be what
followed the same few tokens (`BACKING_CONTEXT`, fewer after a shorter match) across the
archive at least `min_backing` of the time; the draft stops before the first that is not.
After a match of one or two tokens that check reads the occurrences the draft came from:
it raises the share its first token needs to `min_backing`. Measured on
templated product descriptions (benchmarks/palimpsest.py, near repeats), drafts whose first
token was backed at 0.9 or more came true 86% of the time against 14% below 0.3, on
Qwen2.5-Coder-1.5B and SmolLM2 alike; matches of 16 tokens or more came true 86-98% of the
time whatever their backing.

An index is immutable once built: the archive's thread builds new ones and swaps them
in, so the engine thread reads without locks.
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

SEPARATOR = np.uint32(0xFFFFFFFF)  # ends each record; no k-gram spans it
_SEPARATOR_INT = int(SEPARATOR)
ANCHORS = (24, 8, 3, 2, 1)  # k-gram lengths of the tables, longest first
MAX_MATCH = 64  # tokens compared backwards: longer matches count as this long
TRUSTED = 16  # a token drafted after a match this long needs no backing
BACKING_CONTEXT = 3  # tokens before a drafted token whose followers back it (fewer after a
# shorter match: as many as the match and the tokens drafted since, on the anchors there are)
# A draft's kind by the length of its match, longest first (`kind_of`).
KINDS = (
    (TRUSTED, f"match {TRUSTED}+"),
    (8, f"match 8-{TRUSTED - 1}"),
    (3, "match 3-7"),
    (2, "match 2"),
    (1, "match 1"),
)
MAX_DRAFT = 64  # tokens a draft may have
CANDIDATES = 64  # most recent occurrences of a k-gram compared
_PADDING = np.full(max(MAX_MATCH, MAX_DRAFT), SEPARATOR, dtype=np.uint32)  # around the records
_MUL = np.uint64(0x100000001B3)  # FNV-1a's 64-bit prime
_MUL_INT = int(_MUL)
_MASK = (1 << 64) - 1
_POWERS = np.array([pow(_MUL_INT, j, 1 << 64) for j in range(MAX_MATCH + 1)], dtype=np.uint64)
_BACK = np.arange(1, MAX_MATCH + 1, dtype=np.int64)
_AHEAD = np.arange(MAX_DRAFT, dtype=np.int64)


@dataclass(frozen=True)
class Match:
    """Where the sequence's last `length` tokens occurred in one index."""

    index: ArchiveIndex
    length: int
    ends: np.ndarray  # positions right after each occurrence: where its continuation starts

    def following(self, limit: int) -> np.ndarray:
        """The next `limit` tokens after each occurrence, one row each (SEPARATOR past a
        record's end)."""
        return self.index.tokens[self.ends[:, None] + _AHEAD[:limit]]


class ArchiveIndex:
    """The records given, oldest first, searchable; see the module docstring."""

    def __init__(self, records: Sequence[np.ndarray], anchors: Sequence[int] = ANCHORS) -> None:
        self.tokens = np.concatenate((_PADDING, _laid_out(records)))
        self.n_tokens = int(sum(len(r) for r in records))
        self.anchors = tuple(sorted(anchors, reverse=True))
        self._tables = [_table(self.tokens, k) for k in self.anchors]

    def extended(self, records: Sequence[np.ndarray]) -> ArchiveIndex:
        """A new index: this one's records, then `records` (newer). Equal to one built
        from all of them, in about the time it takes to copy this one: only the new
        k-grams are hashed and sorted, then merged into each table (after the old ones of
        the same hash: they are its most recent occurrences)."""
        if not records:
            return self
        base = len(self.tokens) - len(_PADDING)  # the new records go where the padding was
        added = _laid_out(records)
        grown = copy.copy(self)
        grown.tokens = np.concatenate((self.tokens[:base], added))
        grown.n_tokens = self.n_tokens + int(sum(len(r) for r in records))
        grown._tables = []
        for (keys, ends), k in zip(self._tables, self.anchors, strict=True):
            new_keys, new_ends = _table(added, k)  # no k-gram spans the separator before
            at = keys.searchsorted(new_keys, side="right")
            grown._tables.append(
                (np.insert(keys, at, new_keys), np.insert(ends, at, new_ends + base))
            )
        return grown

    @property
    def nbytes(self) -> int:
        return self.tokens.nbytes + sum(keys.nbytes + ends.nbytes for keys, ends in self._tables)

    def match(self, tail: np.ndarray, hashes: Sequence[int] | None = None) -> Match | None:
        """The longest match of the end of `tail` (uint32, at most MAX_MATCH tokens, most
        recent last), with the most recent occurrences that match that long. `hashes`:
        `suffix_hashes(tail, ...)` reaching at least this index's longest anchor, if the
        caller has them."""
        reverse = tail[::-1]
        if hashes is None:
            hashes = suffix_hashes(tail, self.anchors[0])
        shortest = self.anchors[-1]
        if len(tail) < shortest or not self._holds(-1, hashes[shortest]):
            return None  # every longer match ends with this shortest one: the usual miss
        for table, k in enumerate(self.anchors):
            if len(tail) < k:
                continue
            found = self._recent(table, hashes[k])
            if not len(found):
                continue
            before = self.tokens[found[:, None] - _BACK[: len(reverse)]]
            same = before == reverse
            lengths = np.where(same.all(axis=1), len(reverse), same.argmin(axis=1))
            best = int(lengths.max())
            if best >= k:  # shorter: every occurrence was a hash collision
                return Match(self, best, found[lengths == best])
        return None

    def followers(self, gram: Sequence[int]) -> np.ndarray:
        """The tokens that followed the most recent occurrences of `gram`, whose length is
        one of the anchors."""
        followers: np.ndarray = self.tokens[
            self._recent(self.anchors.index(len(gram)), gram_hash(gram))
        ]
        return followers

    def _recent(self, table: int, key: int) -> np.ndarray:
        """Where the most recent `CANDIDATES` occurrences of the k-gram hashing to `key`
        end in `table` (the position that follows each); empty if there is none."""
        keys, ends = self._tables[table]
        wanted = np.uint64(key)
        lo = int(keys.searchsorted(wanted, side="left"))
        if lo == len(keys) or keys[lo] != wanted:
            return ends[:0]
        hi = int(keys.searchsorted(wanted, side="right"))
        recent: np.ndarray = ends[max(lo, hi - CANDIDATES) : hi]
        return recent

    def _holds(self, table: int, key: int) -> bool:
        keys = self._tables[table][0]
        at = int(keys.searchsorted(np.uint64(key)))
        return at < len(keys) and int(keys[at]) == key


class Drafted(NamedTuple):
    tokens: tuple[int, ...]
    match: int  # length of the match behind them (0: none)


def lookup(
    tail: np.ndarray,
    indexes: Sequence[ArchiveIndex],
    max_tokens: int,
    *,
    factor: float,
    min_share: float,
    min_backing: float = 0.0,
) -> Drafted:
    """What most often followed the longest match of `tail` across `indexes` (each
    searched alone, the longest matches pooled), and that match's length; () if nothing
    matched. Cut where a token drafted after a short match lacks `min_backing` (`backed`)."""
    indexes = [index for index in indexes if index.n_tokens]
    if not indexes:
        return Drafted((), 0)
    hashes = suffix_hashes(tail, max(index.anchors[0] for index in indexes))
    matches = [m for index in indexes if (m := index.match(tail, hashes)) is not None]
    if not matches:
        return Drafted((), 0)
    length = max(m.length for m in matches)
    limit = min(max_tokens, MAX_DRAFT, max(1, math.ceil(factor * length)))
    rows = [m.following(limit) for m in matches if m.length == length]
    drafted = continuation(rows[0] if len(rows) == 1 else np.vstack(rows), min_share)
    if min_backing > 0.0 and length < TRUSTED:
        drafted = backed(tail, drafted, indexes, length, min_backing)
    return Drafted(drafted, length)


def kind_of(match: int) -> str:
    """The kind of a draft after a match of `match` tokens (`DraftProposal.kind`): how
    often a draft comes true depends most on how long a match stands behind it (at
    least 1)."""
    return next(name for least, name in KINDS if max(1, match) >= least)


def backed(
    tail: np.ndarray,
    drafted: tuple[int, ...],
    indexes: Sequence[ArchiveIndex],
    length: int,
    min_backing: float,
) -> tuple[int, ...]:
    """`drafted` (after a match of `length` tokens) up to the first token drafted after a
    match shorter than `TRUSTED` that fewer than `min_backing` of the occurrences of the
    tokens just before it (`BACKING_CONTEXT` of them, or the longest anchor within the
    match and the tokens drafted since; the most recent `CANDIDATES` of each index) were
    followed by."""
    anchors = indexes[0].anchors
    most = max(BACKING_CONTEXT, anchors[-1])  # where no anchor is that short: the shortest
    context = [*tail[max(0, len(tail) - most) :].tolist(), *drafted]
    before = len(context) - len(drafted)  # context tokens before drafted[0]
    for j, token in enumerate(drafted):
        if length + j >= TRUSTED:
            break
        reach = min(most, length + j, before + j)
        k = max((a for a in anchors if a <= reach), default=0)
        if not k:
            return drafted[:j]
        followers = [index.followers(context[before + j - k : before + j]) for index in indexes]
        seen = sum(len(f) for f in followers)
        agree = sum(int(np.count_nonzero(f == token)) for f in followers)
        if agree < min_backing * seen or not seen:
            return drafted[:j]
    return drafted


def continuation(rows: np.ndarray, min_share: float) -> tuple[int, ...]:
    """The most probable path through the tree the rows' prefixes form, while its
    probability (the product of each fork's winning share) stays at least `min_share`.
    A row that ends (SEPARATOR) counts against every path beyond it."""
    drafted: list[int] = []
    alive = rows
    probability = 1.0
    depth = 0
    width = rows.shape[1]
    while depth < width and len(alive):
        # Columns where every live row agrees are taken at once: one fork at a time.
        agree = (alive[:, depth:] == alive[0, depth:]).all(axis=0) & (alive[0, depth:] != SEPARATOR)
        run = int(agree.argmin()) if not agree.all() else len(agree)
        drafted += alive[0, depth : depth + run].tolist()
        depth += run
        if depth == width:
            break
        column = alive[:, depth]
        counts = Counter(column.tolist())  # a few dozen rows: cheaper than np.unique
        counts.pop(_SEPARATOR_INT, None)
        if not counts:
            break
        token, count = max(counts.items(), key=_commonest_then_smallest)
        probability *= count / len(alive)
        if probability < min_share:
            break
        alive = alive[column == token]
        drafted.append(token)
        depth += 1
    return tuple(drafted)


def _commonest_then_smallest(item: tuple[int, int]) -> tuple[int, int]:
    token, count = item
    return count, -token


def suffix_hashes(tail: np.ndarray, longest: int) -> list[int]:
    """The hash of the last k tokens of `tail`, at index k, for every k up to `longest`
    (as far as `tail` goes): each token times the power of its distance from the end,
    summed from the end (uint64 arithmetic wraps as the tables' does)."""
    n = min(len(tail), longest)
    recent = tail[len(tail) - n :][::-1].astype(np.uint64) + np.uint64(1)
    hashes: list[int] = [0, *np.cumsum(recent * _POWERS[:n]).tolist()]
    return hashes


def gram_hash(gram: Sequence[int]) -> int:
    """The hash of a few tokens, as the tables hash a k-gram (cheaper than
    `suffix_hashes` for the two or three tokens a backing check looks up)."""
    h = 0
    for token in gram:
        h = (h * _MUL_INT + int(token) + 1) & _MASK
    return h


def _laid_out(records: Sequence[np.ndarray]) -> np.ndarray:
    """The records end to end, a SEPARATOR after each, then `_PADDING` (reads past the
    last record's end stay in the array)."""
    parts: list[np.ndarray] = []
    for record in records:
        parts += [np.asarray(record, dtype=np.uint32), _PADDING[:1]]
    return np.concatenate((*parts, _PADDING))


def _table(tokens: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Every k-gram followed by a token, as (sorted hashes, position after each)."""
    n = len(tokens)
    wide = tokens.astype(np.uint64) + np.uint64(1)
    h = np.zeros(n - k, dtype=np.uint64)
    for j in range(k):
        h *= _MUL
        h += wide[j : n - k + j]
    ends = np.arange(k, n, dtype=np.int32)  # h[i] hashes tokens[i : i + k], ending at i + k
    separators = np.concatenate(([0], np.cumsum(tokens == SEPARATOR)))
    clean = separators[k:n] - separators[: n - k] == 0
    keep = clean & (tokens[k:] != SEPARATOR)
    keys, ends = h[keep], ends[keep]
    order = np.lexsort((ends, keys))
    return keys[order], ends[order]
