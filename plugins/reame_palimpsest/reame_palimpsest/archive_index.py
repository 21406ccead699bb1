"""The searchable form of the archive: where the recent tokens of a sequence occurred
before, and what followed them there.

Structure, chosen by measurement (benchmarks/palimpsest_lookup.py): the records' tokens
laid end to end in one uint32 array, a separator after each record, and for a few anchor
lengths k a table of every k-gram's key (its hash, `_mix`ed) beside the position that
follows it, sorted by key and then position. A lookup hashes the sequence's last k tokens,
finds their run in the table (a directory of the keys' leading bits leaves a binary search
over a few entries), and compares the most recent occurrences backwards against the
sequence, all at once in numpy, to measure how long each match really is (which also rules
out hash collisions). The occurrences that match longest are the "node" of
SuffixDecoding's suffix tree; what followed them forms its continuation tree. Longest
anchor first, so a long match is found even where its short tail is common.

A lookup runs right after a decode, which has read the model's weights through the core's
caches: then every numpy call costs tens of µs and every step of a binary search a cache
miss (seven times a warm lookup's time, measured). So what a lookup reads before it knows
it will draft is read from Python (hashes, directories, `memoryview`s of the tables), and
on text unlike the archive's, where short matches abound and none survives the backing
check below, it stops there (`nothing_backed`): the tables of the k-grams the check reads
keep, at each k-gram's last entry, how often its commonest follower followed it.

Why not a suffix array or automaton: a suffix array answers the same question with a
binary search whose every comparison is a slice of tokens, at Python speed (measured: 89 µs
on 1M tokens before counting any continuation, against 25 µs for a whole draft here on
1M or 4M tokens, and 10 µs for a miss); a suffix automaton in Python costs hundreds of
bytes per token. The tables cost 12 bytes a token per anchor (about 72 in all with five
anchors, the tokens, the counts and the directories; the timings above were measured with
three), build in a few vectorised passes, and answer in the same time whatever the
archive's size.

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

import bisect
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
_POWER_INTS = [pow(_MUL_INT, j, 1 << 64) for j in range(MAX_MATCH + 1)]
# A k-gram's followers fall short of a backing share in an index only by more than this: a
# share short by this in every index is short pooled, whatever the float rounding.
_SHORT = 1e-6
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
        reach = backing_reach(self.anchors)
        self._followers = [
            _commonest_followers(table, self.tokens) if k <= reach else None
            for table, k in zip(self._tables, self.anchors, strict=True)
        ]
        # `nothing_backed`'s tables: the backing check's k-grams, and the shortest anchor
        # beyond its reach, if a match as long is shorter than TRUSTED.
        self.backing_tables = [(t, k) for t, k in enumerate(self.anchors) if k <= reach]
        guard = min((k for k in self.anchors if k > reach), default=TRUSTED + 1)
        self.guard = guard if guard <= TRUSTED else None
        self._starts = [_directory(keys) for keys, _ in self._tables]
        self._views()

    def _views(self) -> None:
        """What a lookup reads, as Python reads it (`_end`): right after a decode, which
        has evicted everything from the caches, a numpy call costs tens of µs and each
        step of a binary search over a table a miss."""
        self._keys = [keys.data for keys, _ in self._tables]
        self._directories = [(shift, starts.data) for shift, starts in self._starts]
        self._counts = [None if f is None else (f[0].data, f[1].data) for f in self._followers]

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
        grown._tables, grown._followers, grown._starts = [], [], []
        for (keys, ends), followers, starts, k in zip(
            self._tables, self._followers, self._starts, self.anchors, strict=True
        ):
            new_keys, new_ends = _table(added, k)  # no k-gram spans the separator before
            at = keys.searchsorted(new_keys, side="right")
            table = (np.insert(keys, at, new_keys), np.insert(ends, at, new_ends + base))
            grown._tables.append(table)
            if followers is not None:
                followers = _commonest_followers_updated(
                    table, grown.tokens, followers, at, new_keys
                )
            grown._followers.append(followers)
            grown._starts.append(_directory(table[0], starts, new_keys))
        grown._views()
        return grown

    @property
    def nbytes(self) -> int:
        counts = [array for pair in self._followers if pair is not None for array in pair]
        return (
            self.tokens.nbytes
            + sum(keys.nbytes + ends.nbytes for keys, ends in self._tables)
            + sum(array.nbytes for array in counts)
            + sum(starts.nbytes for _, starts in self._starts)
        )

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

    def followers(self, table: int, key: int) -> np.ndarray:
        """The tokens that followed the most recent occurrences of the k-gram hashing to
        `key` in `table`."""
        followers: np.ndarray = self.tokens[self._recent(table, key)]
        return followers

    def _end(self, table: int, mixed: int) -> int:
        """Where the entries of the k-gram keyed `mixed` (its hash, `_mix`ed) end in
        `table`; 0 if there is none. The table's directory narrows the search to a few
        entries at once."""
        keys = self._keys[table]
        shift, directory = self._directories[table]
        bucket = mixed >> shift
        start = directory[bucket]
        end = bisect.bisect_right(keys, mixed, start, directory[bucket + 1])
        return end if end > start and keys[end - 1] == mixed else 0

    def _recent(self, table: int, key: int) -> np.ndarray:
        """Where the most recent `CANDIDATES` occurrences of the k-gram hashing to `key`
        end in `table` (the position that follows each); empty if there is none."""
        ends = self._tables[table][1]
        mixed = _mix(key)
        hi = self._end(table, mixed)
        if not hi:
            return ends[:0]
        lo = bisect.bisect_left(self._keys[table], mixed, max(0, hi - CANDIDATES), hi)
        recent: np.ndarray = ends[lo:hi]
        return recent

    def _holds(self, table: int, key: int) -> bool:
        return self._end(table, _mix(key)) > 0

    def backs_nothing(self, table: int, key: int, min_backing: float) -> bool:
        """Whether no token followed `min_backing` of the most recent `CANDIDATES`
        occurrences of the k-gram hashing to `key` here (none: True), by more than float
        rounding; False where the table keeps no counts (not one of the backing check's
        k-grams): it cannot tell."""
        counts = self._counts[table]
        if counts is None:
            return False
        hi = self._end(table, _mix(key))
        if not hi:
            return True
        commonest, seen = counts[0][hi - 1], counts[1][hi - 1]
        return bool(commonest < min_backing * seen - _SHORT)


class Drafted(NamedTuple):
    tokens: tuple[int, ...]
    match: int  # length of the match behind them (0: none)


def lookup(
    tail: Sequence[int] | np.ndarray,
    indexes: Sequence[ArchiveIndex],
    max_tokens: int,
    *,
    factor: float,
    min_share: float,
    min_backing: float = 0.0,
) -> Drafted:
    """What most often followed the longest match of `tail` (at most MAX_MATCH tokens,
    most recent last) across `indexes` (each searched alone, the longest matches pooled),
    and that match's length; ((), 0) if nothing is drafted. Cut where a token drafted after
    a short match lacks `min_backing` (`backed`)."""
    indexes = [index for index in indexes if index.n_tokens]
    if not indexes:
        return Drafted((), 0)
    hashes = suffix_hashes(tail, max(index.anchors[0] for index in indexes))
    if min_backing > 0.0 and nothing_backed(tail, hashes, indexes, min_backing):
        return Drafted((), 0)
    tail = np.asarray(tail, dtype=np.uint32)
    matches = [m for index in indexes if (m := index.match(tail, hashes)) is not None]
    if not matches:
        return Drafted((), 0)
    length = max(m.length for m in matches)
    limit = min(max_tokens, MAX_DRAFT, max(1, math.ceil(factor * length)))
    rows = [m.following(limit) for m in matches if m.length == length]
    drafted = continuation(rows[0] if len(rows) == 1 else np.vstack(rows), min_share)
    if min_backing > 0.0 and length < TRUSTED:
        drafted = backed(tail, drafted, indexes, length, min_backing)
    return Drafted(drafted, length) if drafted else Drafted((), 0)


def nothing_backed(
    tail: Sequence[int] | np.ndarray,
    hashes: Sequence[int],
    indexes: Sequence[ArchiveIndex],
    min_backing: float,
) -> bool:
    """Whether the backing check would refuse whatever a lookup drafts first, told from the
    counts each index keeps per k-gram, without a search: the usual lookup on text unlike
    the archive's. So when no index holds the tail's last `guard` tokens (the shortest
    anchor beyond the check's reach: every match is then shorter, and shorter than
    `TRUSTED`), and for each k-gram at the tail's end that the check could read, no index
    saw one follower after `min_backing` of its occurrences (a share short in every index
    is short pooled)."""
    first = indexes[0]
    guard = first.guard
    if guard is None or any(index.anchors != first.anchors for index in indexes):
        return False
    if len(tail) >= guard:
        table = first.anchors.index(guard)
        if any(index._holds(table, hashes[guard]) for index in indexes):
            return False
    return all(
        index.backs_nothing(table, hashes[k], min_backing)
        for table, k in first.backing_tables
        if k <= len(tail)
        for index in indexes
    )


def backing_reach(anchors: Sequence[int]) -> int:
    """The most tokens before a drafted token whose followers back it: `BACKING_CONTEXT`,
    or the shortest anchor where none is that short (`anchors` longest first)."""
    return max(BACKING_CONTEXT, anchors[-1])


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
    most = backing_reach(anchors)
    context = [*tail[max(0, len(tail) - most) :].tolist(), *drafted]
    before = len(context) - len(drafted)  # context tokens before drafted[0]
    for j, token in enumerate(drafted):
        if length + j >= TRUSTED:
            break
        reach = min(most, length + j, before + j)
        k = max((a for a in anchors if a <= reach), default=0)
        if not k:
            return drafted[:j]
        key = gram_hash(context[before + j - k : before + j])
        tables = [index.anchors.index(k) for index in indexes]
        if all(
            index.backs_nothing(table, key, min_backing)
            for index, table in zip(indexes, tables, strict=True)
        ):
            return drafted[:j]  # no follower has the share anywhere: the counts below agree
        followers = [
            index.followers(table, key) for index, table in zip(indexes, tables, strict=True)
        ]
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


def suffix_hashes(tail: Sequence[int] | np.ndarray, longest: int) -> list[int]:
    """The hash of the last k tokens of `tail`, at index k, for every k up to `longest`
    (as far as `tail` goes): each token times the power of its distance from the end,
    summed from the end (modulo 2**64, as the tables' uint64 arithmetic wraps)."""
    n = min(len(tail), longest)
    recent = tail[len(tail) - n :]
    hashes = [0]
    h = 0
    # In Python: a few dozen integer operations, where numpy's calls cost more than the
    # arithmetic, most of all right after a decode.
    tokens = recent.tolist() if isinstance(recent, np.ndarray) else recent
    for token, power in zip(reversed(tokens), _POWER_INTS, strict=False):
        h = (h + (token + 1) * power) & _MASK
        hashes.append(h)
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
    """Every k-gram followed by a token, as (sorted keys: their hashes `_mix`ed, position
    after each)."""
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
    keys, ends = _mix_array(h[keep]), ends[keep]
    order = np.lexsort((ends, keys))
    return keys[order], ends[order]


def _commonest_followers(
    table: tuple[np.ndarray, np.ndarray], tokens: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """For each k-gram of a table, at its last (most recent) entry: how many of its most
    recent `CANDIDATES` occurrences its commonest follower followed, and how many
    occurrences those are (zero at every other entry): what a backing check would count."""
    keys, _ = table
    commonest = np.zeros(len(keys), dtype=np.uint8)
    seen = np.zeros(len(keys), dtype=np.uint8)
    if len(keys):
        last = np.flatnonzero(np.append(keys[1:] != keys[:-1], True))
        _count_followers(table, tokens, last, commonest, seen)
    return commonest, seen


def _commonest_followers_updated(
    table: tuple[np.ndarray, np.ndarray],
    tokens: np.ndarray,
    before: tuple[np.ndarray, np.ndarray],
    at: np.ndarray,
    new_keys: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """`_commonest_followers` of a table that `new_keys` were inserted into at `at` (as
    `ArchiveIndex.extended` does), counted anew only for the k-grams they added to."""
    keys, _ = table
    commonest, seen = (np.insert(counts, at, 0) for counts in before)
    if len(new_keys):
        added, times = np.unique(new_keys, return_counts=True)
        ends = keys.searchsorted(added, side="right")
        was_last = ends - 1 - times  # a k-gram's last entry before: no longer its last
        held = was_last >= keys.searchsorted(added, side="left")
        commonest[was_last[held]] = 0
        seen[was_last[held]] = 0
        _count_followers(table, tokens, ends - 1, commonest, seen)
    return commonest, seen


def _count_followers(
    table: tuple[np.ndarray, np.ndarray],
    tokens: np.ndarray,
    last: np.ndarray,
    commonest: np.ndarray,
    seen: np.ndarray,
) -> None:
    """Fill `commonest` and `seen` at `last`, the last entries of some k-grams."""
    keys, ends = table
    first = np.maximum(keys.searchsorted(keys[last], side="left"), last + 1 - CANDIDATES)
    sizes = last + 1 - first
    group = np.repeat(np.arange(len(last), dtype=np.uint64), sizes)
    entries = np.arange(len(group)) + np.repeat(first - (np.cumsum(sizes) - sizes), sizes)
    pairs = np.sort((group << np.uint64(32)) | tokens[ends[entries]].astype(np.uint64))
    starts = np.flatnonzero(np.append(True, pairs[1:] != pairs[:-1]))
    runs = np.diff(np.append(starts, len(pairs)))
    most = np.zeros(len(last), dtype=np.int64)
    np.maximum.at(most, (pairs[starts] >> np.uint64(32)).astype(np.int64), runs)
    commonest[last] = most
    seen[last] = sizes


_MIX_1 = 0xBF58476D1CE4E5B9
_MIX_2 = 0x94D049BB133111EB
DIRECTORY_SPAN = 8  # entries of a table per bucket of its directory, at most on average


def _mix(h: int) -> int:
    """A table's key for the hash `h`: its bits spread over all 64 (splitmix64's
    finaliser, a one-to-one map), so that the key's leading bits pick a bucket of the
    table's directory with every bucket about as full. A short k-gram's hash is small."""
    h = ((h ^ (h >> 30)) * _MIX_1) & _MASK
    h = ((h ^ (h >> 27)) * _MIX_2) & _MASK
    return h ^ (h >> 31)


def _mix_array(h: np.ndarray) -> np.ndarray:
    """`_mix` of every hash (uint64 arithmetic wraps as the mask does)."""
    h = (h ^ (h >> np.uint64(30))) * np.uint64(_MIX_1)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(_MIX_2)
    mixed: np.ndarray = h ^ (h >> np.uint64(31))
    return mixed


def _directory(
    keys: np.ndarray,
    before: tuple[int, np.ndarray] | None = None,
    added: np.ndarray | None = None,
) -> tuple[int, np.ndarray]:
    """(shift, starts): the entries of `keys` (sorted) whose leading bits are b start at
    starts[b] and end at starts[b + 1], where b = key >> shift; about `DIRECTORY_SPAN`
    entries a bucket. Given the directory `before` the keys `added` joined them, counted
    from it where the buckets stay the same."""
    bits = max(0, (len(keys) // DIRECTORY_SPAN).bit_length())
    if not bits:
        return 64, np.array([0, len(keys)], dtype=np.uint32)
    shift = 64 - bits
    if before is not None and added is not None and before[0] == shift:
        keys, base = added, before[1]
    else:
        base = None
    counts = np.bincount((keys >> np.uint64(shift)).astype(np.int64), minlength=1 << bits)
    starts = np.concatenate(([0], np.cumsum(counts))).astype(np.uint32)
    return shift, starts if base is None else base + starts
