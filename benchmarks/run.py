#!/usr/bin/env python3
"""Run workloads a-d for joblane, PgQueuer and Procrastinate in one session; medians and ratios.

    python benchmarks/run.py --reps 3                      # everything, peers.md sizes
    python benchmarks/run.py --reps 1 --scale 0.2 -w c     # a quick look at c

Each measurement is a fresh process on a fresh database or schema; the
systems take turns within each repetition so that drift on a noisy machine
hits them alike. Results go to benchmarks/results.json; report.py turns them
into docs/benchmarks.md and docs/benchmarks.png.
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


def measurements(workloads: list[str], systems: list[str]) -> list[tuple[str, str, str | None]]:
    """(system, workload, profile) in the order one repetition runs them."""
    out = []
    for w in workloads:
        profiles = ["defaults", "best"] if w == "c" else [None]
        for p in profiles:
            for s in systems:
                out.append((s, w, p))
    return out


def command(system: str, workload: str, profile: str | None, dsn: str, jobs: int) -> list[str]:
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


def run_one(cmd: list[str], timeout: float) -> dict | None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        print(f"  timed out: {' '.join(cmd[:4])}...", file=sys.stderr)
        return None
    if done.returncode != 0:
        print(f"  failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", default=os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("-w", "--workload", action="append", choices=sorted(SIZES))
    parser.add_argument("--systems", default="joblane,pgqueuer,procrastinate")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--out", default=str(HERE / "results.json"))
    args = parser.parse_args()

    systems = args.systems.split(",")
    if any(s != "joblane" for s in systems) and not PEERS_PY.exists():
        subprocess.run(["bash", str(HERE / "peers" / "setup.sh")], check=True)
    workloads = args.workload or sorted(SIZES)
    plan = measurements(workloads, systems)
    samples: dict[tuple[str, str, str], list[dict]] = {}
    total = len(plan) * args.reps
    n = 0
    for rep in range(args.reps):
        for system, workload, profile in plan:
            n += 1
            jobs = max(50, int(SIZES[workload] * args.scale))
            print(f"[{n}/{total}] rep {rep + 1}: {system} {workload} {profile or ''}", file=sys.stderr, flush=True)
            result = run_one(command(system, workload, profile, args.dsn, jobs), args.timeout)
            if result is not None:
                samples.setdefault((system, workload, profile or "-"), []).append(result)

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
            if peer["system"] == "joblane" or (peer["workload"], peer["profile"]) != (row["workload"], row["profile"]):
                continue
            higher_is_better = row["workload"] != "d"
            ratio = row["median"] / peer["median"] if higher_is_better else peer["median"] / row["median"]
            ratios.append({"workload": row["workload"], "profile": row["profile"], "peer": peer["system"],
                           "ratio": round(ratio, 2)})
    report = {
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "command": " ".join(["python", "benchmarks/run.py", *sys.argv[1:]]),
        "reps": args.reps, "scale": args.scale, "results": rows, "ratios": ratios,
    }
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    for r in ratios:
        print(f"{r['workload']} {r['profile']:<8} joblane / {r['peer']:<13} {r['ratio']:>6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
