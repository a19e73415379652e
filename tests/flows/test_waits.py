"""Durable waits: WaitFor parks a job with no worker and no lease; App.signal wakes it with data."""

from __future__ import annotations

import psycopg
import pytest

from tests.conftest import count, table, wait_until
from tests.flows.test_dependencies import APP, flow_app, runs_of  # noqa: F401 - the fixture

pytestmark = pytest.mark.usefixtures("flow_app")


def state(conn, app, job_id) -> str:
    return app.get_job(job_id, conn)["state"]


def test_wait_then_signal_on_a_worker(app, conn, spawn_worker):
    spawn_worker(APP, app.schema, "-c", "4")
    with psycopg.connect(app.dsn) as tx:
        job = app.enqueue(tx, "waiter", {"key": "openai-batch:abc"})
    wait_until(lambda: state(conn, app, job) == "waiting", message="the job to park")
    row = app.get_job(job, conn)
    assert row["worker"] is None and row["lease_until"] is None and row["attempts"] == 0  # the wait is free
    assert [a["outcome"] for a in row["attempt_rows"]] == ["waiting"]
    assert app.job_flow(job, conn)["wait_key"] == "openai-batch:abc"
    assert [w["id"] for w in app.waiting_jobs(conn)] == [job]
    # the webhook handler's transaction: rolled back, nothing happens
    with pytest.raises(RuntimeError):
        with psycopg.connect(app.dsn) as tx:
            assert app.signal(tx, "openai-batch:abc", {"output_file": "f-1"}) == 1
            raise RuntimeError("the handler failed")
    assert state(conn, app, job) == "waiting"
    with psycopg.connect(app.dsn) as tx:
        assert app.signal(tx, "openai-batch:abc", {"output_file": "f-1"}) == 1
    wait_until(lambda: state(conn, app, job) == "done", message="the signalled job to finish")
    assert app.get_job(job, conn)["result"] == {"signal": {"output_file": "f-1"}, "attempt": 1}
    assert runs_of(conn, app, job) == 2
    assert count(conn, app, "true") == 1  # nothing else was created
    assert conn.execute(f"SELECT count(*) FROM {table(app, 'signals')}").fetchone()[0] == 0


def test_a_signal_before_the_wait_is_kept_and_consumed(app, conn, spawn_worker):
    with psycopg.connect(app.dsn) as tx:
        assert app.signal(tx, "approval:7", {"approved": True}) == 0  # nobody waits yet: kept
        job = app.enqueue(tx, "waiter", {"key": "approval:7"})
    spawn_worker(APP, app.schema, "-c", "4")
    wait_until(lambda: state(conn, app, job) == "done", message="the job to finish")
    assert app.get_job(job, conn)["result"]["signal"] == {"approved": True}
    assert conn.execute(f"SELECT count(*) FROM {table(app, 'signals')}").fetchone()[0] == 0
    outcomes = [a["outcome"] for a in app.get_job(job, conn)["attempt_rows"]]
    assert outcomes == ["waiting", "done"]


def test_a_wait_times_out_into_a_retry_or_a_failure(app, conn, spawn_worker):
    spawn_worker(APP, app.schema, "-c", "4", "--lease", "2", env={"TEST_LEASE": "2"})  # the rescuer runs each second
    with psycopg.connect(app.dsn) as tx:
        retried = app.enqueue(tx, "waiter", {"key": "never:1", "timeout": 0.5})
        failed = app.enqueue(tx, "waiter", {"key": "never:2", "timeout": 0.5, "on_timeout": "fail"})
        forever = app.enqueue(tx, "waiter", {"key": "never:3"})
    wait_until(lambda: state(conn, app, failed) == "failed", message="the wait to time out")
    assert "timed out" in app.get_job(failed, conn)["last_error"]
    # retry: the task ran again (with no signal) and waits again
    wait_until(lambda: len(app.get_job(retried, conn)["attempt_rows"]) >= 3, message="the retry after the timeout")
    outcomes = [a["outcome"] for a in app.get_job(retried, conn)["attempt_rows"]]
    assert outcomes[:3] == ["waiting", "timeout", "waiting"] and runs_of(conn, app, retried) >= 2
    assert state(conn, app, forever) == "waiting" and runs_of(conn, app, forever) == 1


def test_a_signal_wakes_every_job_waiting_for_its_key(app, conn, spawn_worker):
    with psycopg.connect(app.dsn) as tx:
        jobs = [app.enqueue(tx, "waiter", {"key": "deploy:42"}) for _ in range(3)]
    spawn_worker(APP, app.schema, "-c", "4")
    wait_until(lambda: count(conn, app, "state = 'waiting'") == 3, message="three waits")
    with psycopg.connect(app.dsn) as tx:
        assert app.signal(tx, "deploy:42", "go") == 3
    wait_until(lambda: count(conn, app, "state = 'done'") == 3, message="three wake-ups")
    assert {app.get_job(j, conn)["result"]["signal"] for j in jobs} == {"go"}


def test_signals_racing_the_waits_are_never_lost(app, conn, spawn_worker):
    """Each of 200 keys is signalled while its job runs, parks or waits: every job ends done, every signal used."""
    n = 200
    with psycopg.connect(app.dsn) as tx:
        jobs = app.enqueue_many(tx, [("waiter", {"key": f"race:{i}"}) for i in range(n)])
    spawn_worker(APP, app.schema, "-c", "20")
    spawn_worker(APP, app.schema, "-c", "20")
    wait_until(lambda: count(conn, app, "state IN ('running', 'waiting')"), message="the first tries")
    with psycopg.connect(app.dsn, autocommit=True) as signaller:
        for i in range(n):
            with signaller.transaction():
                app.signal(signaller, f"race:{i}", i)
    wait_until(lambda: count(conn, app, "state = 'done'") == n, timeout=60, message="every job to be woken")
    results = conn.execute(f"SELECT id, result FROM {table(app, 'jobs')} ORDER BY id").fetchall()
    assert [r[1]["signal"] for r in results] == list(range(n)) and [r[0] for r in results] == jobs
    assert conn.execute(f"SELECT count(*) FROM {table(app, 'signals')}").fetchone()[0] == 0
