"""A task finishes its job in its own transaction, with its writes and the events it publishes."""

from __future__ import annotations

import asyncpg
import pytest

import joblane
from joblane.queries import quote_ident
from joblane.testing import drain

from .conftest import outbox_rows


@pytest.fixture
def leads(app, conn) -> str:
    name = f"{quote_ident(app.schema)}.leads"
    conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, label text NOT NULL)")
    return name


def job_state(conn, app, job_id):
    return conn.execute(f'SELECT state, attempts, result FROM "{app.schema}".jobs WHERE id = %s', (job_id,)).fetchone()


def outcomes(conn, app, job_id):
    return [r[0] for r in conn.execute(
        f'SELECT outcome FROM "{app.schema}".attempts WHERE job_id = %s ORDER BY id', (job_id,)).fetchall()]


async def test_writes_event_and_completion_commit_together(app, conn, leads):
    @app.task("classify")
    async def classify(job: joblane.Job):
        job.record(model="small-1")
        db = await asyncpg.connect(app.dsn)
        try:
            async with db.transaction():
                await db.execute(f"INSERT INTO {leads} VALUES ($1, 'hot')", job.payload["lead"])
                await app.publish_async(db, "crm.lead_classified", {"lead": job.payload["lead"]}, key="lead-7")
                await app.complete_job_async(db, job, {"label": "hot"})
        finally:
            await db.close()

    job_id = app.enqueue(conn, "classify", {"lead": 7})
    await drain(app)
    assert job_state(conn, app, job_id) == ("done", 1, {"label": "hot"})
    assert outcomes(conn, app, job_id) == ["done"], "one attempts row: the worker's late completion changed nothing"
    assert conn.execute(f"SELECT id, label FROM {leads}").fetchall() == [(7, "hot")]
    assert [(s, k) for _, s, _, k, *_ in outbox_rows(conn, app)] == [("pending", "lead-7")]
    meta = conn.execute(f'SELECT meta FROM "{app.schema}".attempts WHERE job_id = %s', (job_id,)).fetchone()[0]
    assert meta == {"model": "small-1"}


async def test_a_crash_before_commit_leaves_nothing_and_the_job_runs_again(app, conn, leads):
    @app.task("classify", max_attempts=3, backoff=lambda attempt: 0.0)
    async def classify(job: joblane.Job):
        db = await asyncpg.connect(app.dsn)
        try:
            async with db.transaction():
                await db.execute(f"INSERT INTO {leads} VALUES ($1, 'hot')", job.payload["lead"])
                await app.publish_async(db, "crm.lead_classified", {"lead": job.payload["lead"]})
                await app.complete_job_async(db, job)
                if job.attempt == 1:
                    raise ConnectionError("lost before commit")
        finally:
            await db.close()

    job_id = app.enqueue(conn, "classify", {"lead": 8})
    await drain(app)
    assert job_state(conn, app, job_id)[:2] == ("done", 2)
    assert outcomes(conn, app, job_id) == ["retry", "done"]
    assert conn.execute(f"SELECT count(*) FROM {leads}").fetchone()[0] == 1
    assert len(outbox_rows(conn, app)) == 1, "the first try's event was rolled back with it"


def test_a_job_no_longer_running_refuses_and_the_caller_rolls_back(app, conn, leads, joblane_dsn):
    import psycopg

    job_id = app.enqueue(conn, "classify", {})
    stale = joblane.Job(id=job_id, kind="classify", queue="default", payload={}, attempt=1, max_attempts=3)
    with psycopg.connect(joblane_dsn) as db:
        with pytest.raises(joblane.JoblaneError, match="no longer running attempt 1"):
            with db.transaction():
                db.execute(f"INSERT INTO {leads} VALUES (1, 'x')")
                app.publish(db, "t", {})
                app.complete_job(db, stale)
    assert job_state(conn, app, job_id)[0] == "pending"
    assert conn.execute(f"SELECT count(*) FROM {leads}").fetchone()[0] == 0
    assert outbox_rows(conn, app) == []
