"""A test app for workflows: every run is recorded in a `runs` table (job id, attempt, pid, clock time)."""

from __future__ import annotations

import asyncio
import os

import asyncpg

import joblane
from joblane.queries import quote_ident

app = joblane.App(lease_seconds=float(os.environ.get("TEST_LEASE", "30")))
_pool: asyncpg.Pool | None = None
_lock = asyncio.Lock()


async def record_run(job: joblane.Job, note: str | None = None) -> None:
    global _pool
    async with _lock:
        if _pool is None:
            _pool = await asyncpg.create_pool(app.dsn, min_size=1, max_size=4,
                                              server_settings={"synchronous_commit": "off"})
    await _pool.execute(f"INSERT INTO {quote_ident(app.schema)}.runs (job_id, attempt, pid) VALUES ($1, $2, $3)",
                        job.id, job.attempt, os.getpid())


@app.task("step", max_attempts=25, backoff=0.05)
async def step(job: joblane.Job) -> None:
    await record_run(job)
    if job.payload.get("sleep"):
        await asyncio.sleep(float(job.payload["sleep"]))
    if job.payload.get("fail"):
        raise joblane.PermanentError("told to fail")


@app.task("summary", max_attempts=25, backoff=0.05)
async def summary(job: joblane.Job) -> dict:
    await record_run(job)
    return job.payload["batch"]


@app.task("waiter", max_attempts=25, backoff=0.05)
async def waiter(job: joblane.Job) -> dict:
    await record_run(job)
    data = await job.wait_for(job.payload["key"], timeout=job.payload.get("timeout"),
                              on_timeout=job.payload.get("on_timeout", "retry"))
    return {"signal": data, "attempt": job.attempt}

