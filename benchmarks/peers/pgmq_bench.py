"""PGMQ (the Postgres message queue behind Supabase Queues) on the peer workloads a-d of shared/peers.md.

Run with the peers' virtualenv (benchmarks/peers/setup.sh makes it):

    benchmarks/.venv-peers/bin/python benchmarks/peers/pgmq_bench.py \
        --dsn postgresql://postgres@127.0.0.1:5432/postgres --workload b

Prints one JSON line on stdout; diagnostics go to stderr.

PGMQ is installed in each scratch database from the SQL-only install file that
the ``pgmq`` Python package ships (``pgmq.install``: PGMQ 1.13 for pgmq 1.1.4),
no extension needed. Every call goes through the official async client
(``pgmq.async_queue.PGMQueue``, asyncpg) on connections held for the whole
run (``conn=``), so no call pays for a pool checkout.

- a: ``send`` one message per call (autocommit: one transaction each).
- b: ``send_batch`` of ``--batch`` messages per call: one
  ``INSERT ... SELECT unnest($1::jsonb[])`` into the queue table.
- c: pre-filled with ``send_batch``; consumers ``read`` (visibility timeout
  30 s) and delete what they read. ``defaults``: one consumer, read qty 10, a
  ``delete`` per message (the README's pattern); ``best``: 4 consumers, read
  qty 200, one ``delete`` of the batch's ids (``delete_batch``). A message is
  done when it is deleted, so "unfinished" is any row left in ``pgmq.q_bench``.
- d: one consumer in ``read_with_poll`` (qty 10, polling every
  ``--poll-interval-ms``, default 10 ms; PGMQ's own default is 100 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common  # noqa: E402
from pgmq.async_queue import PGMQueue  # noqa: E402
from pgmq.install import get_embedded_install_sql, get_embedded_sql_version, install_pgmq_sql  # noqa: E402

SYSTEM = "pgmq"
QUEUE = "bench"
VT = 30  # seconds a read message stays invisible
PROFILES = {
    "defaults": {"consumers": 1, "qty": 10, "delete": "each"},
    "best": {"consumers": 4, "qty": 200, "delete": "batch"},
}
UNFINISHED_SQL = f"SELECT count(*) FROM (SELECT 1 FROM pgmq.q_{QUEUE} LIMIT 1) AS s"


def base_settings(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "version": importlib.metadata.version("pgmq"),
        "pgmq_sql": get_embedded_sql_version(),
        "driver": "asyncpg " + importlib.metadata.version("asyncpg"),
        "jobs": args.jobs,
    }


def consumer_settings(args: argparse.Namespace) -> dict[str, Any]:
    s = dict(PROFILES[args.profile])
    if args.consumers is not None:
        s["consumers"] = args.consumers
    if args.qty is not None:
        s["qty"] = args.qty
    if s["consumers"] <= 0 or s["qty"] < 2:
        raise common.BenchError("--consumers must be positive and --qty at least 2")
    return s


async def bulk_send(queue: PGMQueue, conn, n: int, batch: int) -> None:
    for lo in range(0, n, batch):
        await queue.send_batch(QUEUE, [{"i": i} for i in range(lo, min(lo + batch, n))], conn=conn)


async def workload_a(args, queue: PGMQueue, conn) -> dict[str, Any]:
    t0 = time.perf_counter()
    for i in range(args.jobs):
        await queue.send(QUEUE, {"i": i}, conn=conn)
    dt = time.perf_counter() - t0
    return {"value": common.rate(args.jobs, dt), "unit": "jobs/s", "elapsed_s": round(dt, 3)}


async def workload_b(args, queue: PGMQueue, conn) -> dict[str, Any]:
    await queue.send_batch(QUEUE, [{"warm-up": True}], conn=conn)  # untimed, as joblane bench and pgqueuer_bench
    t0 = time.perf_counter()
    await bulk_send(queue, conn, args.jobs, args.batch)
    dt = time.perf_counter() - t0
    return {"value": common.rate(args.jobs, dt), "unit": "jobs/s", "elapsed_s": round(dt, 3)}


async def consume(queue: PGMQueue, conn, settings: dict[str, Any], stop: asyncio.Event, seen: list[int]) -> None:
    """Read, handle (a no-op), delete; until ``stop``."""
    while not stop.is_set():
        messages = await queue.read(QUEUE, vt=VT, qty=settings["qty"], conn=conn)
        if not messages:
            await asyncio.sleep(0.01)
            continue
        seen[0] += len(messages)
        if settings["delete"] == "batch":
            await queue.delete_batch(QUEUE, [m.msg_id for m in messages], conn=conn)
        else:
            for m in messages:
                await queue.delete(QUEUE, m.msg_id, conn=conn)


async def workload_c(args, dsn: str, queue: PGMQueue, conn, settings: dict[str, Any]) -> dict[str, Any]:
    await bulk_send(queue, conn, args.jobs, args.batch)
    await conn.execute(f"ANALYZE pgmq.q_{QUEUE}")
    seen = [0]
    stop = asyncio.Event()
    async with contextlib.AsyncExitStack() as stack:
        conns = [await stack.enter_async_context(queue.pool.acquire()) for _ in range(settings["consumers"])]
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(consume(queue, c, settings, stop, seen)) for c in conns]

        def check_alive() -> None:
            for t in tasks:
                if t.done() and t.exception() is not None:
                    raise common.BenchError(f"PGMQ consumer stopped early: {t.exception()!r}")

        try:
            t_end = await common.watch_until_drained(dsn, UNFINISHED_SQL, args.poll_ms / 1000.0, check_alive)
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
    dt = t_end - t0
    if seen[0] < args.jobs:
        raise common.BenchError(f"queue looked empty but only {seen[0]}/{args.jobs} were read")
    return {"value": common.rate(args.jobs, dt), "unit": "jobs/s", "elapsed_s": round(dt, 3), "handled": seen[0]}


async def workload_d(args, queue: PGMQueue, conn) -> dict[str, Any]:
    latencies: list[float] = []
    stop = asyncio.Event()
    warm = asyncio.Event()

    async def consumer(c) -> None:
        while not stop.is_set():
            messages = await queue.read_with_poll(QUEUE, vt=VT, qty=10, max_poll_seconds=1,
                                                  poll_interval_ms=args.poll_interval_ms, conn=c)
            now = time.time()
            for m in messages:
                if m.message.get("warmup"):
                    warm.set()
                else:
                    latencies.append(now - m.message["t"])
            if messages:
                await queue.delete_batch(QUEUE, [m.msg_id for m in messages], conn=c)

    async with queue.pool.acquire() as c:
        task = asyncio.create_task(consumer(c))
        try:
            await queue.send(QUEUE, {"warmup": True}, conn=conn)
            await asyncio.wait_for(warm.wait(), timeout=60)
            await asyncio.sleep(1.0)
            gap = args.interval_ms / 1000.0
            start = time.perf_counter()
            for i in range(args.jobs):
                delay = start + i * gap - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                await queue.send(QUEUE, {"i": i, "t": time.time()}, conn=conn)
            deadline = time.monotonic() + 30
            while len(latencies) < args.jobs and time.monotonic() < deadline:
                if task.done():
                    raise common.BenchError(f"PGMQ consumer stopped early: {task.exception()!r}")
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            await asyncio.gather(task, return_exceptions=True)
    if len(latencies) < args.jobs:
        raise common.BenchError(f"only {len(latencies)}/{args.jobs} messages were read")
    summary = common.latency_summary(latencies)
    return {"value": summary["p50_ms"], "unit": "ms (p50 send->read)", **summary}


def install(dsn: str) -> None:
    install_pgmq_sql(get_embedded_install_sql(), dsn=dsn)


async def run(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    settings = base_settings(args)
    await asyncio.to_thread(install, dsn)
    consumers = consumer_settings(args)["consumers"] if args.workload == "c" else 1
    queue = PGMQueue(conn_string=dsn, init_extension=False, pool_size=consumers + 2)
    await queue.init()
    try:
        async with queue.pool.acquire() as conn:
            await queue.create_queue(QUEUE, conn=conn)
            if args.workload == "a":
                result = await workload_a(args, queue, conn)
            elif args.workload == "b":
                settings["batch"] = args.batch
                result = await workload_b(args, queue, conn)
            elif args.workload == "c":
                cs = consumer_settings(args)
                settings.update(profile=args.profile, poll_ms=args.poll_ms, **cs)
                result = await workload_c(args, dsn, queue, conn, cs)
            else:
                settings["poll_interval_ms"] = args.poll_interval_ms
                result = await workload_d(args, queue, conn)
    finally:
        await queue.close()
    return {"settings": settings, **result}


def parser() -> argparse.ArgumentParser:
    p = common.build_parser(
        SYSTEM,
        "consumer settings for c: 'defaults' = 1 consumer, read qty 10, delete each; "
        "'best' = 4 consumers, read qty 200, delete_batch",
    )
    p.add_argument("--consumers", type=int, default=None, help="override the profile's number of consumers (c)")
    p.add_argument("--qty", type=int, default=None, help="override the profile's read qty (c)")
    p.add_argument("--poll-interval-ms", type=int, default=10, help="read_with_poll's interval (d)")
    return p


if __name__ == "__main__":
    common.main(SYSTEM, parser(), run, db_prefix="bench_pgmq")
