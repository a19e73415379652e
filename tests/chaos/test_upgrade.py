"""Upgrade safety: jobs written and claimed under the previous schema version survive `migrate` and finish."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import time

import psycopg
import pytest

import joblane
from joblane.types import Outcome
from joblane import migrations, store
from joblane.queries import quote_ident
from joblane.testing import drain, isolated_schema

from . import v10_worker


def test_jobs_in_flight_survive_a_migration_to_the_latest_version(joblane_dsn):
    versions = migrations.versions()
    latest = versions[-1]
    if len(versions) < 2:
        pytest.skip(f"the schema has {len(versions)} migration: no previous version to upgrade from yet "
                    "(this test runs by itself once a second migration exists)")
    with isolated_schema(joblane_dsn, migrate=False) as schema, \
            psycopg.connect(joblane_dsn, autocommit=True) as conn:
        assert migrations.migrate(conn, schema, target=versions[-2]) == versions[:-1]
        jobs = f"{quote_ident(schema)}.jobs"
        # Written with the columns every version has, as the previous release's enqueue did.
        ids = [r[0] for r in conn.execute(
            f"INSERT INTO {jobs} (queue, kind, payload) SELECT 'default', 'finish', jsonb_build_object('n', i)"
            " FROM generate_series(1, 30) AS i RETURNING id").fetchall()]
        # Claimed by workers of the previous release: one still alive, one that died during the upgrade.
        alive, dead = ids[:5], ids[5:10]
        conn.execute(f"UPDATE {jobs} SET state = 'running', attempts = 1, worker = 'old-alive',"
                     " lease_until = now() + interval '1 hour' WHERE id = ANY(%s)", (alive,))
        conn.execute(f"UPDATE {jobs} SET state = 'running', attempts = 1, worker = 'old-dead',"
                     " lease_until = now() - interval '1 second' WHERE id = ANY(%s)", (dead,))

        assert migrations.migrate(conn, schema) == [latest]
        app = joblane.App(joblane_dsn, schema=schema)
        seen: list[int] = []

        @app.task("finish")
        async def finish(job):
            seen.append(job.id)

        # the surviving old worker reports its results through today's completion query
        at = time.time()
        finished = [Outcome.done(i, 1, started_at=at, finished_at=at) for i in alive]
        applied = store.fetch(conn, app.store.complete_jobs(store.outcome_rows(finished), "old-alive"))
        assert sorted(r[0] for r in applied) == sorted(alive)
        asyncio.run(drain(app, lease_seconds=2, rescue_interval=0.2))  # rescues the dead worker's jobs, runs the rest
        states = dict(conn.execute(f"SELECT id, state FROM {jobs}").fetchall())
        assert states == {i: "done" for i in ids}
        assert sorted(seen) == sorted(ids[5:])
        lost = conn.execute(f"SELECT job_id FROM {quote_ident(schema)}.attempts WHERE outcome = 'lost'").fetchall()
        assert sorted(r[0] for r in lost) == sorted(dead)


def test_an_upgrade_from_version_10_with_a_version_10_worker_running_finishes_every_job_once(joblane_dsn):
    """A schema at version 10 with jobs in every state, migrated to the latest version while a worker of
    version 10 (a process of its own) claims and completes with version 10's SQL: then today's workers
    drain it. Every job finishes exactly once, none is stuck, no two tries of a job overlap, the held job
    waits for its release, the waiting job runs after its parent, and priorities keep their order."""
    with isolated_schema(joblane_dsn, migrate=False) as schema, \
            psycopg.connect(joblane_dsn, autocommit=True) as conn:
        assert migrations.migrate(conn, schema, target=10) == list(range(1, 11))
        s = quote_ident(schema)
        jobs, runs = f"{s}.jobs", f"{s}.upgrade_runs"
        conn.execute(f"CREATE TABLE {runs} (job_id bigint NOT NULL, attempt int NOT NULL, worker text NOT NULL,"
                     " started_at float8 NOT NULL, finished_at float8)")

        def insert(queue, priority=0, state="pending", delay=0.0, n=1):
            return [r[0] for r in conn.execute(
                f"INSERT INTO {jobs} (queue, kind, payload, priority, state, run_after)"
                " SELECT %s, 'work', jsonb_build_object('n', i), %s, %s, now() + make_interval(secs => %s)"
                " FROM generate_series(1, %s) AS i RETURNING id", (queue, priority, state, delay, n)).fetchall()]

        def v10_claim(queue, n, worker, lease):
            rows = v10_worker.claim(conn, schema, [queue], n, worker, lease)
            at = time.time()
            for r in rows:
                conn.execute(f"INSERT INTO {runs} (job_id, attempt, worker, started_at) VALUES (%s, %s, %s, %s)",
                             (r[0], r[4], worker, at))
            return [(r[0], r[4]) for r in rows]

        # Written with version 10's SQL, as its workers and producers left them:
        # a job held for review by its first try, and one in retry backoff after its first try
        held, retried = insert("setup", n=2)
        assert sorted(v10_claim("setup", 2, "old-setup", 30.0)) == [(held, 1), (retried, 1)]
        at = time.time()
        conn.execute(f"UPDATE {runs} SET finished_at = %s", (at,))
        assert sorted(v10_worker.complete(conn, schema, "old-setup", [
            {"id": held, "attempt": 1, "state": "held", "outcome": "held", "error": "held: check the lead",
             "started_at": at, "finished_at": at},
            {"id": retried, "attempt": 1, "state": "pending", "outcome": "retry", "error": "rate limited",
             "delay": 4.0, "started_at": at, "finished_at": at}])) == sorted([held, retried])
        # running for a worker that died (its lease already ran out) and for one that is alive
        insert("setup", n=3)
        dead = [i for i, _ in v10_claim("setup", 3, "old-dead", 0.5)]
        insert("setup", n=3)
        alive = v10_claim("setup", 3, "old-alive", 120.0)
        # a flow: a child waiting for its parent, linked as version 10's enqueue did
        [parent] = insert("qa", priority=1)
        [child] = insert("qb", state="waiting")
        assert conn.execute(v10_worker.sql(v10_worker.V10_LINK, schema),
                            {"children": [child], "parents": [parent], "policies": ["cancel"]}).fetchall() \
            == [(child, "waiting")]
        # scheduled a few seconds ahead
        [scheduled] = insert("qb", delay=4.0)
        # pending in two queues at two priorities, priority not in id order
        pending = {}
        for i in range(60):
            queue, priority = ("qa", "qb")[i % 2], (i // 2) % 2
            pending[insert(queue, priority)[0]] = (queue, priority)
        everything = [r[0] for r in conn.execute(f"SELECT id FROM {jobs}")]
        not_before = dict(conn.execute(f"SELECT id, extract(epoch FROM run_after)::float8 FROM {jobs}"
                                       " WHERE id = ANY(%s)", ([scheduled, retried],)).fetchall())

        # A worker of version 10 claims and completes queue qa in a process of its own, across the migration.
        # It passes over the row of NULLs today's claim_jobs may end with, which version 10's worker did not
        # (test_a_version_10_worker_gets_only_jobs_from_claim_jobs_after_the_upgrade).
        ctx = multiprocessing.get_context("spawn")
        claimed_once, migrated, stop = ctx.Event(), ctx.Event(), ctx.Event()
        results = ctx.Queue()
        old = ctx.Process(target=v10_worker.run, args=(joblane_dsn, schema, "old-alive", ["qa"], alive,
                                                       claimed_once, migrated, stop, results))
        old.start()
        try:
            assert claimed_once.wait(30), "the version 10 worker never claimed"
            began = time.time()
            assert migrations.migrate(conn, schema) == [v for v in migrations.versions() if v > 10]
            ended = time.time()
            migrated.set()
            assert conn.execute(f"SELECT state FROM {jobs} WHERE id = %s", (held,)).fetchone() == ("held",)

            app = joblane.App(joblane_dsn, schema=schema)
            new_runs: list[tuple[int, int, str, float, float]] = []

            @app.task("work", queue="qa")
            def work(job):
                started = time.time()
                time.sleep(0.005)
                new_runs.append((job.id, job.attempt, "new", started, time.time()))

            # today's worker beside the old one, one try at a time (so its start order is its claim order)
            asyncio.run(drain(app, queues=["qa", "qb"], concurrency=1, claimers=1, lease_seconds=2,
                              rescue_interval=0.2, timeout=30))
        finally:
            stop.set()
            report = results.get(timeout=60)
            old.join(30)
            if old.is_alive():
                old.terminate()
        assert report["error"] is None, report["error"]
        assert report["carried_left"] == []
        before = [c for c in report["claims"] if c[1] < began and c[2]]
        after = [c for c in report["claims"] if c[0] > ended and c[2]]
        assert before and after, "the version 10 worker must claim jobs both before and after the migration"

        # the held job waited through all of it; released, it runs; the scheduled and retried ones came due
        assert conn.execute(f"SELECT state FROM {jobs} WHERE id = %s", (held,)).fetchone() == ("held",)
        assert app.release(conn, held) == held
        wait = conn.execute(f"SELECT extract(epoch FROM max(run_after) - now()) FROM {jobs}"
                            " WHERE state = 'pending'").fetchone()[0]
        time.sleep(max(0.0, float(wait or 0)) + 0.1)
        asyncio.run(drain(app, queues=["qa", "qb", "setup"], concurrency=1, claimers=1, lease_seconds=2,
                          rescue_interval=0.2, timeout=30))

        states = dict(conn.execute(f"SELECT id, state FROM {jobs}").fetchall())
        assert states == {i: "done" for i in everything}, "every job done, none stuck"
        done = dict(conn.execute(f"SELECT job_id, count(*) FROM {s}.attempts WHERE outcome = 'done'"
                                 " GROUP BY job_id").fetchall())
        assert done == {i: 1 for i in everything}, "one done attempt per job"
        lost = sorted(r[0] for r in conn.execute(f"SELECT job_id FROM {s}.attempts WHERE outcome = 'lost'"))
        assert lost == sorted(dead)

        tries = [tuple(r) for r in conn.execute(
            f"SELECT job_id, attempt, worker, started_at, finished_at FROM {runs}")]
        tries += new_runs
        by_job: dict[int, list] = {}
        for t in tries:
            by_job.setdefault(t[0], []).append(t)
        twice = set(dead) | {held, retried}  # lost then run again; held then released; failed then retried
        assert {i: len(t) for i, t in by_job.items()} == {i: 2 if i in twice else 1 for i in everything}
        for job_id, ts in by_job.items():  # no two tries of a job at once
            ts.sort(key=lambda t: t[3])
            for a, b in zip(ts, ts[1:]):
                assert a[4] is None and a[2] == "old-dead" or a[4] <= b[3], (job_id, ts)
        assert by_job[child][0][3] >= by_job[parent][0][4], "the waiting job ran only after its parent"
        for job_id, due in not_before.items():  # the scheduled job and the retry ran once due, not before
            assert by_job[job_id][-1][3] >= due, (job_id, due, by_job[job_id])

        # today's worker took queue qb's jobs that were waiting at the upgrade by priority
        order = [pending[t[0]][1] for t in sorted(new_runs, key=lambda t: t[3])
                 if t[0] in pending and pending[t[0]][0] == "qb"]
        assert len(order) == 30 and order == sorted(order), order


def test_a_version_10_worker_gets_only_jobs_from_claim_jobs_after_the_upgrade(joblane_dsn):
    """A worker of version 10 that runs on across the upgrade calls today's claim_jobs: every row it gets
    must be a job, since it starts each one (worker/worker.py of version 10: Job(payload=json.loads(row[3]))
    for each row, in (priority, id) order)."""
    with isolated_schema(joblane_dsn, migrate=False) as schema, \
            psycopg.connect(joblane_dsn, autocommit=True) as conn, psycopg.connect(joblane_dsn) as other:
        assert migrations.migrate(conn, schema, target=10) == list(range(1, 11))
        s = quote_ident(schema)
        conn.execute(f"INSERT INTO {s}.jobs (queue, kind, payload, run_after)"
                     " VALUES ('qa', 'work', '{}', now() + interval '0.3 seconds'), ('qb', 'work', '{}', now())")
        migrations.migrate(conn, schema)
        time.sleep(0.4)
        # the job scheduled at the upgrade came due: the claim promotes it (a later claim takes it)
        seen = v10_worker.claim(conn, schema, ["qa"], 2, "old-alive", 30.0)
        # a claim of another worker holds queue qb's lane at that moment
        other.execute(f"SELECT pg_advisory_xact_lock(hashtext(%s), {s}.lane_of('qb', 0::smallint))", (f"{s}.lanes",))
        seen += v10_worker.claim(conn, schema, ["qb"], 2, "old-alive", 30.0)
        other.rollback()
        for row in sorted(seen, key=lambda r: (r[6], r[0])):  # as version 10's producer started them
            json.loads(row[3])
        assert all(row[0] is not None for row in seen), seen
