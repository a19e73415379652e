"""Procrastinate (psycopg 3) on the peer workloads a-d of shared/peers.md.

Run with the peers' virtualenv (benchmarks/peers/setup.sh makes it):

    benchmarks/.venv-peers/bin/python benchmarks/peers/procrastinate_bench.py \
        --dsn postgresql://postgres@127.0.0.1:5432/postgres --workload c --profile best

Prints one JSON line on stdout; diagnostics go to stderr.

Procrastinate keeps finished jobs in ``procrastinate_jobs`` (``delete_jobs``
defaults to ``never``), so "unfinished" is a row whose status is ``todo`` or
``doing``. Producer and worker are two ``App`` objects with their own
``PsycopgConnector`` pools, so enqueueing never borrows the worker's
connections. The worker is ``App.run_worker_async`` in this process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common  # noqa: E402
import procrastinate  # noqa: E402

SYSTEM = "procrastinate"
TASK = "noop"
# psycopg_pool's own default when a PsycopgConnector gets no pool arguments.
LIBRARY_POOL = 4
# "defaults": library defaults except concurrency (1 by default, 10 here as for
# every peer). "best": more jobs in flight and a pool that can serve them all
# (the worker keeps one pooled connection for LISTEN).
PROFILES = {
    "defaults": {"concurrency": 10, "pool": None},
    "best": {"concurrency": 20, "pool": "concurrency+2"},
}
UNFINISHED_SQL = (
    "SELECT count(*) FROM (SELECT 1 FROM procrastinate_jobs "
    "WHERE status IN ('todo', 'doing') LIMIT 1) AS s"
)


def make_app(dsn: str, pool_size: int | None, on_job: Callable[[dict], None] | None):
    """An App with the no-op task; pool_size None leaves psycopg_pool's default."""
    pool_args = {} if pool_size is None else {"min_size": pool_size, "max_size": pool_size}
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn, **pool_args))

    @app.task(name=TASK)
    async def noop(**kwargs: Any) -> None:
        if on_job is not None:
            on_job(kwargs)

    return app, noop


def worker_settings(args: argparse.Namespace) -> dict[str, Any]:
    for opt in ("concurrency", "pool"):
        if getattr(args, opt) is not None and getattr(args, opt) <= 0:
            raise common.BenchError(f"--{opt} must be positive")
    prof = PROFILES[args.profile]
    concurrency = args.concurrency or prof["concurrency"]
    if args.pool is not None:
        pool = args.pool
    elif prof["pool"] is None:
        pool = None
    else:
        pool = concurrency + 2
    return {"concurrency": concurrency, "pool_size": pool}


def base_settings(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "version": importlib.metadata.version("procrastinate"),
        "driver": "psycopg " + importlib.metadata.version("psycopg"),
        "jobs": args.jobs,
    }


async def bulk_defer(task, n: int, batch: int) -> None:
    for lo in range(0, n, batch):
        hi = min(lo + batch, n)
        await task.batch_defer_async(*({"i": i} for i in range(lo, hi)))


class Worker:
    """``App.run_worker_async`` in a task, on an App of its own."""

    def __init__(self, dsn: str, settings: dict[str, Any], on_job) -> None:
        self.app, _ = make_app(dsn, settings["pool_size"], on_job)
        self.settings = settings
        self.task: asyncio.Task[None] | None = None
        self.opened = False

    async def start(self) -> None:
        await self.app.open_async()
        self.opened = True
        self.task = asyncio.create_task(
            self.app.run_worker_async(
                concurrency=self.settings["concurrency"],
                wait=True,
                install_signal_handlers=False,
            )
        )

    def check_alive(self) -> None:
        if self.task is not None and self.task.done():
            exc = None if self.task.cancelled() else self.task.exception()
            raise common.BenchError(f"Procrastinate worker stopped early: {exc!r}")

    async def stop(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()  # Procrastinate turns this into a graceful stop
            with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
                await asyncio.wait_for(self.task, timeout=30)
        if self.opened:
            await self.app.close_async()


async def workload_a(args, task) -> dict[str, Any]:
    t0 = time.perf_counter()
    for i in range(args.jobs):
        await task.defer_async(i=i)  # one statement in autocommit: one transaction each
    dt = time.perf_counter() - t0
    return {"value": common.rate(args.jobs, dt), "unit": "jobs/s", "elapsed_s": round(dt, 3)}


async def workload_b(args, task) -> dict[str, Any]:
    t0 = time.perf_counter()
    await bulk_defer(task, args.jobs, args.batch)
    dt = time.perf_counter() - t0
    return {"value": common.rate(args.jobs, dt), "unit": "jobs/s", "elapsed_s": round(dt, 3)}


async def workload_c(args, dsn: str, task, ws) -> dict[str, Any]:
    await bulk_defer(task, args.jobs, args.batch)
    handled = 0

    def on_job(kwargs: dict) -> None:
        nonlocal handled
        handled += 1

    worker = Worker(dsn, ws, on_job)
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


async def workload_d(args, dsn: str, task, ws) -> dict[str, Any]:
    latencies: list[float] = []
    warm = asyncio.Event()
    all_seen = asyncio.Event()

    def on_job(kwargs: dict) -> None:
        started = time.time()
        if kwargs.get("warmup"):
            warm.set()
            return
        latencies.append(started - kwargs["t"])
        if len(latencies) >= args.jobs:
            all_seen.set()

    worker = Worker(dsn, ws, on_job)
    try:
        await worker.start()
        # One untimed job proves the worker is listening, then it goes idle.
        await task.defer_async(warmup=True)
        await asyncio.wait_for(warm.wait(), timeout=60)
        await asyncio.sleep(1.0)
        gap = args.interval_ms / 1000.0
        start = time.perf_counter()
        for i in range(args.jobs):
            delay = start + i * gap - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await task.defer_async(i=i, t=time.time())
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
    # The producer is one client: a pool of one connection.
    producer, task = make_app(dsn, 1, None)
    try:
        await producer.open_async()
    except Exception as e:
        raise common.BenchError(f"Procrastinate cannot open its pool: {e}") from e
    try:
        await producer.schema_manager.apply_schema_async()
        if args.workload == "a":
            result = await workload_a(args, task)
        elif args.workload == "b":
            settings["batch"] = args.batch
            result = await workload_b(args, task)
        else:
            ws = worker_settings(args)
            settings.update(
                profile=args.profile,
                worker="App.run_worker_async",
                concurrency=ws["concurrency"],
                pool_size=ws["pool_size"] or f"library default ({LIBRARY_POOL})",
            )
            if args.workload == "c":
                settings["poll_ms"] = args.poll_ms
                result = await workload_c(args, dsn, task, ws)
            else:
                settings["interval_ms"] = args.interval_ms
                result = await workload_d(args, dsn, task, ws)
    finally:
        await producer.close_async()
    return {"settings": settings, **result}


def parser() -> argparse.ArgumentParser:
    p = common.build_parser(
        SYSTEM,
        "worker settings for c/d: 'defaults' = concurrency 10, library pool; "
        "'best' = concurrency 20, pool of concurrency+2",
    )
    p.add_argument("--concurrency", type=int, default=None, help="override the worker concurrency")
    p.add_argument("--pool", type=int, default=None, help="override the worker's pool size")
    return p


if __name__ == "__main__":
    logging.getLogger("procrastinate").setLevel(logging.WARNING)
    # It warns that the App lives in __main__; harmless here, the worker runs in-process.
    logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)
    common.main(SYSTEM, parser(), run, db_prefix="bench_procrastinate")
