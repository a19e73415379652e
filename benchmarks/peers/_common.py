"""Shared plumbing for the peer benchmark scripts.

Imported by ``pgqueuer_bench.py`` and ``procrastinate_bench.py`` (same
folder). It only needs asyncpg, which ``setup.sh`` installs into the peers'
virtualenv. Nothing here knows about a particular queue library: it parses
the common options, makes and drops the throw-away database, watches a table
from a separate connection, and prints the one JSON result line.

Workloads (see shared/peers.md):
  a  enqueue N jobs (default 5,000), one transaction each, one client
  b  bulk enqueue N jobs (default 50,000) through the batch API, B per call
  c  N jobs (default 20,000) pre-filled, one worker; timed from worker start
     until a separate connection sees no unfinished job
  d  idle worker; N jobs (default 500) enqueued one at a time, I ms apart;
     enqueue-to-handler-start latency p50 / p99
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

DEFAULT_JOBS = {"a": 5_000, "b": 50_000, "c": 20_000, "d": 500}
CONNECT_TIMEOUT_S = 10.0


class BenchError(Exception):
    """A failure worth one clear line on stderr (exit code 2)."""


# --------------------------------------------------------------------------
# options


def build_parser(system: str, profile_help: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"{system}_bench.py",
        description=f"Benchmark {system} on one workload; prints one JSON line.",
    )
    p.add_argument(
        "--dsn",
        default=os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
        help="PostgreSQL URL of a server where databases may be created "
        "(default: $DATABASE_URL). A fresh database is created and dropped per run.",
    )
    p.add_argument("--workload", required=True, choices=["a", "b", "c", "d"])
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="number of jobs (default: a 5000, b 50000, c 20000, d 500)",
    )
    p.add_argument(
        "--batch", type=int, default=1_000, help="jobs per batch call (workload b; c's prefill)"
    )
    p.add_argument(
        "--profile",
        choices=["defaults", "best"],
        default="defaults",
        help=profile_help,
    )
    p.add_argument(
        "--interval-ms", type=float, default=10.0, help="gap between enqueues (workload d)"
    )
    p.add_argument(
        "--poll-ms", type=float, default=20.0, help="observer poll interval (workload c)"
    )
    p.add_argument(
        "--timeout", type=float, default=900.0, help="seconds before the workload is abandoned"
    )
    p.add_argument(
        "--keep-db", action="store_true", help="do not drop the scratch database (debugging)"
    )
    return p


def finish_args(args: argparse.Namespace) -> argparse.Namespace:
    if args.jobs is None:
        args.jobs = DEFAULT_JOBS[args.workload]
    if args.jobs <= 0:
        raise BenchError("--jobs must be positive")
    if args.batch <= 0:
        raise BenchError("--batch must be positive")
    for opt in ("interval_ms", "poll_ms", "timeout"):
        if getattr(args, opt) <= 0:
            raise BenchError(f"--{opt.replace('_', '-')} must be positive")
    return args


# --------------------------------------------------------------------------
# DSN and scratch database


def _with_database(dsn: str, dbname: str) -> str:
    parts = urlsplit(dsn)
    if parts.scheme not in ("postgres", "postgresql"):
        raise BenchError(f"--dsn must be a postgresql:// URL, got scheme {parts.scheme!r}")
    return urlunsplit((parts.scheme, parts.netloc, "/" + dbname, parts.query, parts.fragment))


def redact(dsn: str) -> str:
    """The DSN without its password, for messages."""
    parts = urlsplit(dsn)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:***@{host}" if ":" in userinfo else f"{user}@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


async def connect(dsn: str, **kwargs: Any) -> asyncpg.Connection:
    """asyncpg.connect with a bounded wait and a readable failure."""
    try:
        return await asyncio.wait_for(
            asyncpg.connect(dsn, timeout=CONNECT_TIMEOUT_S, **kwargs),
            timeout=CONNECT_TIMEOUT_S + 2,
        )
    except (OSError, asyncio.TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
        raise BenchError(
            f"cannot connect to PostgreSQL at {redact(dsn)}: {type(e).__name__}: {e}"
        ) from e


@contextlib.asynccontextmanager
async def scratch_database(dsn: str, prefix: str, keep: bool = False) -> AsyncIterator[str]:
    """Create ``<prefix>_<random>`` on the DSN's server, yield its URL, drop it."""
    name = f"{prefix}_{secrets.token_hex(4)}"
    admin = await connect(dsn)
    try:
        try:
            await admin.execute(f'CREATE DATABASE "{name}"')
        except asyncpg.PostgresError as e:
            raise BenchError(f"cannot create database {name}: {e}") from e
    finally:
        await admin.close()
    try:
        yield _with_database(dsn, name)
    finally:
        if keep:
            print(f"kept database {name}", file=sys.stderr)
        else:
            admin = await connect(dsn)
            try:
                # FORCE ends connections a timed-out workload may have left behind.
                await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            finally:
                await admin.close()


# --------------------------------------------------------------------------
# observation


async def wait_until_none(dsn: str, count_sql: str, poll_s: float) -> float:
    """Poll ``count_sql`` (returns one integer) on its own connection every
    ``poll_s`` until it returns 0; return the perf_counter() of that sighting."""
    conn = await connect(dsn)
    try:
        while True:
            n = await conn.fetchval(count_sql)
            now = time.perf_counter()
            if n == 0:
                return now
            await asyncio.sleep(poll_s)
    finally:
        await conn.close()


async def watch_until_drained(
    dsn: str, count_sql: str, poll_s: float, check_alive: Callable[[], None]
) -> float:
    """Run ``wait_until_none`` while calling ``check_alive()`` (which raises if
    the worker died) every half second; the watcher never outlives the call."""
    watch = asyncio.create_task(wait_until_none(dsn, count_sql, poll_s))
    try:
        while not watch.done():
            check_alive()
            await asyncio.wait({watch}, timeout=0.5)
        return watch.result()
    finally:
        if not watch.done():
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watch


def latency_summary(latencies_s: list[float]) -> dict[str, float]:
    ms = sorted(x * 1000.0 for x in latencies_s)
    if len(ms) < 2:
        v = ms[0] if ms else float("nan")
        return {"p50_ms": v, "p99_ms": v, "mean_ms": v, "max_ms": v}
    q = statistics.quantiles(ms, n=100, method="inclusive")
    return {
        "p50_ms": round(statistics.median(ms), 3),
        "p99_ms": round(q[98], 3),
        "mean_ms": round(statistics.fmean(ms), 3),
        "max_ms": round(ms[-1], 3),
    }


def rate(jobs: int, seconds: float) -> float:
    return round(jobs / seconds, 1) if seconds > 0 else float("inf")


# --------------------------------------------------------------------------
# entry point


def main(
    system: str,
    parser: argparse.ArgumentParser,
    run: Callable[[argparse.Namespace, str], Awaitable[dict[str, Any]]],
    db_prefix: str,
) -> None:
    """Parse options, run ``run(args, scratch_dsn)`` under a timeout inside a
    fresh database, print its result dict as one JSON line."""
    args = parser.parse_args()

    async def body() -> dict[str, Any]:
        finish_args(args)
        async with scratch_database(args.dsn, db_prefix, keep=args.keep_db) as dsn:
            try:
                return await asyncio.wait_for(run(args, dsn), timeout=args.timeout)
            except asyncio.TimeoutError as e:
                raise BenchError(
                    f"workload {args.workload} did not finish within {args.timeout:g} s"
                ) from e

    try:
        result = asyncio.run(body())
    except BenchError as e:
        print(f"{system}_bench: error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(f"{system}_bench: interrupted", file=sys.stderr)
        sys.exit(130)
    out = {"system": system, "workload": args.workload}
    out.update(result)
    print(json.dumps(out), flush=True)
