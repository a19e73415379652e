"""Batches: the callback is inserted once, in the transaction of the last completion, also while workers die."""

from __future__ import annotations

import random
import time

import psycopg
import pytest

import joblane
from joblane.testing import drain, run_jobs
from tests.conftest import count, table, wait_until
from tests.flows.test_dependencies import APP, finished, flow_app, runs_of  # noqa: F401 - the fixture

pytestmark = pytest.mark.usefixtures("flow_app")


def callbacks(conn, app) -> list[tuple]:
    return conn.execute(f"SELECT id, payload FROM {table(app, 'jobs')} WHERE kind = 'summary'").fetchall()


def test_a_batch_with_workers_killed_mid_batch_calls_back_once(app, conn, spawn_worker):
    n = 10_000
    with psycopg.connect(app.dsn) as tx:
        batch = app.batch(tx, name="chaos", on_complete=("summary", {"report": "nightly"}))
        ids = batch.enqueue_many(tx, [("step", {"i": i, "sleep": 0.002}) for i in range(n - 20)]
                                 + [joblane.JobSpec("step", {"i": i, "fail": True}) for i in range(20)])
        batch.seal(tx)
    env = {"TEST_LEASE": "2"}
    workers = [spawn_worker(APP, app.schema, "-c", "20", env=env) for _ in range(2)]
    rng = random.Random(7)
    for round_ in range(3):
        # kill one worker while the batch runs, start a fresh one
        wait_until(lambda: count(conn, app, "batch_id = %s AND state IN ('done', 'failed')", (batch.id,))
                   >= (round_ + 1) * n // 5, timeout=60, message="progress")
        victim = workers.pop(rng.randrange(len(workers)))
        victim.kill()
        workers.append(spawn_worker(APP, app.schema, "-c", "20", env=env))
    wait_until(lambda: callbacks(conn, app), timeout=60, message="the callback")
    wait_until(lambda: finished(conn, app, ids), timeout=60, message="the batch")
    time.sleep(0.5)  # a second callback, were there one, would have come with the same completions
    rows = callbacks(conn, app)
    assert len(rows) == 1
    summary = rows[0][1]
    assert summary["report"] == "nightly"
    assert summary["batch"]["total"] == n and summary["batch"]["done"] == n - 20
    assert summary["batch"]["failed"] == 20 and summary["batch"]["failed_ids"] == ids[-20:]
    progress = app.batch_progress(batch.id, conn)
    assert progress["state"] == "finished" and progress["callback_job_id"] == rows[0][0]
    assert progress["done"] == n - 20 and progress["failed"] == 20
    # the callback was inserted by a completion's transaction: a job of the batch finished at its now()
    assert conn.execute(
        f"SELECT count(*) FROM {table(app, 'jobs')} j WHERE j.batch_id = %s"
        f"   AND j.finished_at = (SELECT created_at FROM {table(app, 'jobs')} WHERE id = %s)",
        (batch.id, rows[0][0])).fetchone()[0] >= 1


@pytest.fixture
def local(app):
    @app.task("step")
    def step(job):
        if job.payload.get("fail"):
            raise joblane.PermanentError("told to fail")

    @app.task("summary")
    def summary(job):
        return job.payload["batch"]

    return app


def test_a_batch_filled_over_several_transactions_and_sealed_after_it_finished(local, conn):
    app = local
    with psycopg.connect(app.dsn) as tx:
        batch = app.batch(tx, name="in parts", on_complete=("summary", {}))
        first = batch.enqueue(tx, "step", {"n": 1})
    run_jobs(app)
    assert callbacks(conn, app) == [], "an unsealed batch never calls back"
    with psycopg.connect(app.dsn) as tx:
        later = app.get_batch(batch.id)
        second = app.enqueue(tx, "step", {"n": 2, "fail": True}, batch=later)
    run_jobs(app)
    assert callbacks(conn, app) == []
    assert app.batch_progress(batch.id, conn)["state"] == "open"
    with psycopg.connect(app.dsn) as tx:
        assert batch.seal(tx) is True  # everything had finished: the callback comes with the seal
    rows = callbacks(conn, app)
    assert len(rows) == 1 and rows[0][1]["batch"]["failed_ids"] == [second]
    assert rows[0][1]["batch"]["done"] == 1 and first != second
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="sealed"):
        with psycopg.connect(app.dsn) as tx:
            batch.enqueue(tx, "step", {"n": 3})
    with psycopg.connect(app.dsn) as tx:
        assert batch.seal(tx) is True  # sealing again changes nothing
    assert len(callbacks(conn, app)) == 1
    listed = app.list_batches(conn)
    assert [b["id"] for b in listed] == [batch.id] and listed[0]["total"] == 2


def test_a_rolled_back_batch_leaves_nothing(local, conn):
    app = local
    with pytest.raises(RuntimeError):
        with psycopg.connect(app.dsn) as tx:
            batch = app.batch(tx, on_complete=("summary", {}))
            batch.enqueue_many(tx, [("step", {"n": i}) for i in range(3)])
            raise RuntimeError("the request failed")
    assert count(conn, app) == 0 and app.list_batches(conn) == []


def test_an_empty_sealed_batch_calls_back_at_once(local, conn):
    app = local
    with psycopg.connect(app.dsn) as tx:
        batch = app.batch(tx, on_complete=("summary", {}))
        assert batch.seal(tx) is True
    rows = callbacks(conn, app)
    assert len(rows) == 1 and rows[0][1]["batch"]["total"] == 0


async def test_the_async_forms_on_asyncpg(local, conn):
    import asyncpg

    app = local
    db = await asyncpg.connect(app.dsn)
    try:
        async with db.transaction():
            batch = await app.batch_async(db, name="async", on_complete=("summary", {}))
            first = await batch.enqueue_async(db, "step", {"n": 1})
            [second] = await batch.enqueue_many_async(db, [joblane.JobSpec("step", {"n": 2}, after=[first])])
            assert await batch.seal_async(db) is False
    finally:
        await db.close()
    assert app.job_flow(second, conn)["parents"] == [first]
    await drain(app)
    assert len(callbacks(conn, app)) == 1 and callbacks(conn, app)[0][1]["batch"]["done"] == 2


async def test_the_pruner_drops_finished_batches_with_their_jobs_and_old_signals(local, conn):
    import asyncpg

    from joblane.maintenance import Pruner

    app = local
    with psycopg.connect(app.dsn) as tx:
        batch = app.batch(tx, on_complete=("summary", {}))
        batch.enqueue(tx, "step", {"n": 1})
        batch.seal(tx)
        open_batch = app.batch(tx)
        app.signal(tx, "nobody:waits", 1)
    await drain(app)
    db = await asyncpg.connect(app.dsn)
    try:
        await Pruner(app.store, retention=0).run_once(db)
    finally:
        await db.close()
    assert [b["id"] for b in app.list_batches(conn)] == [open_batch.id]  # unfinished batches stay
    assert conn.execute(f"SELECT count(*) FROM {table(app, 'signals')}").fetchone()[0] == 0
    assert count(conn, app) == 0
