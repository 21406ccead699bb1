"""Whether greedy answers repeat: the trace's slice replayed against fresh `reame serve`
processes of this worktree, answers compared per request id.

Every request of the trace is greedy (temperature 0), and a rerun repeats an earlier
request's body, so in the deterministic configuration (README "Determinism") every answer
must be the same in every replay, and a rerun must answer as the request it repeats.
Each replay starts its own server with `FLAGS` (fresh directories for the disk cache and
the archive), on this worktree's code and plugins (PYTHONPATH), so flags can be bisected:

    flock /tmp/reame-cpu.lock .venv/bin/python benchmarks/trace_repeat.py [--requests 9]
        [--replays 2] [-- --speculate off --disable-plugin diskkv ...]

Prints each request whose answers differ, and writes results/trace_repeat.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from reame_core.bench.against import reame_server  # noqa: E402
from reame_core.bench.replay import replay  # noqa: E402
from reame_core.bench.trace import BENCH_PACE, trace_for  # noqa: E402

PLUGINS = ("reame_diskkv", "reame_palimpsest", "reame_suggeritore", "reame_conclave")


def one_replay(requests: list, flags: list[str]) -> dict[str, str]:
    path = ":".join([str(ROOT), *(str(ROOT / "plugins" / name) for name in PLUGINS)])
    with tempfile.TemporaryDirectory() as scratch:
        env = {
            "PYTHONPATH": path,
            "REAME_PLUGINS__DISKKV__DIR": f"{scratch}/kv",
            "REAME_PLUGINS__PALIMPSEST__DIR": f"{scratch}/palimpsest",
        }
        with reame_server("smollm2-135m", *flags, env=env) as server:
            outcomes = replay(server, requests, BENCH_PACE)
    return {o.id: o.error or o.content for o in outcomes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=9)
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--replays", type=int, default=2)
    parser.add_argument("flags", nargs="*", help="reame serve flags (after --)")
    args = parser.parse_args()
    requests = trace_for(args.requests, args.max_tokens)
    repeats = {r["id"]: r.get("rerun_of") for r in requests}
    replays = [one_replay(requests, args.flags) for _ in range(args.replays)]
    differ = sorted(i for i in replays[0] if len({run[i] for run in replays}) > 1)
    reruns = {}
    for rid, original in repeats.items():
        if original and original in replays[0]:
            reruns[rid] = [run[rid] == run[original] for run in replays]
    for rid in differ:
        print(f"{rid}: answers differ between replays")
        for run in replays:
            print("   ", json.dumps(run[rid])[:200])
    for rid, same in reruns.items():
        print(f"{rid} (rerun of {repeats[rid]}): same answer as the original per replay: {same}")
    out = ROOT / "benchmarks" / "results" / "trace_repeat.json"
    out.write_text(
        json.dumps(
            {"flags": args.flags, "differ": differ, "reruns": reruns, "replays": replays},
            indent=1,
        )
    )
    print("differing:", len(differ), "of", len(replays[0]), "->", out)


if __name__ == "__main__":
    main()
