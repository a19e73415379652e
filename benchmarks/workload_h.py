#!/usr/bin/env python3
"""Workload h, closer to production: writers and workers at the same time, joblane and PgQueuer in turn.

    python benchmarks/workload_h.py                          # both systems, 120 s each
    python benchmarks/workload_h.py --seconds 60 --systems joblane
    python benchmarks/workload_h.py --seconds 30 --reps 2   # taking turns, the median run of each

For each system, on a fresh schema (joblane) or database (PgQueuer):
- 2 worker processes, each running up to ``--concurrency`` (50) tasks at once;
  a task sleeps 5-50 ms (uniform) and fails 2 % of the time (raises: a failure
  is final, no retry, for both systems: joblane ``max_attempts=1``, PgQueuer
  does not retry by default);
- 8 writer threads, each with its own asyncpg connection, enqueueing one job
  per transaction as fast as they can for ``--seconds``.
Each job carries its enqueue time (taken just before the enqueue call); a
worker notes when its task ends. Reported: jobs enqueued per second, jobs
finished per second (sustained: those that ended within the run, after a
warm-up of a tenth of it, at most 5 s), and the p50 / p99 enqueue-to-finish
latency of those jobs; what was left unfinished when the writers stopped.

joblane runs in the project's virtualenv (.venv), PgQueuer in the peers' one
(benchmarks/.venv-peers, made by benchmarks/peers/setup.sh). Results go to
benchmarks/h.json (one entry per system, the latest run of each);
benchmarks/report.py puts them in docs/benchmarks.md. The cost of a commit is
measured before each system's run and kept beside its result.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import run as bench_run  # noqa: E402  benchmarks/run.py: the commit cost, measured one way for every benchmark

PYTHONS = {"joblane": ROOT / ".venv" / "bin" / "python", "pgqueuer": HERE / ".venv-peers" / "bin" / "python"}
KIND = "h"
FAIL_RATE = 0.02


# -- the task, alike for both systems -------------------------------------------

async def task_body(payload: dict, records: list) -> None:
    """Sleep 5-50 ms, note the end; raise 2 % of the time."""
    await asyncio.sleep(random.uniform(0.005, 0.050))
    ok = random.random() >= FAIL_RATE
    now = time.time()
    records.append((now, now - payload["t"], ok, payload["j"]))
    if not ok:
        raise RuntimeError("workload h: one of the 2 % that fail")


def dump(records: list, path: str) -> None:
    Path(path).write_text(json.dumps(records))


# -- worker processes -----------------------------------------------------------

def joblane_worker(dsn: str, schema: str, concurrency: int, log: str) -> None:
    import logging

    import joblane
    from joblane.worker import Worker

    logging.disable(logging.WARNING)  # 2 % of the tasks fail on purpose: no traceback per failure
    app = joblane.App(dsn, schema=schema)
    records: list = []

    @app.task(KIND, max_attempts=1)
    async def h(job) -> None:
        await task_body(job.payload, records)

    async def run() -> None:
        worker = Worker(app, concurrency=concurrency)
        runner = asyncio.create_task(worker.run())  # SIGTERM: finish the jobs in flight, then return
        await worker.started.wait()
        Path(log + ".ready").touch()
        await runner

    asyncio.run(run())
    dump(records, log)


def pgqueuer_worker(dsn: str, concurrency: int, log: str) -> None:
    import logging

    import asyncpg
    from pgqueuer import QueueManager
    from pgqueuer.adapters.drivers.asyncpg import AsyncpgDriver
    from pgqueuer.adapters.persistence.queries import Queries

    logging.disable(logging.ERROR)
    records: list = []

    async def run() -> None:
        conn = await asyncpg.connect(dsn)
        qm = QueueManager(Queries(AsyncpgDriver(conn)))

        @qm.entrypoint(KIND)
        async def h(job) -> None:
            await task_body(json.loads(job.payload), records)

        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, qm.shutdown.set)
        runner = asyncio.create_task(qm.run(batch_size=10, max_concurrent_tasks=concurrency))
        await asyncio.sleep(0.5)
        Path(log + ".ready").touch()
        await runner
        await conn.close()

    asyncio.run(run())
    dump(records, log)


# -- writers --------------------------------------------------------------------

def writers(system: str, dsn: str, schema: str | None, count: int, seconds: float) -> tuple[int, float, float]:
    """``count`` threads, each its own loop and asyncpg connection, one job per transaction; (jobs, start, end)."""
    import asyncpg

    stop = threading.Event()
    barrier = threading.Barrier(count + 1)
    done = [0] * count
    errors: list[BaseException] = []

    async def write(index: int) -> None:
        conn = await asyncpg.connect(dsn)
        try:
            if system == "joblane":
                import joblane

                app = joblane.App(dsn, schema=schema)

                async def enqueue(job: dict) -> None:  # a failure is final, as PgQueuer's is
                    await app.enqueue_async(conn, KIND, job, max_attempts=1)
            else:
                from pgqueuer.adapters.drivers.asyncpg import AsyncpgDriver
                from pgqueuer.adapters.persistence.queries import Queries

                queries = Queries(AsyncpgDriver(conn))

                async def enqueue(job: dict) -> None:
                    await queries.enqueue(KIND, json.dumps(job).encode())
            barrier.wait()
            while not stop.is_set():
                await enqueue({"t": time.time(), "j": f"{index}:{done[index]}"})
                done[index] += 1
        finally:
            await conn.close()

    def thread(index: int) -> None:
        try:
            asyncio.run(write(index))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            if not barrier.broken:
                barrier.abort()

    threads = [threading.Thread(target=thread, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.time()
    time.sleep(seconds)
    stop.set()
    ended = time.time()
    for t in threads:
        t.join(30)
    if errors:
        raise RuntimeError(f"a writer failed: {errors[0]!r}")
    return sum(done), started, ended


# -- one system -------------------------------------------------------------------

def measure(system: str, dsn: str, args: argparse.Namespace) -> dict:
    """Set up, run the workers and writers, summarise (runs in the system's own virtualenv)."""
    if system == "joblane":
        from joblane.testing import isolated_schema, new_schema_name

        with isolated_schema(dsn, new_schema_name("bench_h")) as schema:
            return run_system(system, dsn, schema, args)
    sys.path.insert(0, str(HERE / "peers"))
    import _common as common
    from pgqueuer.adapters.drivers.asyncpg import AsyncpgDriver
    from pgqueuer.adapters.persistence.queries import Queries

    async def setup_and_run() -> dict:
        async with common.scratch_database(dsn, "bench_pgqueuer_h") as db_dsn:
            conn = await common.connect(db_dsn)
            try:
                await Queries(AsyncpgDriver(conn)).install()
            finally:
                await conn.close()
            return await asyncio.to_thread(run_system, system, db_dsn, None, args)

    return asyncio.run(setup_and_run())


def run_system(system: str, dsn: str, schema: str | None, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="joblane-h-") as tmp:
        logs = [os.path.join(tmp, f"worker{i}.json") for i in range(args.workers)]
        procs = []
        for log in logs:
            cmd = [sys.executable, __file__, "--worker", system, "--dsn", dsn, "--concurrency", str(args.concurrency),
                   "--log", log] + (["--schema", schema] if schema else [])
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log + ".err", "w")))
        try:
            deadline = time.monotonic() + 60
            while not all(os.path.exists(log + ".ready") for log in logs):
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"{system} workers did not start: "
                                       f"{Path(logs[0] + '.err').read_text()[-500:]}")
                time.sleep(0.05)
            enqueued, started, ended = writers(system, dsn, schema, args.writers, args.seconds)
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    p.kill()
        records = [r for log in logs if os.path.exists(log) for r in json.loads(Path(log).read_text())]
    warm = min(5.0, args.seconds / 10)
    window = [r for r in records if started + warm <= r[0] <= ended]
    latencies = sorted(r[1] * 1000 for r in window)
    finished_in_run = len({r[3] for r in records if r[0] <= ended})
    runs: dict[str, int] = {}
    for r in records:
        runs[r[3]] = runs.get(r[3], 0) + 1

    def pct(q: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(len(latencies) * q))], 2) if latencies else float("nan")

    return {
        "system": system, "workload": "h", "seconds": args.seconds, "writers": args.writers,
        "workers": args.workers, "concurrency": args.concurrency,
        "enqueued_per_s": round(enqueued / (ended - started), 1),
        "finished_per_s": round(len(window) / (ended - started - warm), 1),
        "p50_ms": pct(0.50), "p99_ms": pct(0.99),
        "failed_share": round(sum(1 for r in window if not r[2]) / max(1, len(window)), 4),
        "unfinished_at_end": enqueued - finished_in_run,
        "ran_more_than_once": sum(1 for n in runs.values() if n > 1),
    }


# -- the orchestrator --------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", default=os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--seconds", type=float, default=120.0, help="how long the writers write (default 120)")
    parser.add_argument("--systems", default="joblane,pgqueuer")
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=50, help="tasks each worker runs at once")
    parser.add_argument("--reps", type=int, default=1, help="runs of each system, taking turns (the median is kept)")
    parser.add_argument("--out", default=str(HERE / "h.json"))
    parser.add_argument("--run", help=argparse.SUPPRESS)  # one system, in its own virtualenv
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--schema", help=argparse.SUPPRESS)
    parser.add_argument("--log", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "joblane":
        joblane_worker(args.dsn, args.schema, args.concurrency, args.log)
        return 0
    if args.worker == "pgqueuer":
        pgqueuer_worker(args.dsn, args.concurrency, args.log)
        return 0
    if args.run:
        print(json.dumps(measure(args.run, args.dsn, args)), flush=True)
        return 0

    out = Path(args.out)
    report = json.loads(out.read_text()) if out.exists() else {"results": {}}
    systems = args.systems.split(",")
    for system in systems:
        if system not in PYTHONS:
            parser.error(f"unknown system {system!r}")
        if not PYTHONS[system].exists():
            subprocess.run(["bash", str(HERE / "peers" / "setup.sh")], check=True)
    runs: dict[str, list[dict]] = {}
    for rep, system in [(rep, system) for rep in range(args.reps) for system in systems]:  # taking turns
        cost = bench_run.commit_cost(args.dsn)
        cmd = [str(PYTHONS[system]), __file__, "--run", system, "--dsn", args.dsn, "--seconds", str(args.seconds),
               "--writers", str(args.writers), "--workers", str(args.workers), "--concurrency", str(args.concurrency)]
        print(f"rep {rep + 1}: {system}, {args.seconds:g} s ...", file=sys.stderr, flush=True)
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=args.seconds + 300)
        if done.returncode != 0:
            print(f"{system} failed: {done.stderr.strip()[-2000:]}", file=sys.stderr)
            return 1
        result = json.loads(done.stdout.strip().splitlines()[-1])
        result.update(when=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), commit=cost,
                      command=" ".join(["python", "benchmarks/workload_h.py", *sys.argv[1:]]),
                      machine={"cpus": os.cpu_count(), "platform": platform.platform(),
                               "python": platform.python_version()})
        runs.setdefault(system, []).append(result)
        print(json.dumps(result))
    for system, got in runs.items():
        # the median run of each system by its finished rate, with every run's numbers beside it
        median = sorted(got, key=lambda r: r["finished_per_s"])[(len(got) - 1) // 2]
        median["reps"] = [{k: r[k] for k in ("finished_per_s", "p50_ms", "p99_ms", "enqueued_per_s", "commit")}
                          for r in got]
        report["results"][system] = median
    out.write_text(json.dumps(report, indent=2) + "\n")
    for r in report["results"].values():
        print(f"{r['system']:<9} enqueued {r['enqueued_per_s']:>8,.0f}/s  finished {r['finished_per_s']:>8,.0f}/s  "
              f"enqueue-to-finish p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms  "
              f"(unfinished at the end: {r['unfinished_at_end']:,})")
    if len(report["results"]) == 2:
        j, p = report["results"]["joblane"], report["results"]["pgqueuer"]
        print(f"joblane / PgQueuer: finished {j['finished_per_s'] / p['finished_per_s']:.2f}x, "
              f"p99 {p['p99_ms'] / j['p99_ms']:.2f}x (the peer's over joblane's)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
