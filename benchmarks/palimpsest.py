"""What the generation archive saves on workloads that repeat themselves, and what it costs
on those that do not.

Workloads (single stream, greedy, chat prompts; the embedded SmolLM2-135M unless --model):
  exact      20 requests, then the same 20 again in a new server process: second-pass
             decode speed against the first pass's (same configuration, archive empty
             then full) and against the second pass without the archive. Beside it, the
             ceiling for that pass: the speed of verifying the archive's drafts of the
             length they had if every token were right, from the governor's own cost curve
             of the same run: (k + 1) * f(1) / f(k + 1) for mean verified draft length k.
  near       20 product descriptions from one template, after 20 others from it were
             generated (and archived): with the archive against without. Beside it, the
             ceiling with foresight: at each position of each answer, the archive's draft
             as its index stood when the request began (no backing check: every draft it
             could offer) and prompt lookup's; the least time in which the answer could be
             decoded knowing which draft tokens come true (plain steps or any draft at any
             length), with both sources against prompt lookup alone, passes of n tokens
             priced by benchmarks/pass_cost.py after the reps. No governor beats it with
             these drafts on this host. And a reference for the governor (the policy
             reference): the same answers decoded by a governor that knows from the
             start how often each kind of the drafts the plugin offers (backing check
             applied) and prompt lookup's come true, position by position, counted over
             these very answers, but not which will, verifying at each position the
             draft and length with the most expected tokens per second.
  unrelated  20 general questions, the archive holding the product descriptions: with the
             archive against without (the cost of looking up and of drafts that miss).
Configurations: `with` (built-in draft sources and the palimpsest plugin, the governor
on auto; answers are not recalled whole, the drafting is measured: benchmarks/recall.py
measures recall) and `without` (the same, palimpsest disabled). Every pass runs in a fresh
process (a fresh Reame runtime, its own empty cache directory; the archive directory is
the rep's). For near and unrelated, `with` and `without` run in two such processes side
by side, request by request, taking turns at going first: on a shared host the speed of
the cores drifts by ±10% over minutes, and passes run one after the other measured that
drift, not the archive. The exact passes follow one another (the second reads what the
first archived). The figure is generated tokens per second of decoding (prompt time
excluded), and ratios are medians of per-rep ratios.
Outputs of `with` are compared with `without`'s of the same rep, token for token.

With --llama-server, llama.cpp's server runs the same passes, each in a fresh process, with
its file-backed n-gram cache (`--spec-type ngram-cache --lookup-cache-dynamic FILE`, one
file per rep and workload, as the archive directory is) against itself with no
speculation: its figures come from its own `timings`, its outputs are compared as text.

    .venv/bin/python benchmarks/palimpsest.py [--reps 3] [--workloads exact near unrelated]
        [--model PATH] [--llama-server PATH] [--name palimpsest]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from reame_core.settings import Settings

TOPICS = (
    "the history of the bicycle", "how bread is baked", "why leaves change colour",
    "the life of honey bees", "how a lighthouse works", "the water cycle",
    "how trains run on time", "the first printing press", "how volcanoes form",
    "what makes a good map", "how coffee is grown", "the phases of the moon",
    "how glass is made", "why the sea is salty", "how bridges carry weight",
    "the migration of swallows", "how paper is recycled", "what a compass does",
    "how cheese is made", "why we have seasons",
)  # fmt: skip
EXACT = tuple(f"Write a short paragraph about {topic}." for topic in TOPICS)
UNRELATED = tuple(f"Explain in a few sentences {topic}." for topic in reversed(TOPICS))
PRODUCTS = (
    ("Harbour lantern", "brass", "gold", 40), ("Alpine stool", "oak", "natural", 65),
    ("Shepherd blanket", "wool", "grey", 80), ("Garden vase", "glass", "green", 25),
    ("Market basket", "willow", "brown", 30), ("Reading lamp", "steel", "black", 55),
    ("Kitchen board", "walnut", "dark brown", 35), ("Tea kettle", "copper", "red", 70),
    ("Rain jacket", "nylon", "yellow", 90), ("Travel mug", "ceramic", "white", 15),
    ("Desk clock", "aluminium", "silver", 45), ("Picnic rug", "cotton", "blue", 38),
    ("Bread tin", "enamel", "cream", 22), ("Wall shelf", "pine", "white", 48),
    ("Candle holder", "iron", "black", 18), ("Linen apron", "linen", "beige", 28),
    ("Pocket knife", "steel", "olive", 52), ("Table runner", "jute", "natural", 24),
    ("Soap dish", "marble", "white", 20), ("Coat hook", "brass", "gold", 12),
    ("Flower pot", "terracotta", "orange", 16), ("Bath towel", "cotton", "grey", 26),
    ("Salad bowl", "olive wood", "brown", 42), ("Door mat", "coir", "brown", 19),
    ("Wine rack", "beech", "natural", 58), ("Sun hat", "straw", "natural", 33),
    ("Pepper mill", "acacia", "dark brown", 27), ("Key tray", "leather", "tan", 21),
    ("Garden bench", "teak", "honey", 240), ("Umbrella stand", "zinc", "silver", 64),
    ("Wool scarf", "merino", "navy", 49), ("Oil lamp", "brass", "bronze", 75),
    ("Tool box", "steel", "red", 68), ("Bird feeder", "cedar", "natural", 29),
    ("Photo frame", "oak", "natural", 23), ("Water jug", "stoneware", "blue", 34),
    ("Laundry bag", "canvas", "white", 17), ("Mirror", "walnut", "dark brown", 110),
    ("Tea towel", "linen", "striped", 14), ("Clothes brush", "boar bristle", "brown", 31),
)  # fmt: skip
TEMPLATE = (
    "Write a catalogue entry in exactly this format:\n"
    "Name: <name>\nMaterial: <material>\nColour: <colour>\nPrice: <price> euros\n"
    "Description: <two sentences for a shop window>\n\n"
    "Product: {name}. Material: {material}. Colour: {colour}. Price: {price} euros."
)
NEAR_FILL = tuple(
    TEMPLATE.format(name=n, material=m, colour=c, price=p) for n, m, c, p in PRODUCTS[:20]
)
NEAR = tuple(TEMPLATE.format(name=n, material=m, colour=c, price=p) for n, m, c, p in PRODUCTS[20:])
PASSES = {"exact": EXACT, "near-fill": NEAR_FILL, "near": NEAR, "unrelated": UNRELATED}
WORKLOADS = ("exact", "near", "unrelated")
MAX_TOKENS = 96


@contextmanager
def _runtime(
    config: str, archive: str, model: str | None, threads: int
) -> Iterator[tuple[Any, Any]]:
    """A fresh runtime in this process, with the archive plugin (`with`) or without."""
    from common import empty_cache_dir

    from reame_core.plugins import PluginHost
    from reame_core.runtime import start_runtime
    from reame_palimpsest.plugin import Palimpsest

    plugins = PluginHost(discover=False)
    plugin = Palimpsest()
    if config == "with":
        plugins.register(plugin, "palimpsest")
    with empty_cache_dir() as cache:
        settings = Settings(
            model=model or Settings().model,
            threads=threads,
            speculate="auto",
            cache_dir=cache,
            # Drafting is measured: repeats are not answered whole from remembered answers.
            plugins={"palimpsest": {"dir": archive, "recall": False}},
        )
        runtime = start_runtime(settings, plugins=plugins)
        if plugin.archivist is not None:  # steady state: the archive's index is loaded
            assert plugin.archivist.ready.wait(120)
        try:
            yield runtime, plugin if config == "with" else None
        finally:
            runtime.close()


def _prompt(runtime: Any, text: str) -> list[int]:
    from reame_core.chat import encode_chat

    return list(encode_chat(runtime.backend.info, [{"role": "user", "content": text}]))


def _generate(runtime: Any, prompt: list[int]) -> Any:
    from reame_core.request import GenerationRequest, SamplingParams

    return runtime.engine.generate(GenerationRequest(prompt, SamplingParams(max_tokens=MAX_TOKENS)))


def _foresight(
    plugin: Any, indexes: Any, prompt: list[int], output: list[int], draft_max: int
) -> list[tuple[int, int, int, int, int, int, str]]:
    """At each position of `output`: the length of the draft the archive's `indexes` give
    there (without the backing check) and how many of its tokens came true, then the same
    for prompt lookup's draft, then for the archive's draft as the plugin offers it (the
    backing check applied) and that draft's kind."""
    import numpy as np

    from reame_core.builtins.prompt_lookup import NgramIndex, PromptLookupSettings
    from reame_palimpsest.archive_index import MAX_MATCH, kind_of
    from reame_palimpsest.archive_index import lookup as archive_lookup

    s = plugin.settings
    lookup = PromptLookupSettings()
    copier = NgramIndex(lookup.ngram_min, lookup.ngram_max)
    copier.extend(prompt)
    sequence = [*prompt, *output]
    found = []
    for t in range(len(output)):
        end = len(prompt) + t
        tail = np.array(sequence[max(0, end - MAX_MATCH) : end], dtype=np.uint32)
        archived = archive_lookup(
            tail, indexes, draft_max, factor=s.draft_factor, min_share=s.min_share
        ).tokens
        offered = archive_lookup(
            tail,
            indexes,
            draft_max,
            factor=s.draft_factor,
            min_share=s.min_share,
            min_backing=s.min_backing,
        )
        copied = copier.propose(draft_max)
        found.append(
            (
                *_came_true(archived, output[t:]),
                *_came_true(copied, output[t:]),
                *_came_true(offered.tokens, output[t:]),
                kind_of(offered.match) if offered.tokens else "",
            )
        )
        copier.extend(output[t : t + 1])
    return found


def _came_true(tokens: tuple[int, ...], truth: list[int]) -> tuple[int, int]:
    """The draft's length, and how many of its tokens match `truth` before the first that
    does not."""
    right = 0
    while right < min(len(tokens), len(truth)) and tokens[right] == truth[right]:
        right += 1
    return len(tokens), right


ARCHIVE, LOOKUP, OFFERED = 0, 1, 2  # the drafts of `_foresight`'s positions, in their order
KIND = 6  # where `_foresight`'s positions give the offered draft's kind
LOOKUP_KIND = "prompt lookup"
POOLED_FROM = 8  # draft positions from here on share one acceptance in `policy_reference`


def _fastest(answer: list[list[Any]], seconds: dict[int, float], sources: tuple[int, ...]) -> float:
    """The least time in which `answer` could be decoded from the drafts `_foresight`
    found (those of `sources`), knowing which of their tokens come true: at each
    position reached, plain decoding or one draft cut to any length (`seconds[n]`: a pass
    of n tokens)."""
    n = len(answer)
    least = [0.0] * (n + 1)
    for t in reversed(range(n)):
        best = seconds[1] + least[t + 1]
        for source in sources:
            length, right = answer[t][2 * source], answer[t][2 * source + 1]
            for k in range(1, length + 1):
                best = min(best, seconds[k + 1] + least[min(n, t + min(k, right) + 1)])
        least[t] = best
    return least[0]


def ceiling_with_foresight(foresight: list[list[list[Any]]], seconds: dict[int, float]) -> float:
    """How much faster the archive's drafts could make decoding, prompt lookup's drafts
    used on both sides, if every draft were verified at the best length knowing which of
    its tokens come true: the least time with prompt lookup alone over the least time
    with both."""
    alone = sum(_fastest(answer, seconds, (LOOKUP,)) for answer in foresight)
    both = sum(_fastest(answer, seconds, (ARCHIVE, LOOKUP)) for answer in foresight)
    return alone / both if both else 1.0


def _kind(position: list[Any], source: int) -> str:
    return LOOKUP_KIND if source == LOOKUP else str(position[KIND])


def acceptance_tables(foresight: list[list[list[Any]]]) -> dict[str, list[float]]:
    """How often each kind of draft (the archive's as offered, by kind; prompt lookup's)
    came true at each position, given that the tokens before it did, over every position
    of every answer: the tables a governor that had seen all these drafts would hold
    (positions from `POOLED_FROM` on pooled)."""
    counts: dict[str, list[list[int]]] = {}
    for answer in foresight:
        for t, position in enumerate(answer):
            for source in (OFFERED, LOOKUP):
                length, right = position[2 * source], position[2 * source + 1]
                if not length:
                    continue
                rows = counts.setdefault(
                    _kind(position, source), [[0, 0] for _ in range(POOLED_FROM + 1)]
                )
                # Reached: every token up to the first miss, but none past the answer's end
                # (a draft right to the end has no miss to count).
                reached = right if t + right >= len(answer) else min(length, right + 1)
                for j in range(reached):
                    row = rows[min(j, POOLED_FROM)]
                    row[0] += 1
                    row[1] += j < right
    return {
        kind: [right / reached if reached else 0.0 for reached, right in rows]
        for kind, rows in counts.items()
    }


def _governed(
    answer: list[list[Any]],
    seconds: dict[int, float],
    sources: tuple[int, ...],
    tables: dict[str, list[float]],
) -> float:
    """The time `answer` takes when, at each position reached, the draft (of `sources`)
    and length with the most expected tokens per second by `tables` is verified, or none
    if plain decoding is expected faster; the drafts' tokens that come true are taken."""
    t, spent = 0, 0.0
    while t < len(answer):
        position = answer[t]
        best_rate, best_k, best_right = 1.0 / seconds[1], 0, 0
        for source in sources:
            length, right = position[2 * source], position[2 * source + 1]
            rates = tables.get(_kind(position, source)) if length else None
            if not rates:
                continue
            reach, expected = 1.0, 0.0
            for k in range(1, length + 1):
                reach *= rates[min(k - 1, POOLED_FROM)]
                expected += reach
                rate = (1.0 + expected) / seconds[k + 1]
                if rate > best_rate:
                    best_rate, best_k, best_right = rate, k, right
        spent += seconds[best_k + 1]
        t += min(best_k, best_right) + 1
    return spent


def policy_reference(foresight: list[list[list[Any]]], seconds: dict[int, float]) -> float:
    """How much faster the archive's drafts make decoding, prompt lookup's drafts used on
    both sides, for a governor that knows from the start how often each kind of draft
    comes true position by position (`acceptance_tables`, counted over these very
    answers) but not which draft will, and prices passes by `seconds`: the time with
    prompt lookup alone over the time with both (`_governed`). A reference for the
    governor, which learns its tables as it goes and only from the positions it reaches.
    No governor decodes faster than foresight (`_fastest`), but this ratio may exceed the
    ceiling's: both of its sides are governed."""
    tables = acceptance_tables(foresight)
    alone = sum(_governed(answer, seconds, (LOOKUP,), tables) for answer in foresight)
    both = sum(_governed(answer, seconds, (OFFERED, LOOKUP), tables) for answer in foresight)
    return alone / both if both else 1.0


def _summary(runtime: Any, plugin: Any, results: list[Any]) -> dict[str, Any]:
    """A pass's figures: decode rate (prompt time excluded), drafts, the ceiling of the
    archive's drafts from the governor's cost curve, the archive's own counters."""
    governor = runtime.engine.governor
    report = governor.report()
    source = governor.sources.get("palimpsest")
    ceiling = None
    if source is not None and source.drafts:
        k = source.proposed / source.drafts
        ceiling = {
            "mean_verified_draft": round(k, 2),
            "speedup": round(
                (k + 1) * governor.cost.pass_seconds(1) / governor.cost.pass_seconds(round(k) + 1),
                3,
            ),
        }
    stats = plugin.reame_collect_stats() if plugin is not None else None
    tokens = sum(r.usage.completion_tokens for r in results)
    decode_ms = sum(r.usage.predicted_ms for r in results)
    return {
        "tok_s": tokens / (decode_ms / 1000),
        "tokens": tokens,
        "draft_max": governor.draft_max,  # after the pass check's cap, if any
        "proposed": _summed([r.usage.draft_proposed for r in results]),
        "accepted": _summed([r.usage.draft_accepted for r in results]),
        "outputs": [list(r.candidates[0].tokens) for r in results],
        "ceiling": ceiling,
        "pass_ms": report["pass_ms"],
        # Per source and kind of draft (`DraftProposal.kind`): acceptance per drafted
        # token as the governor last knew it (decayed over recent drafts).
        "kinds": {row["source"]: row["kinds"] for row in report["sources"] if row["kinds"]},
        "archive": None if stats is None else {
            k: v for k, v in stats["palimpsest"].items()
            if k in ("index_tokens", "lookups", "drafts", "lookup_us_mean", "records_written")
        },
    }  # fmt: skip


def child(
    config: str, texts_name: str, archive: str, model: str | None, threads: int
) -> dict[str, Any]:
    """One pass in this (fresh) process: every request of `texts_name`, one after another."""
    with _runtime(config, archive, model, threads) as (runtime, plugin):
        results = [_generate(runtime, _prompt(runtime, text)) for text in PASSES[texts_name]]
        return _summary(runtime, plugin, results)


def resident(config: str, texts_name: str, archive: str, model: str | None, threads: int) -> None:
    """One pass in this (fresh) process, a request per line read: `ready` once the runtime
    is up, then `I` runs request I of `texts_name` (its decode time and tokens), `end` the
    pass's summary. Answers go out on the original stdout; everything else written there
    (logs) goes to stderr."""
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    with _runtime(config, archive, model, threads) as (runtime, plugin):
        results = []
        for line in sys.stdin:
            command = line.strip()
            if command == "ready":
                answer: dict[str, Any] = {}
            elif command == "end":
                answer = _summary(runtime, plugin, results)
            else:
                prompt = _prompt(runtime, PASSES[texts_name][int(command)])
                indexes = plugin.archivist.indexes if plugin is not None else ()
                result = _generate(runtime, prompt)
                results.append(result)
                answer = {"ms": result.usage.predicted_ms, "tokens": result.usage.completion_tokens}
                if indexes:
                    answer["foresight"] = _foresight(
                        plugin,
                        indexes,
                        prompt,
                        list(result.candidates[0].tokens),
                        runtime.engine.governor.draft_max,
                    )
            print(json.dumps(answer), file=answers, flush=True)
            if command == "end":
                return


def llama_server_pass(
    binary: str, model_path: str, threads: int, texts_name: str, cache: Path | None
) -> dict[str, Any]:
    """One pass through a fresh llama-server: with the n-gram cache file `cache` (created
    empty if missing: a missing file stops it at start), or with no speculation."""
    import httpx
    from common import llama_server

    spec: list[str] = []
    if cache is not None:
        cache.touch()
        spec = ["--spec-type", "ngram-cache", "--lookup-cache-dynamic", str(cache)]
    tokens, decode_ms, drafted, accepted = 0, 0.0, 0, 0
    texts = []
    server = llama_server(binary, model_path, threads, extra=spec)
    with server as url, httpx.Client(timeout=900) as client:
        for text in PASSES[texts_name]:
            body = {
                "messages": [{"role": "user", "content": text}],
                "temperature": 0,
                "max_tokens": MAX_TOKENS,
            }
            data = client.post(f"{url}/v1/chat/completions", json=body).raise_for_status().json()
            timings = data["timings"]
            tokens += int(timings["predicted_n"])
            decode_ms += float(timings["predicted_ms"])
            drafted += int(timings.get("draft_n") or 0)
            accepted += int(timings.get("draft_n_accepted") or 0)
            texts.append(data["choices"][0]["message"]["content"])
    return {
        "tok_s": tokens / (decode_ms / 1000),
        "tokens": tokens,
        "proposed": {"ngram-cache": drafted},
        "accepted": {"ngram-cache": accepted},
        "outputs": texts,
        "cache_bytes": cache.stat().st_size if cache is not None and cache.exists() else None,
    }


def _summed(counts: list[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for each in counts:
        for source, n in each.items():
            total[source] = total.get(source, 0) + n
    return total


def _same(a: dict[str, Any], b: dict[str, Any]) -> str:
    pairs = list(zip(a["outputs"], b["outputs"], strict=True))
    return f"{sum(x == y for x, y in pairs)} of {len(pairs)}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", help="model alias or .gguf path (default: embedded)")
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--llama-server", help="llama.cpp's llama-server binary, to compare")
    parser.add_argument("--name", default="palimpsest", help="results file name (no extension)")
    parser.add_argument("--child", nargs="*")
    parser.add_argument("--resident", nargs="*")
    args = parser.parse_args()
    if args.child is not None:
        config, texts_name, archive = args.child
        print(json.dumps(child(config, texts_name, archive, args.model, args.threads)))
        return
    if args.resident is not None:
        config, texts_name, archive = args.resident
        resident(config, texts_name, archive, args.model, args.threads)
        return

    sys.path.insert(0, str(Path(__file__).parent))
    from common import Resident, measure, median_ratio, write_report

    from reame_core.models import resolve_model

    script = str(Path(__file__))
    # An alias resolves in the user's cache directory; the passes run on empty ones.
    model = str(resolve_model(args.model).path) if args.model else None
    extra = ["--threads", str(args.threads), *(["--model", model] if model else [])]

    def run(config: str, texts_name: str, archive: Path) -> dict[str, Any]:
        return measure(script, config, texts_name, str(archive), *extra)

    def side_by_side(texts_name: str, archive: Path) -> dict[str, dict[str, Any]]:
        """`with` and `without` in two resident processes, request by request, taking
        turns at going first."""
        sides = {
            config: Resident(script, config, texts_name, str(where), *extra)
            for config, where in (("with", archive), ("without", archive.parent / "none"))
        }
        try:
            for side in sides.values():
                side.ask("ready")
            pair = list(sides.values())
            foresight = []
            for i in range(len(PASSES[texts_name])):
                for side in pair if i % 2 == 0 else pair[::-1]:
                    answer = side.ask(str(i))
                    if "foresight" in answer:
                        foresight.append(answer["foresight"])
            ends = {config: side.ask("end") for config, side in sides.items()}
            ends["with"]["foresight"] = foresight
            return ends
        finally:
            for side in sides.values():
                side.close()

    model_path = ""
    if args.llama_server:
        from reame_core.models import resolve_model

        model_path = str(resolve_model(args.model or Settings().model).path)

    def theirs(texts_name: str, cache: Path | None) -> dict[str, Any]:
        return llama_server_pass(args.llama_server, model_path, args.threads, texts_name, cache)

    reps: dict[str, list[dict[str, Any]]] = {w: [] for w in args.workloads}
    for _ in range(args.reps):
        with tempfile.TemporaryDirectory() as scratch:
            root = Path(scratch)
            if "exact" in args.workloads:
                without = run("without", "exact", root / "none")
                first = run("with", "exact", root / "exact")
                second = run("with", "exact", root / "exact")
                rep = {"first": first, "second": second, "without": without}
                if args.llama_server:
                    rep["ls_without"] = theirs("exact", None)
                    rep["ls_first"] = theirs("exact", root / "exact.lcd")
                    rep["ls_second"] = theirs("exact", root / "exact.lcd")
                reps["exact"].append(rep)
            if {"near", "unrelated"} & set(args.workloads):
                run("with", "near-fill", root / "products")
                if args.llama_server:
                    theirs("near-fill", root / "products.lcd")
            for workload in ("near", "unrelated"):
                if workload not in args.workloads:
                    continue
                rep = side_by_side(workload, root / "products")
                if args.llama_server:
                    rep["ls_with"] = theirs(workload, root / "products.lcd")
                    rep["ls_without"] = theirs(workload, None)
                reps[workload].append(rep)
        print(
            json.dumps(
                {
                    w: [{k: round(v["tok_s"], 1) for k, v in r[-1].items()}]
                    for w, r in reps.items()
                    if r
                }
            ),
            flush=True,
        )

    pass_ms: dict[int, float] = {}
    if {"near", "unrelated"} & set(args.workloads):  # the ceiling with foresight's prices
        from pass_cost import pass_seconds

        from reame_core.models import resolve_model

        sizes = tuple(range(1, Settings().draft_max + 2))
        measured = pass_seconds(
            resolve_model(args.model or Settings().model).path, args.threads, 5, sizes
        )
        pass_ms = {n: measured[(n, "all")] * 1000 for n in sizes}

    report: dict[str, Any] = {"workloads": {}}
    for workload, runs in reps.items():
        if not runs:
            continue
        rates = {key: [r[key]["tok_s"] for r in runs] for key in runs[0]}
        row: dict[str, Any] = {
            key: {"tok_s": round(statistics.median(v), 1), "tok_s_by_rep": [round(x, 1) for x in v]}
            for key, v in rates.items()
        }
        if workload == "exact":
            row["second_vs_first"] = round(median_ratio(rates["second"], rates["first"]), 3)
            row["second_vs_without"] = round(median_ratio(rates["second"], rates["without"]), 3)
            ceilings = [r["second"]["ceiling"]["speedup"] for r in runs if r["second"]["ceiling"]]
            row["ceiling"] = round(statistics.median(ceilings), 3) if ceilings else None
            row["share_of_ceiling"] = (
                round(row["second_vs_first"] / row["ceiling"], 3) if row["ceiling"] else None
            )
            row["ceiling_by_rep"] = [r["second"]["ceiling"] for r in runs]
            row["outputs_identical_to_without"] = [_same(r["second"], r["without"]) for r in runs]
            mine = "second"
        else:
            ratios = [w / o for w, o in zip(rates["with"], rates["without"], strict=True)]
            row["with_vs_without"] = round(statistics.median(ratios), 3)
            row["with_vs_without_by_rep"] = [round(r, 3) for r in ratios]
            foresights = [r["with"].pop("foresight") for r in runs]
            ceilings = [ceiling_with_foresight(f, pass_ms) for f in foresights]
            row["ceiling_with_foresight"] = round(statistics.median(ceilings), 3)
            row["ceiling_with_foresight_by_rep"] = [round(c, 3) for c in ceilings]
            share = row["with_vs_without"] / row["ceiling_with_foresight"]
            row["share_of_ceiling"] = round(share, 3)
            references = [policy_reference(f, pass_ms) for f in foresights]
            row["policy_reference"] = round(statistics.median(references), 3)
            row["policy_reference_by_rep"] = [round(r, 3) for r in references]
            row["share_of_policy_reference"] = round(
                row["with_vs_without"] / row["policy_reference"], 3
            )
            row["pass_ms_for_the_ceiling"] = {n: round(ms, 2) for n, ms in pass_ms.items()}
            row["outputs_identical_to_without"] = [_same(r["with"], r["without"]) for r in runs]
            mine = "with"
        if "ls_without" in runs[0]:
            ls_mine = "ls_second" if workload == "exact" else "ls_with"
            row["llama_server"] = {
                "vs_its_own_without": round(median_ratio(rates[ls_mine], rates["ls_without"]), 3),
                "accepted": _summed([r[ls_mine]["accepted"] for r in runs]),
                "proposed": _summed([r[ls_mine]["proposed"] for r in runs]),
                "cache_bytes_by_rep": [r[ls_mine]["cache_bytes"] for r in runs],
                "outputs_identical_to_its_without": [
                    _same(r[ls_mine], r["ls_without"]) for r in runs
                ],
            }
            if workload == "exact":
                row["llama_server"]["second_vs_first"] = round(
                    median_ratio(rates["ls_second"], rates["ls_first"]), 3
                )
            row["reame_vs_llama_server"] = round(median_ratio(rates[mine], rates[ls_mine]), 3)
        row["accepted_by_source"] = _summed([r[mine]["accepted"] for r in runs])
        row["proposed_by_source"] = _summed([r[mine]["proposed"] for r in runs])
        row["archive_by_rep"] = [r[mine]["archive"] for r in runs]
        row["pass_ms"] = runs[-1][mine]["pass_ms"]
        row["acceptance_by_kind_by_rep"] = [r[mine].get("kinds", {}) for r in runs]
        report["workloads"][workload] = row
        print(json.dumps({workload: row}), flush=True)

    used = {
        summary["draft_max"]
        for runs in reps.values()
        for rep in runs
        for summary in rep.values()
        if "draft_max" in summary  # Reame's passes (not llama-server's)
    }
    report.update(
        threads=args.threads,
        reps=args.reps,
        max_tokens=MAX_TOKENS,
        draft_max=Settings().draft_max,  # REAME_DRAFT_MAX in the environment, else the default
        draft_max_used=sorted(used),  # what the engine allowed: the pass check may cap it
        model=args.model or "smollm2-135m (embedded, Q4_1)",
        command=" ".join(["python", "benchmarks/palimpsest.py", *sys.argv[1:]]),
    )
    print(f"\nwritten to {write_report(args.name, report)}")


if __name__ == "__main__":
    main()
