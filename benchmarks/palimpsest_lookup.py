"""How fast the generation archive answers a draft lookup, on synthetic archives of 1M
tokens and more, and what its index costs to build and hold; beside a suffix array over
the same tokens, the structure the index was chosen against.

The archive: records of 200-1000 tokens assembled from a pool of "phrases" (runs of
Zipf-distributed token ids from a 49k vocabulary), so matches, forks and common short
n-grams occur as in generated text. Queries: the last 64 tokens at a random point of a
random record (hits), 64 fresh random tokens (misses), and 64 tokens of records made of
other phrases of the same words (unrelated: short matches everywhere, long ones nowhere),
looked up with the plugin's default settings (`DRAFTING`). Lookup time is the whole
`lookup` call on the engine thread's path, given the tail as an array (the plugin gives a
list, which a lookup turns into an array only where it searches: `tail_us`).

With --cold MB: each kind of query again on the first size, each after reading MB
megabytes through the caches (SmolLM2-135M's weights are about 100 MB): in the engine a
lookup follows a decode, which has evicted the lookup's code and data from the core's
caches.

With --growth: what adding records costs the archive's thread, which builds the indexes
beside decoding (reame_palimpsest/archivist.py). One finished generation (300 tokens) into
`fresh` of each size: built anew over all its records against `ArchiveIndex.extended`;
and a full `fresh` (FRESH_TOKENS) into `main` of each size: built anew against merged.
Medians of --growth-reps.

The suffix array is built over the reversed token stream (prefix doubling with numpy) and
searched with Python's bisect for the longest suffix of the query and the range of its
occurrences; its figure leaves out the continuation tree, so it is a lower bound of a
suffix-array lookup.

    .venv/bin/python benchmarks/palimpsest_lookup.py [--sizes 1000000 4000000] [--cold 100]
        [--growth]
"""

from __future__ import annotations

import argparse
import bisect
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from reame_palimpsest.archive_index import MAX_MATCH, ArchiveIndex, lookup
from reame_palimpsest.settings import PalimpsestSettings

VOCAB = 49_152
_DEFAULTS = PalimpsestSettings.model_validate({})
DRAFTING = {  # the plugin's settings by default
    "factor": _DEFAULTS.draft_factor,
    "min_share": _DEFAULTS.min_share,
    "min_backing": _DEFAULTS.min_backing,
}


def synthetic_records(n_tokens: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    words = np.minimum(rng.zipf(1.2, 4_000_000), VOCAB - 1).astype(np.uint32)
    phrases = [words[i : i + n] for i, n in zip(
        rng.integers(0, len(words) - 64, 20_000), rng.integers(3, 24, 20_000), strict=True
    )]  # fmt: skip
    records, held = [], 0
    while held < n_tokens:
        parts, length = [], int(rng.integers(200, 1000))
        while sum(len(p) for p in parts) < length:
            parts.append(phrases[int(rng.zipf(1.1)) % len(phrases)])
        record = np.concatenate(parts)[:length]
        records.append(record)
        held += len(record)
    return records


def windows(records: list[np.ndarray], count: int, rng: np.random.Generator) -> list[np.ndarray]:
    """`count` runs of MAX_MATCH tokens, each at a random point of a random record."""
    found = []
    for _ in range(count):
        record = records[int(rng.integers(len(records)))]
        end = int(rng.integers(MAX_MATCH, len(record)))
        found.append(np.ascontiguousarray(record[end - MAX_MATCH : end]))
    return found


def queries(records: list[np.ndarray], count: int, seed: int = 1) -> dict[str, list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    hits = windows(records, count, rng)
    misses = [rng.integers(0, VOCAB, MAX_MATCH).astype(np.uint32) for _ in range(count)]
    # Text of another kind: the same words, other phrases (as a question about something
    # else than the archive holds): short matches everywhere, long ones nowhere.
    other = synthetic_records(count * MAX_MATCH, seed=seed + 100)
    return {"hit": hits, "miss": misses, "unrelated": windows(other, count, rng)}


def time_lookups(
    index: ArchiveIndex, tails: list[np.ndarray], flush: np.ndarray | None = None
) -> dict[str, float]:
    """Each lookup timed alone; with `flush`, after reading that array through (as a
    decode reads the model's weights just before the engine thread looks up a draft)."""
    times, lengths = [], []
    for tail in tails:
        if flush is not None:
            flush.sum()
        started = time.perf_counter()
        drafted = lookup(tail, [index], 32, **DRAFTING).tokens
        times.append(time.perf_counter() - started)
        lengths.append(len(drafted))
    times.sort()
    return {
        "p50_us": round(1e6 * times[len(times) // 2], 1),
        "p99_us": round(1e6 * times[int(len(times) * 0.99)], 1),
        "mean_us": round(1e6 * statistics.fmean(times), 1),
        "mean_draft_tokens": round(statistics.fmean(lengths), 2),
    }


def tail_conversion_us(count: int = 2000) -> float:
    """What turning a sequence's last tokens into an array costs (a lookup that searches)."""
    output = list(range(100))
    started = time.perf_counter()
    for _ in range(count):
        np.array(output[len(output) - MAX_MATCH :], dtype=np.uint32)
    return round(1e6 * (time.perf_counter() - started) / count, 2)


def time_growth(fresh_sizes: list[int], main_sizes: list[int], reps: int) -> dict[str, Any]:
    """Milliseconds to bring the indexes up to date after records arrive: built anew
    against extended (see the module docstring)."""
    from reame_palimpsest.archivist import FRESH_TOKENS

    def median_ms(build: Any, records: list[np.ndarray]) -> float:
        times = []
        for _ in range(reps):
            started = time.perf_counter()
            build(records)
            times.append(time.perf_counter() - started)
        return round(1000 * statistics.median(times), 2)

    generation = [synthetic_records(300, seed=7)[0][:300]]
    fresh: dict[str, Any] = {}
    for size in fresh_sizes:
        records = synthetic_records(size, seed=2)
        index = ArchiveIndex(records)
        fresh[str(index.n_tokens)] = {
            "anew_ms": median_ms(ArchiveIndex, records + generation),
            "extended_ms": median_ms(index.extended, generation),
        }
        print("fresh", index.n_tokens, fresh[str(index.n_tokens)], flush=True)
    merge: dict[str, Any] = {}
    full = synthetic_records(FRESH_TOKENS, seed=3)
    for size in main_sizes:
        records = synthetic_records(size, seed=4)
        index = ArchiveIndex(records)
        merge[str(index.n_tokens)] = {
            "anew_s": round(median_ms(ArchiveIndex, records + full) / 1000, 3),
            "merged_s": round(median_ms(index.extended, full) / 1000, 3),
        }
        print("main", index.n_tokens, merge[str(index.n_tokens)], flush=True)
        del index
    return {"record_tokens": 300, "fresh_tokens": FRESH_TOKENS, "reps": reps,
            "into_fresh": fresh, "fresh_into_main": merge}  # fmt: skip


# ------------------------------------------------------------------ suffix array


def suffix_array(tokens: np.ndarray) -> np.ndarray:
    """Prefix doubling: ranks of 2^k-token prefixes until every suffix is ranked apart."""
    n = len(tokens)
    rank = tokens.astype(np.int64)
    k = 1
    while True:
        second = np.full(n, -1, dtype=np.int64)
        second[: n - k] = rank[k:]
        order = np.lexsort((second, rank))
        keys_first, keys_second = rank[order], second[order]
        new = np.empty(n, dtype=np.int64)
        changed = (keys_first[1:] != keys_first[:-1]) | (keys_second[1:] != keys_second[:-1])
        new[order] = np.concatenate(([0], np.cumsum(changed)))
        rank = new
        if rank.max() == n - 1:
            return order
        k *= 2


def suffix_array_lookup(text: np.ndarray, sa: np.ndarray, tail: np.ndarray) -> tuple[int, int, int]:
    """(longest match, first and last+1 suffix of its occurrences), searching the
    reversed text for the reversed tail."""
    query = tail[::-1].tolist()
    width = len(query)

    def prefix(i: int) -> list[int]:
        start = int(sa[i])
        return text[start : start + width].tolist()  # type: ignore[no-any-return]

    at = bisect.bisect_left(range(len(sa)), query, key=prefix)
    best = 0
    for neighbour in (at - 1, at):
        if 0 <= neighbour < len(sa):
            shared = prefix(neighbour)
            length = 0
            while length < min(len(shared), width) and shared[length] == query[length]:
                length += 1
            best = max(best, length)
    if best == 0:
        return 0, at, at
    head = query[:best]
    lo = bisect.bisect_left(range(len(sa)), head, key=lambda i: prefix(i)[:best])
    hi = bisect.bisect_right(range(len(sa)), head, key=lambda i: prefix(i)[:best])
    return best, lo, hi


def time_suffix_array(records: list[np.ndarray], tails: list[np.ndarray]) -> dict[str, float]:
    separator = np.array([0xFFFFFFFF], dtype=np.uint32)
    text = np.concatenate([np.concatenate((r, separator)) for r in records])[::-1].copy()
    started = time.perf_counter()
    sa = suffix_array(text)
    built = time.perf_counter() - started
    times = []
    for tail in tails:
        started = time.perf_counter()
        suffix_array_lookup(text, sa, tail)
        times.append(time.perf_counter() - started)
    times.sort()
    return {
        "build_s": round(built, 2),
        "bytes_per_token": round((sa.nbytes + text.nbytes) / len(text), 1),
        "p50_us": round(1e6 * times[len(times) // 2], 1),
        "mean_us": round(1e6 * statistics.fmean(times), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="*", default=[1_000_000, 4_000_000])
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--suffix-array-size", type=int, default=1_000_000)
    parser.add_argument("--name", default="palimpsest_lookup")
    parser.add_argument("--cold", type=int, default=0, metavar="MB")
    parser.add_argument("--growth", action="store_true")
    parser.add_argument("--growth-reps", type=int, default=5)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from common import write_report

    report: dict[str, Any] = {"sizes": {}, "tail_us": tail_conversion_us()}
    for size in args.sizes:
        records = synthetic_records(size)
        started = time.perf_counter()
        index = ArchiveIndex(records)
        built = time.perf_counter() - started
        tails = queries(records, args.queries)
        row: dict[str, Any] = {
            "records": len(records),
            "tokens": index.n_tokens,
            "build_s": round(built, 2),
            "bytes_per_token": round(index.nbytes / index.n_tokens, 1),
        }
        for kind, kind_tails in tails.items():
            row[kind] = time_lookups(index, kind_tails)
        if args.cold and size == args.sizes[0]:
            flush = np.ones(args.cold << 17)  # float64: 8 bytes each
            for kind, kind_tails in tails.items():
                row[f"{kind}_cold"] = time_lookups(index, kind_tails[:500], flush)
            row["cold_mb"] = args.cold
        report["sizes"][str(size)] = row
        print(size, row, flush=True)
        del index
    if args.suffix_array_size:
        records = synthetic_records(args.suffix_array_size)
        tails = queries(records, min(args.queries, 500))["hit"]
        report["suffix_array"] = {
            "tokens": sum(len(r) for r in records),
            **time_suffix_array(records, tails),
        }
        print("suffix array", report["suffix_array"], flush=True)
    if args.growth:
        report["growth"] = time_growth(
            [4_000, 16_000, 65_000], [1_000_000, 4_000_000], args.growth_reps
        )
    report["command"] = " ".join(["python", "benchmarks/palimpsest_lookup.py", *sys.argv[1:]])
    print(f"written to {write_report(args.name, report)}")


if __name__ == "__main__":
    main()
