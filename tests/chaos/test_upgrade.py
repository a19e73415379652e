"""Upgrade safety: jobs written and claimed under the previous schema version survive `migrate` and finish."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

import joblane
from joblane.types import Outcome
from joblane import migrations, store
from joblane.queries import quote_ident
from joblane.testing import drain, isolated_schema


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
