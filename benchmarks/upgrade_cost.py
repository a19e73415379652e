#!/usr/bin/env python3
"""What `joblane migrate` from schema version 10 to the latest costs on a big table, and what it locks.

    DATABASE_URL=postgresql://... .venv/bin/python benchmarks/upgrade_cost.py            # 1,000,000 jobs
    .venv/bin/python benchmarks/upgrade_cost.py --jobs 100000 --dsn postgresql://postgres@127.0.0.1:5432/test

In a scratch schema (dropped at the end unless --keep) migrated to version 10,
it writes --jobs jobs: a tenth pending and due, a twentieth pending and
scheduled up to an hour ahead, the rest done; and --attempts attempts rows
(default: as many as jobs): one 'done' row per done job, then 'retry' rows
for the pending ones. After VACUUM ANALYZE, it runs ``migrations.migrate`` to
the latest version (one transaction, as `joblane migrate` does) and prints:

- the time of each migration's SQL and of the whole call;
- the locks the migrating session held on the tables of version 10 (jobs,
  attempts, processes, ...; the tables it makes are seen by no one else
  before its commit), sampled from pg_locks on a second connection every
  --sample seconds: from when each was first seen until the commit, since
  every lock is held to the end of the transaction; and any lock it waited
  for;
- what sessions working beside it saw (unless --no-load): a worker of
  version 10 claiming two jobs at a time with ``claim_jobs`` and finishing
  them with version 10's completion statement, a producer inserting one job
  at a time, and a reader of attempts; the longest each of their statements
  took while the migration ran.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from joblane import migrations  # noqa: E402
from joblane.queries import quote_ident  # noqa: E402
from tests.chaos import v10_worker  # noqa: E402  version 10's claim and completion statements


def build(conn, schema: str, jobs: int, attempts: int) -> dict:
    s = quote_ident(schema)
    migrations.drop_schema(conn, schema)
    assert migrations.migrate(conn, schema, target=10) == list(range(1, 11))
    t = time.perf_counter()
    conn.execute(
        f"INSERT INTO {s}.jobs (queue, kind, payload, priority, state, run_after, attempts, worker, started_at,"
        " created_at, finished_at)"
        " SELECT 'q' || (i %% 4), 'work', jsonb_build_object('lead', i, 'prompt', 'v1'), (i %% 3)::smallint,"
        "        CASE WHEN i %% 20 = 0 OR i %% 10 = 1 THEN 'pending' ELSE 'done' END,"
        "        CASE WHEN i %% 20 = 0 THEN now() + make_interval(secs => 60 + i %% 3600)"
        "             ELSE now() - make_interval(secs => %s - i) / 1000 END,"
        "        CASE WHEN i %% 20 = 0 OR i %% 10 = 1 THEN 0 ELSE 1 END, NULL,"
        "        CASE WHEN i %% 20 = 0 OR i %% 10 = 1 THEN NULL ELSE now() - make_interval(secs => %s - i) / 1000 END,"
        "        now() - make_interval(secs => %s - i) / 1000,"
        "        CASE WHEN i %% 20 = 0 OR i %% 10 = 1 THEN NULL ELSE now() - make_interval(secs => %s - i) / 1000 END"
        "   FROM generate_series(1, %s) AS i", (jobs, jobs, jobs, jobs, jobs))
    # one 'done' row per done job, then 'retry' rows for the pending ones (a try that failed), up to the count
    conn.execute(
        f"INSERT INTO {s}.attempts (job_id, attempt, worker, started_at, finished_at, outcome, error, meta)"
        " SELECT id, 1, 'w1', started_at, finished_at, 'done', NULL, jsonb_build_object('model', 'm', 'tokens', 900)"
        f"  FROM {s}.jobs WHERE state = 'done' ORDER BY id LIMIT %s", (attempts,))
    left = attempts - conn.execute(f"SELECT count(*) FROM {s}.attempts").fetchone()[0]
    while left > 0:
        n = conn.execute(
            f"INSERT INTO {s}.attempts (job_id, attempt, worker, started_at, finished_at, outcome, error)"
            " SELECT id, 1, 'w1', created_at, created_at, 'retry', 'rate limited'"
            f"  FROM {s}.jobs WHERE state = 'pending' ORDER BY id LIMIT %s", (left,)).rowcount
        left -= n
        if n == 0:
            break
    conn.execute(f"VACUUM ANALYZE {s}.jobs")
    conn.execute(f"VACUUM ANALYZE {s}.attempts")
    counts = dict(conn.execute(
        f"SELECT CASE WHEN state = 'pending' AND run_after > now() THEN 'scheduled' ELSE state END, count(*)"
        f"  FROM {s}.jobs GROUP BY 1").fetchall())
    counts["attempts rows"] = conn.execute(f"SELECT count(*) FROM {s}.attempts").fetchone()[0]
    counts["jobs MB"] = conn.execute("SELECT pg_total_relation_size(%s) / 1e6", (f"{s}.jobs",)).fetchone()[0]
    counts["attempts MB"] = conn.execute("SELECT pg_total_relation_size(%s) / 1e6", (f"{s}.attempts",)).fetchone()[0]
    counts["build s"] = time.perf_counter() - t
    return counts


class Timed:
    """A psycopg connection whose execute calls are timed, for migrations.migrate to run on."""

    def __init__(self, conn, by_sql: dict[str, int]):
        self.conn, self.by_sql, self.times = conn, by_sql, {}

    def transaction(self):
        return self.conn.transaction()

    def execute(self, query, params=None):
        t = time.perf_counter()
        try:
            return self.conn.execute(query, params)
        finally:
            version = self.by_sql.get(query) if isinstance(query, str) else None
            if version is not None:
                self.times[version] = time.perf_counter() - t


class LockSampler(threading.Thread):
    """Every ``every`` seconds, the relation locks session ``pid`` holds or waits for: first and last seen."""

    def __init__(self, dsn: str, pid: int, every: float):
        super().__init__(daemon=True)
        self.dsn, self.pid, self.every = dsn, pid, every
        self.seen: dict[tuple[int, str, bool], list[float]] = {}
        self.stop = threading.Event()

    def run(self):
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                now = time.perf_counter()
                for oid, mode, granted in conn.execute(
                        "SELECT relation::int, mode, granted FROM pg_locks"
                        " WHERE pid = %s AND locktype = 'relation'", (self.pid,)):
                    self.seen.setdefault((oid, mode, granted), [now, now])[1] = now
                time.sleep(self.every)


class Load(threading.Thread):
    """A session working beside the migration: the longest statement it ran while the migration ran."""

    def __init__(self, dsn: str, name: str, step):
        super().__init__(daemon=True)
        self.dsn, self.name, self.step = dsn, name, step
        self.window = (float("inf"), float("inf"))
        self.longest = 0.0
        self.count = 0
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self):
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                t = time.perf_counter()
                try:
                    self.step(conn)
                except psycopg.Error as exc:
                    self.errors.append(str(exc).splitlines()[0])
                end = time.perf_counter()
                if end > self.window[0] and t < self.window[1]:
                    self.longest = max(self.longest, end - t)
                    self.count += 1
                time.sleep(0.01)


def loads(dsn: str, schema: str) -> list[Load]:
    s = quote_ident(schema)

    def old_worker(conn):
        rows = [r for r in v10_worker.claim(conn, schema, ["q0", "q1"], 2, "v10-worker", 30.0) if r[0] is not None]
        if rows:
            at = time.time()
            v10_worker.complete(conn, schema, "v10-worker", [v10_worker.done(r[0], r[4], at, at) for r in rows])

    def producer(conn):
        conn.execute(f"INSERT INTO {s}.jobs (queue, kind, payload) VALUES ('q2', 'work', '{{}}')")

    def reader(conn):
        conn.execute(f"SELECT count(*) FROM {s}.attempts WHERE job_id = 7").fetchone()

    return [Load(dsn, "version 10 worker: claim + complete", old_worker),
            Load(dsn, "producer: INSERT one job", producer),
            Load(dsn, "reader: attempts of one job", reader)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", default=os.environ.get("DATABASE_URL"))
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--attempts", type=int, default=None, help="attempts rows (default: as many as jobs)")
    parser.add_argument("--schema", default=f"upgrade_cost_{os.getpid()}")
    parser.add_argument("--sample", type=float, default=0.005, help="seconds between pg_locks samples")
    parser.add_argument("--no-load", action="store_true", help="no sessions working beside the migration")
    parser.add_argument("--keep", action="store_true", help="leave the scratch schema")
    parser.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = parser.parse_args()
    if not args.dsn:
        parser.error("set DATABASE_URL or pass --dsn")
    attempts = args.jobs if args.attempts is None else args.attempts
    schema = args.schema
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        try:
            counts = build(conn, schema, args.jobs, attempts)
            print(f"schema {schema} at version 10: " + ", ".join(
                f"{k} {v:,.0f}" if isinstance(v, int) else f"{k} {v:,.1f}" for k, v in counts.items()))
            by_sql = {m.render(schema): m.version for m in migrations.all_migrations()}
            # the tables there before the migration, by their names then (the old attempts ends as attempts_v10);
            # the ones it makes are seen by nobody else before its commit
            names = dict(conn.execute("SELECT c.oid::int, c.relname FROM pg_class AS c"
                                      " JOIN pg_namespace AS n ON n.oid = c.relnamespace"
                                      " WHERE n.nspname = %s AND c.relkind IN ('r', 'p')", (schema,)).fetchall())
            timed = Timed(conn, by_sql)
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            sampler = LockSampler(args.dsn, pid, args.sample)
            sampler.start()
            workers = [] if args.no_load else loads(args.dsn, schema)
            for w in workers:
                w.start()
            time.sleep(0.5)
            began = time.perf_counter()
            for w in workers:
                w.window = (began, float("inf"))
            applied = migrations.migrate(timed, schema)
            ended = time.perf_counter()
            for w in workers:
                w.window = (began, ended)
            time.sleep(0.5)
            sampler.stop.set()
            for w in workers:
                w.stop.set()
            sampler.join()
            for w in workers:
                w.join()
            total = ended - began
            print(f"\nmigrate {applied[0]} -> {applied[-1]}: {total:.2f} s in one transaction")
            print(f"\n{'migration':<34} {'seconds':>8}")
            for m in migrations.all_migrations():
                if m.version in timed.times:
                    print(f"{m.version:04d}_{m.name:<29} {timed.times[m.version]:>8.3f}")
            print(f"\n{'lock the migration held on a table of version 10':<58} {'held s':>7}  (first seen -> commit)")
            rows = []
            for (oid, mode, granted), (first, _last) in sampler.seen.items():
                name = names.get(oid)
                if name is None or not granted:
                    continue
                rows.append((first, name, mode, ended - first))
            for first, name, mode, held in sorted(rows):
                print(f"{name + ' ' + mode:<58} {held:>7.2f}")
            waits = sorted((first, names.get(oid, str(oid)), mode, last - first)
                           for (oid, mode, granted), (first, last) in sampler.seen.items() if not granted)
            for first, name, mode, waited in waits:
                print(f"  the migration waited for {name} {mode} for {waited:.2f} s at {first - began:.2f} s")
            if workers:
                print(f"\n{'beside the migration':<40} {'longest statement s':>20} {'statements':>11}")
                for w in workers:
                    print(f"{w.name:<40} {w.longest:>20.2f} {w.count:>11}"
                          + (f"  errors: {w.errors[:2]}" if w.errors else ""))
            if args.json:
                print(json.dumps({"counts": counts, "total": total, "migrations": timed.times,
                                  "locks": [(n, m, h) for _, n, m, h in sorted(rows)],
                                  "beside": {w.name: w.longest for w in workers}}, default=str))
        finally:
            if not args.keep:
                migrations.drop_schema(conn, schema)


if __name__ == "__main__":
    main()
