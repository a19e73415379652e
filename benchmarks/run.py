#!/usr/bin/env python3
"""Run workloads a-d for joblane, PgQueuer, Procrastinate and PGMQ in one session; medians and ratios.

    python benchmarks/run.py --reps 3                      # everything, peers.md sizes
    python benchmarks/run.py --reps 1 --scale 0.2 -w c     # a quick look at c
    python benchmarks/run.py --reps 5 -w b --systems joblane,pgqueuer,pgmq

Each measurement is a fresh process on a fresh database or schema; the
systems take turns within each repetition so that drift on a noisy machine
hits them alike. Results go to benchmarks/results.json (or --out); report.py turns them
into docs/benchmarks.md and docs/benchmarks.png.

The cost of a commit on this machine (a one-row INSERT in autocommit: the
WAL flush every durable transaction pays) is measured before and after the
runs, printed and kept with the results: workloads a and d are bound by it.

joblane's b has three rows: App.enqueue_many of JobSpecs ("-", compared
with the peers' b), the task's typed bulk form ("typed") and the first with
notifications off ("notify off"). `joblane bench -w b` measures the three in
one process; here each runs in a fresh process of its own
(`python -m joblane.showcase.bench DSN VARIANT JOBS`), as the peers do.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PEERS_PY = HERE / ".venv-peers" / "bin" / "python"
JOBLANE_PY = ROOT / ".venv" / "bin" / "python"

SIZES = {"a": 5000, "b": 50_000, "c": 20_000, "d": 500}
SYSTEMS = "joblane,pgqueuer,procrastinate,pgmq"

# joblane's variants of b, each measured in a process of its own (joblane.showcase.bench.main)
B_VARIANTS = ["-", "typed", "notify off"]


def measurements(workloads: list[str], systems: list[str]) -> list[tuple[str, str, str | None]]:
    """(system, workload, profile) in the order one repetition runs them."""
    out = []
    for w in workloads:
        profiles = ["defaults", "best", "lean"] if w == "c" else [None]
        for p in profiles:
            for s in systems:
                if s == "joblane" and w == "b":
                    out += [(s, w, v) for v in B_VARIANTS]
                elif p != "lean" or s == "joblane":  # lean: joblane's best with App.task(lean=True)
                    out.append((s, w, p))
    return out


def command(system: str, workload: str, profile: str | None, dsn: str, jobs: int) -> list[str]:
    if system == "joblane" and workload == "b":
        return [str(JOBLANE_PY), "-m", "joblane.showcase.bench", dsn, profile or "-", str(jobs)]
    if system == "joblane":
        cmd = [str(JOBLANE_PY), "-m", "joblane", "--database-url", dsn, "bench", "-w", workload, "--jobs", str(jobs),
               "--json"]
        if profile:
            cmd += ["--profile", profile]
        return cmd
    script = HERE / "peers" / f"{system}_bench.py"
    cmd = [str(PEERS_PY), str(script), "--dsn", dsn, "--workload", workload, "--jobs", str(jobs)]
    if profile:
        cmd += ["--profile", profile]
    return cmd


def run_one(cmd: list[str], timeout: float) -> list[dict]:
    """The JSON results a measurement printed (joblane's b prints three), or none when it failed."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        print(f"  timed out: {' '.join(cmd[:4])}...", file=sys.stderr)
        return []
    if done.returncode != 0:
        print(f"  failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return []
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def variant(result: dict, profile: str | None) -> str:
    """The row a result belongs to: the profile of c, joblane's variants of b, else "-"."""
    settings = result.get("settings")
    if result.get("system") == "joblane" and result.get("workload") == "b" and isinstance(settings, str):
        tags = [t for t in ("typed", "notify off") if t in settings]
        return ", ".join(tags) or "-"
    return profile or "-"


def commit_cost(dsn: str) -> dict | None:
    """What one commit and one round trip cost on this machine (ms), or None when it cannot be measured."""
    try:
        # joblane.showcase.bench.commit_cost, as `joblane bench` measures it
        done = subprocess.run([str(JOBLANE_PY), "-m", "joblane.showcase.bench", "commit-cost", dsn],
                              capture_output=True, text=True, timeout=120, cwd=ROOT)
        return json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def describe_cost(cost: dict) -> str:
    return (f"commit {cost['commit_ms']:.2f} ms ({cost.get('commits_per_s', 0):,} commits/s, one-row INSERT in "
            f"autocommit, synchronous_commit {cost.get('synchronous_commit', '?')}), round trip "
            f"{cost['round_trip_ms']:.2f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", default=os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("-w", "--workload", action="append", choices=sorted(SIZES))
    parser.add_argument("--systems", default=SYSTEMS)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--out", default=str(HERE / "results.json"))
    args = parser.parse_args()

    systems = args.systems.split(",")
    if any(s != "joblane" for s in systems) and not PEERS_PY.exists():
        subprocess.run(["bash", str(HERE / "peers" / "setup.sh")], check=True)
    workloads = args.workload or sorted(SIZES)
    plan = measurements(workloads, systems)
    samples: dict[tuple[str, str, str], list[dict]] = {}
    costs = [commit_cost(args.dsn)]
    if costs[0]:
        print(f"before: {describe_cost(costs[0])}", file=sys.stderr)
    total = len(plan) * args.reps
    n = 0
    for rep in range(args.reps):
        for system, workload, profile in plan:
            n += 1
            jobs = max(50, int(SIZES[workload] * args.scale))
            print(f"[{n}/{total}] rep {rep + 1}: {system} {workload} {profile or ''}", file=sys.stderr, flush=True)
            for result in run_one(command(system, workload, profile, args.dsn, jobs), args.timeout):
                samples.setdefault((system, workload, variant(result, profile)), []).append(result)
    costs.append(commit_cost(args.dsn))
    if costs[1]:
        print(f"after: {describe_cost(costs[1])}", file=sys.stderr)

    rows = []
    for (system, workload, profile), got in sorted(samples.items()):
        key = "p50_ms" if workload == "d" else "value"
        row = {"system": system, "workload": workload, "profile": profile, "runs": len(got),
               "median": statistics.median(r[key] for r in got), "unit": "ms p50" if workload == "d" else got[0]["unit"],
               "samples": [r[key] for r in got]}
        if workload == "d":
            row["p99_median"] = statistics.median(r["p99_ms"] for r in got)
        rows.append(row)
    ratios = []
    for row in rows:
        if row["system"] != "joblane":
            continue
        for peer in rows:
            if peer["system"] == "joblane" or peer["workload"] != row["workload"]:
                continue
            if peer["profile"] != row["profile"] and not (row["workload"] == "b" and peer["profile"] == "-"):
                continue  # c's profiles pair up; each of joblane's b rows faces the peers' one
            higher_is_better = row["workload"] != "d"
            ratio = row["median"] / peer["median"] if higher_is_better else peer["median"] / row["median"]
            ratios.append({"workload": row["workload"], "profile": row["profile"], "peer": peer["system"],
                           "ratio": round(ratio, 2)})
    report = {
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "commit_before": costs[0], "commit_after": costs[1]},
        "command": " ".join(["python", "benchmarks/run.py", *sys.argv[1:]]),
        "reps": args.reps, "scale": args.scale, "results": rows, "ratios": ratios,
    }
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    for r in ratios:
        print(f"{r['workload']} {r['profile']:<18} joblane / {r['peer']:<13} {r['ratio']:>6.2f}x")
    for when, cost in zip(("before", "after"), costs):
        print(f"this machine {when} the runs: {describe_cost(cost) if cost else 'commit cost not measured'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
