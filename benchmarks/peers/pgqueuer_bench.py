"""PgQueuer (asyncpg driver) on the peer workloads a-d of shared/peers.md.

Run with the peers' virtualenv (benchmarks/peers/setup.sh makes it):

    benchmarks/.venv-peers/bin/python benchmarks/peers/pgqueuer_bench.py \
        --dsn postgresql://postgres@127.0.0.1:5432/postgres --workload c --profile best

Prints one JSON line on stdout; diagnostics go to stderr.

PgQueuer deletes a job from its queue table (``pgqueuer``) once its outcome
is logged, so "unfinished" is any row there still ``queued`` or ``picked``.
The worker is PgQueuer's own ``QueueManager`` over one asyncpg connection,
as ``pgq run`` builds it; only ``batch_size`` and ``max_concurrent_tasks``
change between the profiles.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common  # noqa: E402
from pgqueuer import Job, QueueManager  # noqa: E402
from pgqueuer.adapters.drivers.asyncpg import AsyncpgDriver  # noqa: E402
from pgqueuer.adapters.persistence.queries import Queries  # noqa: E402

SYSTEM = "pgqueuer"
ENTRYPOINT = "noop"
# "defaults": QueueManager.run's default batch_size (10) with the smallest cap it
# accepts (2 x batch), i.e. about 10-20 in flight; "best": the tuned setting
# recorded in shared/peers.md.
PROFILES = {
    "defaults": {"batch_size": 10, "max_concurrent_tasks": 20},
    "best": {"batch_size": 200, "max_concurrent_tasks": 400},
}
UNFINISHED_SQL = (
    "SELECT count(*) FROM (SELECT 1 FROM pgqueuer "
    "WHERE status IN ('queued', 'picked') LIMIT 1) AS s"
)


def payload(i: int) -> bytes:
    return json.dumps({"i": i}).encode()


def worker_settings(args: argparse.Namespace) -> dict[str, Any]:
    s = dict(PROFILES[args.profile])
    if args.batch_size is not None:
        s["batch_size"] = args.batch_size
    if args.max_tasks is not None:
        s["max_concurrent_tasks"] = args.max_tasks
    if s["batch_size"] <= 0:
        raise common.BenchError("--batch-size must be positive")
    if s["max_concurrent_tasks"] < 2 * s["batch_size"]:
        raise common.BenchError("PgQueuer needs --max-tasks >= 2 x --batch-size")
    return s


def base_settings(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "version": importlib.metadata.version("pgqueuer"),
        "driver": "asyncpg " + importlib.metadata.version("asyncpg"),
        "jobs": args.jobs,
    }


async def bulk_enqueue(queries: Queries, n: int, batch: int, start: int = 0) -> None:
    for lo in range(start, start + n, batch):
        hi = min(lo + batch, start + n)
        k = hi - lo
        await queries.enqueue([ENTRYPOINT] * k, [payload(i) for i in range(lo, hi)], [0] * k)


class Worker:
    """An in-process PgQueuer QueueManager on its own connection."""

    def __init__(self, dsn: str, settings: dict[str, Any], on_job) -> None:
        self.dsn = dsn
        self.settings = settings
        self.on_job = on_job
        self.task: asyncio.Task[None] | None = None
        self.conn = None
        self.qm: QueueManager | None = None

    async def start(self) -> None:
        self.conn = await common.connect(self.dsn)
        self.qm = QueueManager(Queries(AsyncpgDriver(self.conn)))
        on_job = self.on_job

        @self.qm.entrypoint(ENTRYPOINT)
        async def noop(job: Job) -> None:
            on_job(job)

        self.task = asyncio.create_task(self.qm.run(**self.settings))

    def check_alive(self) -> None:
        if self.task is not None and self.task.done():
            exc = self.task.exception()
            raise common.BenchError(f"PgQueuer worker stopped early: {exc!r}")

    async def stop(self) -> None:
        if self.qm is not None:
            self.qm.shutdown.set()
        if self.task is not None:
            try:
                await asyncio.wait_for(self.task, timeout=30)
            except asyncio.TimeoutError:
                pass  # wait_for has cancelled it
            except Exception as e:  # a failure after the measurement is only reported
                print(f"pgqueuer worker ended with {e!r}", file=sys.stderr)
        if self.conn is not None:
            await self.conn.close()


async def workload_a(args, queries: Queries) -> dict[str, Any]:
    t0 = time.perf_counter()
    for i in range(args.jobs):
        await queries.enqueue(ENTRYPOINT, payload(i))  # autocommit: one transaction each
    dt = time.perf_counter() - t0
    return {"value": common.rate(args.jobs, dt), "unit": "jobs/s", "elapsed_s": round(dt, 3)}


async def workload_b(args, queries: Queries) -> dict[str, Any]:
    await queries.enqueue([ENTRYPOINT], [payload(-1)], [0])  # untimed, as joblane bench and pgmq_bench
    t0 = time.perf_counter()
    await bulk_enqueue(queries, args.jobs, args.batch)
    dt = time.perf_counter() - t0
    return {"value": common.rate(args.jobs, dt), "unit": "jobs/s", "elapsed_s": round(dt, 3)}


async def workload_c(args, dsn: str, queries: Queries, settings) -> dict[str, Any]:
    await bulk_enqueue(queries, args.jobs, args.batch)
    handled = 0

    def on_job(job: Job) -> None:
        nonlocal handled
        handled += 1

    worker = Worker(dsn, settings, on_job)
    t0 = time.perf_counter()
    try:
        await worker.start()
        t_end = await common.watch_until_drained(
            dsn, UNFINISHED_SQL, args.poll_ms / 1000.0, worker.check_alive
        )
    finally:
        await worker.stop()
    dt = t_end - t0
    if handled < args.jobs:
        raise common.BenchError(f"queue looked empty but only {handled}/{args.jobs} ran")
    return {
        "value": common.rate(args.jobs, dt),
        "unit": "jobs/s",
        "elapsed_s": round(dt, 3),
        "handled": handled,
    }


async def workload_d(args, dsn: str, queries: Queries, settings) -> dict[str, Any]:
    latencies: list[float] = []
    warm = asyncio.Event()
    all_seen = asyncio.Event()

    def on_job(job: Job) -> None:
        started = time.time()
        body = json.loads(job.payload or b"{}")
        if body.get("warmup"):
            warm.set()
            return
        latencies.append(started - body["t"])
        if len(latencies) >= args.jobs:
            all_seen.set()

    worker = Worker(dsn, settings, on_job)
    try:
        await worker.start()
        # One untimed job proves the worker is listening, then it goes idle.
        await queries.enqueue(ENTRYPOINT, json.dumps({"warmup": True}).encode())
        await asyncio.wait_for(warm.wait(), timeout=60)
        await asyncio.sleep(1.0)
        gap = args.interval_ms / 1000.0
        start = time.perf_counter()
        for i in range(args.jobs):
            delay = start + i * gap - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await queries.enqueue(ENTRYPOINT, json.dumps({"i": i, "t": time.time()}).encode())
        while not all_seen.is_set():
            worker.check_alive()
            try:
                await asyncio.wait_for(all_seen.wait(), timeout=0.5)
            except asyncio.TimeoutError:
                pass
    finally:
        await worker.stop()
    summary = common.latency_summary(latencies)
    return {"value": summary["p50_ms"], "unit": "ms (p50 enqueue->handler start)", **summary}


async def run(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    settings = base_settings(args)
    conn = await common.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()
        if args.workload == "a":
            result = await workload_a(args, queries)
        elif args.workload == "b":
            settings["batch"] = args.batch
            result = await workload_b(args, queries)
        else:
            ws = worker_settings(args)
            settings.update(profile=args.profile, worker="QueueManager", **ws)
            if args.workload == "c":
                settings["poll_ms"] = args.poll_ms
                result = await workload_c(args, dsn, queries, ws)
            else:
                settings["interval_ms"] = args.interval_ms
                result = await workload_d(args, dsn, queries, ws)
    finally:
        await conn.close()
    return {"settings": settings, **result}


def parser() -> argparse.ArgumentParser:
    p = common.build_parser(
        SYSTEM,
        "worker settings for c/d: 'defaults' = batch_size 10, max_concurrent_tasks 20; "
        "'best' = batch_size 200, max_concurrent_tasks 400",
    )
    p.add_argument("--batch-size", type=int, default=None, help="override the profile's batch_size")
    p.add_argument(
        "--max-tasks", type=int, default=None, help="override the profile's max_concurrent_tasks"
    )
    return p


if __name__ == "__main__":
    common.main(SYSTEM, parser(), run, db_prefix="bench_pgqueuer")
