"""A fleet of two replicas on a local Ray cluster: Reame's request router against Ray
Serve's default (power of two choices) and Ray Serve LLM's PrefixCacheAffinityRouter.

Workload (seeded): six ~500-token system prompts shared by many requests — one-shot
questions and multi-turn sessions (`X-Session-ID`) — sent by concurrent clients, after a
warm-up that sends each system prompt once (not measured: every router must compute each
prompt once; what a router controls is what happens next). Each arm starts a fresh cluster
on a fresh fleet directory, in a child process, with the replicas sharing a disk prefix
cache (`shared`) or with no disk cache at all (`off`), and streams every request: time to
first token (TTFT) is measured at the client, prompt tokens reused from the usage chunk
(`cached_tokens`: from a slot or from the shared disk cache). Arms run in alternating
order over repetitions.

With `--workload trace`, the clients are the realistic trace instead (`reame_core.bench.trace`:
extractions into one JSON schema behind one long shared prompt, chat sessions, rewrites,
the night's reruns; `--trace-requests` of it, answers cut at `--trace-max-tokens`), replayed
on its clock stretched by `--pace` (`reame_core.bench.replay`), with no warm-up.

Also reported, per replica, the figures a larger fleet is sized from: disk cache bytes per
cached token and bytes written per computed prompt, and the router's state size.

    .venv/bin/python benchmarks/fleet.py [--reps 1] [--routers reame,pow2,prefix]
        [--disks shared,off] [--workload sessions|trace] [--pace 0.25]

Ray's workers import `reame_core` as installed, not from the current directory: to measure
another checkout of Reame, put it first on PYTHONPATH, with its four plugin directories
(plugins/reame_*): an installed plugin newer than the checkout's core fails to register.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from common import free_port, measure, write_report

SUBJECTS = (
    ("invoices", "Extract the supplier, the date, the total and the currency"),
    ("tickets", "Classify the support ticket by urgency and product area"),
    ("contracts", "List the parties, the term and the notice period"),
    ("recipes", "Give the main ingredient, the cooking time and the difficulty"),
    ("shipments", "Give the carrier, the tracking number and the delivery date"),
    ("reviews", "Give the product, the rating out of five and the main complaint"),
)
QUESTIONS = (
    "Acme Ltd, 3 March, 1,200 EUR.",
    "The app crashes when I upload a photo.",
    "Between Rossi and Bianchi, two years, notice of three months.",
    "Risotto with saffron, forty minutes, medium.",
    "Invoice from Nordic AB dated 9 May for 310 SEK.",
    "Login fails after the update on Android.",
    "Lease between Verdi srl and a tenant, five years.",
    "Lentil soup, one hour, easy.",
)
MAX_TOKENS = 12
FORWARDED = (  # the options a measuring child gets
    "model", "seed", "sessions", "turns", "one_shots", "clients",
    "workload", "trace_requests", "trace_max_tokens", "pace",
)  # fmt: skip


def system_prompt(subject: str, task: str) -> str:
    rules = " ".join(
        f"Rule {i}: when the {subject} text mentions item {i}, report it exactly as written, "
        f"without translation, in the field it belongs to."
        for i in range(1, 17)
    )
    return f"You process {subject}. {task}. Answer as compact JSON. {rules}"


@dataclass
class Job:
    """One client's sequence: a session's turns, or one one-shot question."""

    system: str
    questions: list[str]
    session: str | None = None


@dataclass
class Result:
    ttft: float
    prompt_tokens: int
    cached_tokens: int
    replica: str
    ok: bool = True
    session: str | None = None  # None: a one-shot question
    turn: int = 0
    # The trace only: seconds after the replay began that it was sent, and from then to
    # its answer's end.
    sent: float = 0.0
    latency: float = 0.0


@dataclass
class Workload:
    warmup: list[Job] = field(default_factory=list)  # each system prompt once, not measured
    jobs: list[Job] = field(default_factory=list)


def workload(seed: int, sessions: int, one_shots: int, turns: int) -> Workload:
    rng = random.Random(seed)
    systems = [system_prompt(s, t) for s, t in SUBJECTS]
    jobs = [
        Job(rng.choice(systems), rng.sample(QUESTIONS, turns), session=f"session-{i}")
        for i in range(sessions)
    ]
    jobs += [Job(rng.choice(systems), [rng.choice(QUESTIONS)]) for _ in range(one_shots)]
    rng.shuffle(jobs)
    return Workload([Job(system, ["Ready?"]) for system in systems], jobs)


def run_job(url: str, job: Job, results: list[Result], lock: threading.Lock) -> None:
    import httpx

    messages: list[dict[str, str]] = [{"role": "system", "content": job.system}]
    headers = {"X-Session-ID": job.session} if job.session else {}
    with httpx.Client(timeout=300) as client:
        for turn, question in enumerate(job.questions):
            messages.append({"role": "user", "content": question})
            body = {
                "messages": messages,
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            started = time.perf_counter()
            ttft, text, usage, replica = None, "", {}, ""
            with client.stream(
                "POST", f"{url}/v1/chat/completions", json=body, headers=headers
            ) as reply:
                replica = reply.headers.get("x-reame-replica", "")
                for line in reply.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        break
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    for choice in chunk.get("choices", ()):
                        piece = choice.get("delta", {}).get("content") or ""
                        if ttft is None and piece:  # the first chunk only names the role
                            ttft = time.perf_counter() - started
                        text += piece
            result = Result(
                ttft=ttft if ttft is not None else float("nan"),
                prompt_tokens=int(usage.get("prompt_tokens", 0)),
                cached_tokens=int(usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)),
                replica=replica,
                ok=ttft is not None and bool(usage),
                session=job.session,
                turn=turn,
            )
            with lock:
                results.append(result)
            messages.append({"role": "assistant", "content": text})


def drive(url: str, jobs: list[Job], clients: int) -> list[Result]:
    results: list[Result] = []
    lock = threading.Lock()
    pending = list(jobs)

    def client() -> None:
        while True:
            with lock:
                if not pending:
                    return
                job = pending.pop(0)
            run_job(url, job, results, lock)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def replay_trace(url: str, requests: int, max_tokens: int, pace: float) -> list[Result]:
    """The realistic trace (`reame_core.bench.trace`: extractions behind one long shared
    prompt, chat sessions, rewrites, the night's reruns) replayed on its clock stretched
    by `pace`, each request's outcome as a `Result`."""
    from reame_core.bench.against import Server
    from reame_core.bench.replay import replay
    from reame_core.bench.trace import trace_for

    trace = trace_for(requests, max_tokens)
    turns: dict[str | None, int] = {}
    place: dict[str, tuple[str | None, int]] = {}  # request id: its session and turn
    for request in trace:
        session = request.get("session")
        place[request["id"]] = (session, turns.get(session, 0) if session else 0)
        turns[session] = turns.get(session, 0) + 1
    results = []
    for outcome in replay(Server(url), trace, pace):
        session, turn = place[outcome.id]
        details = outcome.usage.get("prompt_tokens_details") or {}
        results.append(
            Result(
                ttft=outcome.ttft,
                prompt_tokens=int(outcome.usage.get("prompt_tokens", 0)),
                cached_tokens=int(details.get("cached_tokens", 0)),
                replica=outcome.replica,
                ok=outcome.error is None and outcome.ttft > 0 and bool(outcome.usage),
                session=session,
                turn=turn,
                sent=round(outcome.sent, 3),
                latency=round(outcome.latency, 3),
            )
        )
    return results


def child(router: str, disk: str, args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from ray import serve

    from reame_core.fleet.app import FleetPlan, build_fleet

    with tempfile.TemporaryDirectory(prefix="reame-fleet-") as directory:
        fleet_dir = Path(directory)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            port = free_port()
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            started = time.perf_counter()
            plan = FleetPlan(replicas=2, threads=1, router=router, fleet_dir=fleet_dir)  # type: ignore[arg-type]
            settings: dict[str, Any] = {
                "model": args.model, "ctx": 2048, "parallel": 2, "speculate": "off",
            }  # fmt: skip
            if disk == "off":
                settings["disable_plugins"] = ["diskkv"]
            serve.run(build_fleet(settings, plan), name="reame", route_prefix="/")
            ready = time.perf_counter() - started
            url = f"http://127.0.0.1:{port}"
            if args.workload == "trace":
                warm: list[Result] = []
                began = time.perf_counter()
                results = replay_trace(url, args.trace_requests, args.trace_max_tokens, args.pace)
            else:
                load = workload(args.seed, args.sessions, args.one_shots, args.turns)
                warm = drive(url, load.warmup, 2)
                began = time.perf_counter()
                results = drive(url, load.jobs, args.clients)
            wall = time.perf_counter() - began
            counters = replica_counters(url, 2)
        finally:
            serve.shutdown()
            ray.shutdown()
        kv = list(fleet_dir.glob("kv/v*/*.kv"))
        disk_bytes = sum(p.stat().st_size for p in kv)
    ok = [r for r in results if r.ok]
    ttfts = sorted(r.ttft for r in ok)
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    per_replica: dict[str, int] = {}
    for r in ok:
        per_replica[r.replica] = per_replica.get(r.replica, 0) + 1
    return {
        "router": router,
        "disk": disk,
        "warmup_ttft_s": [round(r.ttft, 2) for r in warm],
        "requests": len(results),
        "failed": len(results) - len(ok),
        "ttft_p50_s": round(statistics.median(ttfts), 3),
        "ttft_p95_s": round(ttfts[min(len(ttfts) - 1, int(0.95 * len(ttfts)))], 3),
        "ttft_mean_s": round(statistics.fmean(ttfts), 3),
        "prompt_tokens": prompt,
        "reused_tokens": cached,
        "reused_share": round(cached / prompt, 3) if prompt else 0.0,
        "wall_s": round(wall, 1),
        "fleet_ready_s": round(ready, 1),
        "requests_per_replica": sorted(per_replica.values()),
        "disk_entries": len(kv),
        "disk_bytes": disk_bytes,
        "prompt_tokens_by_replica": counters,
        "results": [asdict(r) for r in results],
    }


def replica_counters(url: str, replicas: int) -> dict[str, dict[str, float]]:
    """Each replica's prompt-token counters (computed, reused from a slot, restored from
    disk), read from its /metrics through the ingress until every replica has answered."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    seen: dict[str, dict[str, float]] = {}
    for _ in range(40):
        reply = httpx.get(f"{url}/metrics", timeout=30)
        name = reply.headers.get("x-reame-replica", "")
        if name in seen:
            continue
        counters = {}
        for family in text_string_to_metric_families(reply.text):
            if family.name == "reame_prompt_tokens":
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        counters[sample.labels["kind"]] = sample.value
        seen[name] = counters
        if len(seen) == replicas:
            break
    return seen


def router_scale(replicas: int, prompts_per_replica: int, sessions: int) -> dict[str, Any]:
    """The router's memory and time per decision for a large fleet, on synthetic state:
    every replica's slots full of distinct prompts, each also in flight and homed there,
    the shared set holding them all, `sessions` live, each with a conversation of about
    1,700 characters."""
    import tracemalloc

    from reame_core.fleet.affinity import FleetAffinity, RoutingStats, prefix_chain

    tracemalloc.start()
    affinity = FleetAffinity(rng=random.Random(1))
    base = tracemalloc.get_traced_memory()[0]
    for r in range(replicas):
        texts = [f"replica {r} prompt {p} " * 200 for p in range(prompts_per_replica)]
        chains = [prefix_chain(text) for text in texts]
        stored = [h for chain in chains for h in chain]
        affinity.observe(
            f"r{r}",
            RoutingStats(
                slots=prompts_per_replica, resident=chains, stored=stored, shared_cache=True
            ),
        )
        for text in texts:
            affinity.routed(f"r{r}", text)
    for s in range(sessions):
        conversation = prefix_chain(f"session {s}, a conversation of a few turns " * 40)
        affinity.sessions.turn(f"session-{s:08d}", f"r{s % replicas}", conversation, 0.0)
    size = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    ids = [f"r{r}" for r in range(replicas)]
    text = "replica 3 prompt 1 " * 200
    began = time.perf_counter()
    for _ in range(200):
        affinity.rank(ids, text)
    per_decision = (time.perf_counter() - began) / 200
    report = RoutingStats(
        slots=4,
        resident=[prefix_chain(f"p{p} " * 2000) for p in range(4)],
        stored=[h for p in range(64) for h in prefix_chain(f"p{p} " * 500)],
    )
    return {
        "replicas": replicas,
        "prompts_per_replica": prompts_per_replica,
        "sessions": sessions,
        "router_bytes": size,
        "rank_seconds": per_decision,
        "report_bytes_4_slots_of_8k_chars_64_stored_2k_chars": len(json.dumps(report.as_dict())),
    }


def measure_router_scale() -> list[dict[str, Any]]:
    """`router_scale` for 10 replicas with 10,000 sessions and 100 with 100,000, printed."""
    scale = [router_scale(n, 8, 10 * n * 100) for n in (10, 100)]
    for row in scale:
        print(
            f"router state, {row['replicas']} replicas: {row['router_bytes'] / 1e6:.1f} MB, "
            f"{row['rank_seconds'] * 1e3:.2f} ms a decision",
            flush=True,
        )
    return scale


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per router and disk mode: the medians over repetitions of each run's TTFT p50 and
    p95 and prompt share reused, and, the requests of every repetition pooled, TTFT p50,
    p95 and mean, and per kind of request (one-shot questions, a session's first turn,
    its later turns) the mean TTFT and how many reused some prefix. With 40 requests a
    run, a run's p50 falls between the fast requests (a prefix reused, ~0.6 s) and the
    slow ones (computed cold behind others, ~4 s), and one or two requests more on either
    side move it from one to the other: the pooled figures and the kinds say more."""
    summary: dict[str, dict[str, Any]] = {}
    for router, disk in dict.fromkeys((r["router"], r["disk"]) for r in runs):
        mine = [r for r in runs if r["router"] == router and r["disk"] == disk]
        pooled = [x for r in mine for x in r["results"] if x["ok"]]
        ttfts = sorted(x["ttft"] for x in pooled)
        kinds: dict[str, dict[str, Any]] = {}
        for kind, chosen in (
            ("one_shot", [x for x in pooled if x["session"] is None]),
            ("first_turn", [x for x in pooled if x["session"] and x["turn"] == 0]),
            ("later_turn", [x for x in pooled if x["session"] and x["turn"] > 0]),
        ):
            if chosen:
                kinds[kind] = {
                    "requests": len(chosen),
                    "ttft_mean_s": round(statistics.fmean(x["ttft"] for x in chosen), 3),
                    "reused_a_prefix": sum(1 for x in chosen if x["cached_tokens"] > 0),
                }
        summary[f"{router}, disk {disk}"] = {
            "ttft_p50_s": statistics.median(r["ttft_p50_s"] for r in mine),
            "ttft_p95_s": statistics.median(r["ttft_p95_s"] for r in mine),
            "reused_share": statistics.median(r["reused_share"] for r in mine),
            "pooled_requests": len(ttfts),
            "pooled_ttft_p50_s": round(statistics.median(ttfts), 3),
            "pooled_ttft_p95_s": round(ttfts[min(len(ttfts) - 1, int(0.95 * len(ttfts)))], 3),
            "pooled_ttft_mean_s": round(statistics.fmean(ttfts), 3),
            "by_kind": kinds,
        }
    return summary


def resummarize(path: Path) -> None:
    """Recompute the summary of a results file from its runs, in place."""
    report = json.loads(path.read_text())
    report["summary"] = summarize(report["runs"])
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["summary"], indent=2))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--router", default="reame", help=argparse.SUPPRESS)
    parser.add_argument("--disk", default="shared", help=argparse.SUPPRESS)
    parser.add_argument("--routers", default="reame,pow2,prefix")
    parser.add_argument(
        "--disks",
        default="shared,off",
        help="shared: the replicas share a disk prefix cache; off: no disk cache at all",
    )
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--one-shots", type=int, default=16)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument(
        "--workload",
        choices=("sessions", "trace"),
        default="sessions",
        help="the system prompts' sessions and questions, or the realistic trace",
    )
    parser.add_argument("--trace-requests", type=int, default=38, help="the trace, sliced")
    parser.add_argument("--trace-max-tokens", type=int, default=128, help="per answer, at most")
    parser.add_argument("--pace", type=float, default=0.25, help="the trace's clock stretched")
    parser.add_argument("--out", default="fleet")
    parser.add_argument(
        "--summarize", type=Path, help="recompute the summary of this results file and exit"
    )
    parser.add_argument(
        "--router-scale-only",
        action="store_true",
        help="measure only the router's state and decision time on synthetic large fleets",
    )
    args = parser.parse_args()
    if args.summarize:
        resummarize(args.summarize)
        return 0
    if args.router_scale_only:
        scale = measure_router_scale()
        path = write_report(
            args.out,
            {"command": " ".join(["benchmarks/fleet.py", *sys.argv[1:]]), "router_scale": scale},
        )
        print(f"wrote {path}")
        return 0
    if args.child:
        print(json.dumps(child(args.router, args.disk, args)))
        return 0
    routers = args.routers.split(",")
    runs: list[dict[str, Any]] = []
    forwarded = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k in FORWARDED]
    for rep in range(args.reps):
        for disk in args.disks.split(","):
            order = routers if rep % 2 == 0 else list(reversed(routers))
            for router in order:
                run = measure(__file__, f"--router={router}", f"--disk={disk}", *forwarded)
                run["rep"] = rep
                print(
                    f"rep {rep} disk {disk:6s} {router:6s}: TTFT p50 {run['ttft_p50_s']:.2f} s, "
                    f"p95 {run['ttft_p95_s']:.2f} s, reused {run['reused_share']:.0%} of "
                    f"{run['prompt_tokens']} prompt tokens, {run['failed']} failed, "
                    f"per replica {run['requests_per_replica']}",
                    flush=True,
                )
                runs.append(run)
    scale = measure_router_scale()
    summary = summarize(runs)
    path = write_report(
        args.out,
        {
            "command": " ".join(["benchmarks/fleet.py", *sys.argv[1:]]),
            "model": args.model,
            "replicas": 2,
            "threads_per_replica": 1,
            "workload": {
                "kind": args.workload,
                "trace_requests": args.trace_requests,
                "trace_max_tokens": args.trace_max_tokens,
                "pace": args.pace,
                "seed": args.seed,
                "sessions": args.sessions,
                "turns": args.turns,
                "one_shots": args.one_shots,
                "clients": args.clients,
                "max_tokens": MAX_TOKENS,
                "system_prompts": len(SUBJECTS),
            },
            "summary": summary,
            "router_scale": scale,
            "runs": runs,
        },
    )
    print(json.dumps(summary, indent=2))
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    sys.exit(main())
