"""How much of the trace's prompts any router could reuse, read off runs of benchmarks/fleet.py.

`fleet.py --workload trace` records, request by request in the trace's order, the prompt
tokens and the tokens reused (`cached_tokens`) of every run of every router. The most any
run reused of each request, summed (the trace's first request taken as finding nothing
before it), is a measured reference for what a router can reuse on the trace: every reuse
in it happened in some run, though no one run need reach it (the trace's first two
extractions arrive together behind the same instructions, and either may be the one that
computes them). Beside it, each router's pooled share and its share of that reference, and
the requests where routers reused different amounts, with what each run reused.

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


def reuse(names: list[str]) -> dict[str, Any]:
    prompts: dict[int, int] = {}
    reused: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    hosts = set()
    for name in names:
        report = json.loads((RESULTS / f"{name}.json").read_text())
        hosts.add(report["host"])
        for run in report["runs"]:
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
    for figures in routers.values():
        figures["share_of_most_reused"] = round(figures["reused_share_pooled"] / reference, 4)
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
            f"({figures['share_of_most_reused']:.1%} of it)"
        )
    for index, row in report["requests_reused_differently"].items():
        runs = {router: reused for router, reused in row.items() if router != "prompt_tokens"}
        print(f"request {index:>2s} ({row['prompt_tokens']} tokens): {runs}")
    print(f"wrote {write_report(args.name, {'command': ' '.join(sys.argv), **report})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
