"""A test app whose tasks record every run in a `runs` table, for exactly-once and crash tests."""

from __future__ import annotations

import asyncio
import os
import time

import asyncpg

import joblane
from joblane.queries import quote_ident

app = joblane.App(lease_seconds=float(os.environ.get("TEST_LEASE", "30")))
_pool: asyncpg.Pool | None = None
_lock = asyncio.Lock()


async def record_run(job: joblane.Job) -> None:
    global _pool
    async with _lock:
        if _pool is None:
            # the bookkeeping insert need not wait for its own fsync: the server is not crashed here
            # TEST_DIRECT_DSN: the database itself when the worker goes through PgBouncer
            _pool = await asyncpg.create_pool(os.environ.get("TEST_DIRECT_DSN") or app.dsn, min_size=1, max_size=4,
                                              server_settings={"synchronous_commit": "off"})
    await _pool.execute(
        f"INSERT INTO {quote_ident(app.schema)}.runs (job_id, attempt, pid) VALUES ($1, $2, $3)",
        job.id, job.attempt, os.getpid(),
    )


@app.task("record")
async def record(job: joblane.Job) -> None:
    await record_run(job)


@app.task("sleepy", timeout=float(os.environ.get("TEST_TIMEOUT", "60")))
async def sleepy(job: joblane.Job) -> dict:
    await record_run(job)
    await asyncio.sleep(float(job.payload.get("seconds", 1.0)))
    return {"slept": job.payload.get("seconds", 1.0)}


@app.task("blocks_loop")
async def blocks_loop(job: joblane.Job) -> dict:
    """An async task that blocks the event loop (a blocking SDK call in an async def)."""
    await record_run(job)
    time.sleep(float(job.payload.get("seconds", 5.0)))  # blocks the worker's loop on purpose
    return {"blocked": job.payload.get("seconds", 5.0)}


@app.task("record_lean", lean=True)
async def record_lean(job: joblane.Job) -> dict:
    """Lean: a success leaves no row; ``fail_first`` fails the first try, ``fail`` every try."""
    await record_run(job)
    if job.payload.get("fail") or (job.payload.get("fail_first") and job.attempt == 1):
        raise RuntimeError(f"try {job.attempt} fails on purpose")
    return {"kept": False}
