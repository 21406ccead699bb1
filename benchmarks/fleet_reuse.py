"""How much of the trace's prompts any router could reuse, and each router's figures pooled
over several runs, read off runs of benchmarks/fleet.py.

`fleet.py --workload trace` records, request by request in the trace's order, the prompt
tokens and the tokens reused (`cached_tokens`) of every run of every router. The most any
run reused of each request, summed (the trace's first request taken as finding nothing
before it), is a measured reference for what a router can reuse on the trace: every reuse
in it happened in some run, though no one run need reach it (the trace's first two
extractions arrive together behind the same instructions, and either may be the one that
computes them). Beside it, each router's pooled share and its share of that reference, and
the requests where routers reused different amounts, with what each run reused. And each
router's time to first token over the requests of every run pooled (as fleet.py pools a
run's repetitions), the share of the sessions' later turns reused, and, where the runs
named the replica that answered each request, how each run spread the trace's kinds of
request over the replicas.

    .venv/bin/python benchmarks/fleet_reuse.py RESULTS [RESULTS ...] [--name NAME]

RESULTS are names of benchmarks/results/*.json files written by fleet.py on the trace.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from common import RESULTS, write_report
from fleet import summarize

from reame_core.bench.trace import trace_for


def reuse(names: list[str]) -> dict[str, Any]:
    prompts: dict[int, int] = {}
    reused: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    hosts = set()
    runs: list[dict[str, Any]] = []
    spread: dict[str, list[list[dict[str, int]]]] = defaultdict(list)
    for name in names:
        report = json.loads((RESULTS / f"{name}.json").read_text())
        hosts.add(report["host"])
        workload = report["workload"]
        trace = trace_for(workload["trace_requests"], workload["trace_max_tokens"])
        kinds = [request["kind"] for request in trace]
        for run in report["runs"]:
            runs.append(run)
            spread[run["router"]].append(_spread(run["results"], kinds))
            for index, result in enumerate(run["results"]):
                if prompts.setdefault(index, result["prompt_tokens"]) != result["prompt_tokens"]:
                    raise SystemExit(f"{name}: request {index}'s prompt differs between runs")
                reused[run["router"]][index].append(result["cached_tokens"])
    total = sum(prompts.values())
    most = {i: max(max(r[i]) for r in reused.values()) for i in prompts if i > 0}
    routers = {
        router: {
            "runs": len(by_request[0]),
            "reused_share_pooled": round(
                sum(map(sum, by_request.values())) / (total * len(by_request[0])), 4
            ),
        }
        for router, by_request in reused.items()
    }
    reference = sum(most.values()) / total
    pooled = {key.split(",")[0]: figures for key, figures in summarize(runs).items()}
    for router, figures in routers.items():
        figures["share_of_most_reused"] = round(figures["reused_share_pooled"] / reference, 4)
        later = [x for r in runs if r["router"] == router for x in r["results"] if x["turn"] > 0]
        figures["later_turns_reused_share"] = round(
            sum(x["cached_tokens"] for x in later) / max(1, sum(x["prompt_tokens"] for x in later)),
            4,
        )
        for figure in ("p50", "p95", "mean"):
            figures[f"ttft_{figure}_s"] = pooled[router][f"pooled_ttft_{figure}_s"]
        if all(spread[router]):
            figures["replicas_by_kind"] = spread[router]
    differing = {
        str(i): {"prompt_tokens": prompts[i], **{router: r[i] for router, r in reused.items()}}
        for i in prompts
        if len({n for r in reused.values() for n in r[i]}) > 1
    }
    return {
        "inputs": names,
        "measured_on": sorted(hosts),
        "requests": len(prompts),
        "prompt_tokens": total,
        "most_reused_share": round(reference, 4),
        "routers": routers,
        "requests_reused_differently": differing,
    }


def _spread(results: list[dict[str, Any]], kinds: list[str]) -> list[dict[str, int]]:
    """Requests of each kind each replica answered (none if the run did not name them)."""
    if not all(result["replica"] for result in results):
        return []
    by_replica: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for result, kind in zip(results, kinds, strict=True):
        by_replica[result["replica"]][kind] += 1
    return [dict(counts) for _, counts in sorted(by_replica.items())]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+")
    parser.add_argument("--name", default="fleet_reuse")
    args = parser.parse_args()
    report = reuse(args.results)
    print(f"most reused, request by request: {report['most_reused_share']:.2%}")
    for router, figures in report["routers"].items():
        print(
            f"{router:7s} {figures['reused_share_pooled']:.2%} over {figures['runs']} runs "
            f"({figures['share_of_most_reused']:.1%} of it; later turns "
            f"{figures['later_turns_reused_share']:.1%}), TTFT p50 {figures['ttft_p50_s']} s, "
            f"p95 {figures['ttft_p95_s']} s, mean {figures['ttft_mean_s']} s"
        )
        for replicas in figures.get("replicas_by_kind", ()):
            print(f"        by replica: {replicas}")
    for index, row in report["requests_reused_differently"].items():
        runs = {router: reused for router, reused in row.items() if router != "prompt_tokens"}
        print(f"request {index:>2s} ({row['prompt_tokens']} tokens): {runs}")
    print(f"wrote {write_report(args.name, {'command': ' '.join(sys.argv), **report})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
