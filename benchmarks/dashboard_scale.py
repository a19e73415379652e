#!/usr/bin/env python3
"""Time the dashboard's pages over a big history: 1,000,000 jobs and 10,000,000 attempts (a week of work).

    python benchmarks/dashboard_scale.py                       # DATABASE_URL, the sizes above
    python benchmarks/dashboard_scale.py --jobs 200000 --tries 5

Fills a fresh schema (dropped at the end), lets the history service roll the
week up as a worker would, then requests each page through the ASGI app
in-process and prints the median of --reps requests per page, in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import warnings

import asyncpg
import psycopg

import joblane
from joblane.maintenance import History
from joblane.testing import isolated_schema

warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
from starlette.testclient import TestClient  # noqa: E402

from joblane.web import create_app  # noqa: E402

PAGES = ("/", "/live/overview", "/queues", "/workers", "/jobs", "/jobs?state=failed", "/jobs?queue=q3&kind=k3",
         "/jobs?state=failed&error=timeout", "/jobs?payload=tenant%3Dt7", "/history?window=1h",
         "/history?window=24h", "/history?window=7d", "/outbox", "/metrics")


def fill(dsn: str, schema: str, jobs: int, tries: int) -> None:
    s = psycopg.sql.Identifier(schema).as_string(None)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {s}.jobs (queue, kind, state, attempts, payload, last_error, created_at, finished_at)"
            " SELECT 'q' || (i %% 8), 'k' || (i %% 40), CASE WHEN i %% 100 = 0 THEN 'failed' ELSE 'done' END, %s,"
            "        jsonb_build_object('tenant', 't' || (i %% 500), 'n', i),"
            "        CASE WHEN i %% 100 = 0 THEN 'TimeoutError: model API' END,"
            "        now() - (i %% 604800) * interval '1 second' - interval '3 seconds',"
            "        now() - (i %% 604800) * interval '1 second'"
            "   FROM generate_series(1, %s) AS i", (tries, jobs))
        conn.execute(
            f"INSERT INTO {s}.attempts (job_id, attempt, outcome, started_at, finished_at)"
            " SELECT j.id, t, CASE WHEN t < %s THEN 'retry' WHEN j.state = 'failed' THEN 'failed' ELSE 'done' END,"
            "        j.finished_at - interval '2 seconds', j.finished_at"
            f"   FROM {s}.jobs AS j CROSS JOIN generate_series(1, %s) AS t", (tries, tries))
        conn.execute(f"INSERT INTO {s}.jobs (queue, kind, state) SELECT 'q' || (i % 8), 'k1', 'pending'"
                     " FROM generate_series(1, 2000) AS i")
        conn.execute(f"INSERT INTO {s}.jobs (queue, kind, state) SELECT 'q1', 'k2', 'held' FROM generate_series(1, 200) i")
        conn.execute(f"VACUUM ANALYZE {s}.jobs")
        conn.execute(f"VACUUM ANALYZE {s}.attempts")


async def roll_up(app: joblane.App) -> int:
    service = History(app.store, settle=0, max_slices=24)
    conn = await asyncpg.connect(app.dsn)
    try:
        while True:
            await service.run_once(conn)
            if not service.behind:
                return service.total
    finally:
        await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--tries", type=int, default=10, help="attempts rows per job")
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    dsn = os.environ["DATABASE_URL"]
    with isolated_schema(dsn) as schema:
        app = joblane.App(dsn, schema=schema)
        t = time.perf_counter()
        fill(dsn, schema, args.jobs, args.tries)
        print(f"filled {args.jobs:,} jobs, {args.jobs * args.tries:,} attempts in {time.perf_counter() - t:.0f} s")
        t = time.perf_counter()
        hours = asyncio.run(roll_up(app))
        print(f"rolled up {hours} hours in {time.perf_counter() - t:.0f} s")
        with TestClient(create_app(app, refresh_seconds=0), base_url="http://127.0.0.1") as client:
            for page in PAGES:
                client.get(page)  # warm the pool and the cache
                times = []
                for _ in range(args.reps):
                    t = time.perf_counter()
                    response = client.get(page)
                    times.append((time.perf_counter() - t) * 1000)
                    assert response.status_code == 200, (page, response.status_code)
                print(f"{page:40} median {statistics.median(times):7.1f} ms   max {max(times):7.1f} ms")


if __name__ == "__main__":
    main()
