#!/usr/bin/env python3
"""What one job and one outbox message write: WAL bytes, row versions, index entries; and what history costs.

    .venv/bin/python benchmarks/capacity.py                 # 20,000 jobs per step, on a cluster of its own
    .venv/bin/python benchmarks/capacity.py --jobs 50000 --json
    .venv/bin/python benchmarks/capacity.py --dsn "$DATABASE_URL"   # on a server you name (quiet, please)

Each step runs in a fresh schema, by default on a PostgreSQL cluster the
script starts itself (initdb with PostgreSQL's defaults, as benchmarks/soak.py): enqueue (one per
transaction, and enqueue_many of 1,000), processing by one worker (the full
attempts trail, and a lean task), outbox publish and delivery by the relay
to a sink that drops messages. For each it prints the WAL written per job
(pg_current_wal_lsn before and after, so other sessions' writes on a shared
server count too: run it on a quiet one), the row versions written
(pg_stat_user_tables: inserted, updated, deleted, of which HOT) and the
index entries added (a non-HOT insert or update adds one per index whose
predicate the row matches). Then the bytes a finished job keeps on disk
(its row, its attempts row and their index entries, after VACUUM), from
which it prints what a retention of 7 days holds at 100, 1,000 and 10,000
jobs a second. Counts, not timings: the same on any machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import joblane  # noqa: E402
from joblane import JobSpec  # noqa: E402
from joblane.outbox import Relay  # noqa: E402
from joblane.testing import isolated_schema, new_schema_name  # noqa: E402
from joblane.worker import Worker  # noqa: E402
from soak import Cluster  # noqa: E402
from soak_app import DropSink  # noqa: E402

TABLES = ("jobs", "attempts", "outbox")


def make_app(dsn: str, schema: str) -> joblane.App:
    app = joblane.App(dsn, schema=schema)

    @app.task("noop")
    async def noop(job):
        return None

    @app.task("noop_lean", lean=True)
    async def noop_lean(job):
        return None

    app.route("cap.", DropSink())
    return app


def counters(conn: psycopg.Connection, schema: str) -> dict[str, Any]:
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    # a partition's counts go to its partitioned table (attempts)
    rows = conn.execute(
        "SELECT coalesce(r.relname, s.relname), sum(n_tup_ins)::bigint, sum(n_tup_upd)::bigint, sum(n_tup_del)::bigint,"
        "       sum(n_tup_hot_upd)::bigint"
        "  FROM pg_stat_user_tables s LEFT JOIN pg_class r ON r.oid = pg_partition_root(s.relid)"
        " WHERE s.schemaname = %s GROUP BY 1", (schema,)).fetchall()
    lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
    return {"lsn": lsn, "tables": {r[0]: r[1:] for r in rows}}


def index_predicates(conn: psycopg.Connection, schema: str) -> dict[str, int]:
    """How many indexes each table has (partial ones counted apart)."""
    rows = conn.execute(
        "SELECT c.relname, count(*), count(*) FILTER (WHERE i.indpred IS NOT NULL)"
        "  FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indrelid"
        "  JOIN pg_namespace AS n ON n.oid = c.relnamespace WHERE n.nspname = %s GROUP BY c.relname",
        (schema,)).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def measure(dsn: str, step: str, n: int, run: Callable[[joblane.App], None],
            prepare: Callable[[joblane.App], None] | None = None) -> dict[str, Any]:
    with isolated_schema(dsn, new_schema_name("cap")) as schema:
        app = make_app(dsn, schema)
        if prepare:
            prepare(app)
        with psycopg.connect(dsn, autocommit=True) as conn:
            before = counters(conn, schema)
            run(app)
            time.sleep(0.6)  # the worker's backends report their counts when they go idle or close
            after = counters(conn, schema)
            wal = conn.execute("SELECT pg_wal_lsn_diff(%s, %s)", (after["lsn"], before["lsn"])).fetchone()[0]
            indexes = index_predicates(conn, schema)
    out: dict[str, Any] = {"step": step, "n": n, "wal_bytes_per": round(float(wal) / n)}
    for table in TABLES:
        a = after["tables"].get(table, (0, 0, 0, 0))
        b = before["tables"].get(table, (0, 0, 0, 0))
        ins, upd, dele, hot = (x - y for x, y in zip(a, b))
        if ins or upd or dele:
            out[table] = {"inserted": round(ins / n, 2), "updated": round(upd / n, 2), "deleted": round(dele / n, 2),
                          "hot": round(hot / n, 2), "indexes": indexes.get(table, (0, 0))[0]}
    return out


def fill(app: joblane.App, n: int, kind: str = "noop") -> None:
    with psycopg.connect(app.dsn, autocommit=True) as conn:
        for start in range(0, n, 1000):
            app.enqueue_many(conn, [JobSpec(kind, {"i": i}) for i in range(start, min(n, start + 1000))])


def run_until_none(app: joblane.App, make: Callable[[], Any], table: str, where: str) -> None:
    """Run the service ``make()`` returns (a Worker or a Relay) until no row of ``table`` matches ``where``."""
    async def run() -> None:
        service = make()
        task = asyncio.create_task(service.run(install_signals=False))
        with psycopg.connect(app.dsn, autocommit=True) as conn:
            # table and where are this script's own constants; the schema is quoted as an identifier
            probe = sql.SQL("SELECT EXISTS (SELECT 1 FROM {}.{} WHERE {})").format(
                sql.Identifier(app.schema), sql.Identifier(table), sql.SQL(where))
            while conn.execute(probe).fetchone()[0]:
                await asyncio.sleep(0.05)
        service.request_stop()
        await task

    asyncio.run(run())


def work(app: joblane.App) -> None:
    run_until_none(app, lambda: Worker(app, concurrency=200, claim_batch=100), "jobs",
                   "state IN ('pending', 'running')")


def single(app: joblane.App, n: int) -> None:
    with psycopg.connect(app.dsn, autocommit=True) as conn:
        for i in range(n):
            app.enqueue(conn, "noop", {"i": i})


def publish(app: joblane.App, n: int) -> None:
    with psycopg.connect(app.dsn, autocommit=True) as conn:
        for start in range(0, n, 100):
            with conn.transaction():
                for i in range(start, min(n, start + 100)):
                    app.publish(conn, "cap.event", {"i": i})


def relay(app: joblane.App) -> None:
    run_until_none(app, lambda: Relay(app, batch_size=500), "outbox", "state = 'pending'")


def kept_bytes(dsn: str, n: int) -> dict[str, float]:
    """Bytes per finished job of jobs + attempts (heap and indexes) after VACUUM, full trail."""
    with isolated_schema(dsn, new_schema_name("cap")) as schema:
        app = make_app(dsn, schema)
        fill(app, n)
        work(app)
        with psycopg.connect(dsn, autocommit=True) as conn:
            out = {}
            for table in ("jobs", "attempts"):
                name = sql.Identifier(schema, table)
                conn.execute(sql.SQL("VACUUM {}").format(name))
                text = name.as_string(conn)  # regclass reads the quoted name
                heap, total = conn.execute(  # a partitioned table (attempts): the sum of its partitions
                    "SELECT sum(pg_relation_size(relid))::bigint, sum(pg_total_relation_size(relid))::bigint"
                    "  FROM (SELECT %s::regclass AS relid WHERE NOT EXISTS (SELECT 1 FROM pg_partition_tree(%s))"
                    "        UNION ALL SELECT relid FROM pg_partition_tree(%s) WHERE isleaf) AS t",
                    (text, text, text)).fetchone()
                out[table] = {"heap": heap / n, "total": total / n}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="measure on this server instead of a cluster of the script's own")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.dsn:
        return report(args.dsn, args.jobs, args.json)
    cluster = Cluster()
    try:
        return report(cluster.start(), args.jobs, args.json)
    finally:
        cluster.stop()


def report(dsn: str, n: int, as_json: bool) -> int:
    steps = [
        measure(dsn, "enqueue, one per transaction", n, lambda app: single(app, n)),
        measure(dsn, "enqueue_many, 1,000 per call", n, lambda app: fill(app, n)),
        measure(dsn, "claim + complete (attempts trail)", n, work, prepare=lambda app: fill(app, n)),
        measure(dsn, "claim + complete (lean task)", n, work, prepare=lambda app: fill(app, n, "noop_lean")),
        measure(dsn, "outbox publish, 100 per transaction", n, lambda app: publish(app, n)),
        measure(dsn, "relay delivery (marked sent)", n, relay, prepare=lambda app: publish(app, n)),
    ]
    kept = kept_bytes(dsn, n)
    per_job = kept["jobs"]["total"] + kept["attempts"]["total"]
    retention = {rate: per_job * rate * 7 * 86400 for rate in (100, 1000, 10_000)}
    if as_json:
        print(json.dumps({"steps": steps, "kept_bytes_per_job": kept, "retention_7d_bytes": retention}))
        return 0
    print(f"{'step':40} {'WAL B/job':>10}  rows written per job (inserted/updated/deleted, HOT; indexes)")
    for s in steps:
        parts = [f"{t}: {v['inserted']:g}/{v['updated']:g}/{v['deleted']:g}, HOT {v['hot']:g}; {v['indexes']} idx"
                 for t, v in s.items() if t in TABLES]
        print(f"{s['step']:40} {s['wal_bytes_per']:>10,}  " + "  ".join(parts))
    print(f"\nkept per finished job after VACUUM: jobs {kept['jobs']['total']:.0f} B "
          f"(heap {kept['jobs']['heap']:.0f}), attempts {kept['attempts']['total']:.0f} B "
          f"(heap {kept['attempts']['heap']:.0f})")
    for rate, size in retention.items():
        print(f"7 days of history at {rate:>6,} jobs/s: {rate * 7 * 86400:>14,} jobs, {size / 2**30:,.1f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
