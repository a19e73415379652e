"""Enqueue in the caller's transaction, on each supported driver, and its validation."""

from __future__ import annotations

import datetime as dt
import json

import asyncpg
import psycopg
import pytest

import joblane
from joblane import JobSpec, store

from .conftest import count, table


def test_rollback_leaves_no_job_and_commit_makes_one(app, joblane_dsn, conn):
    conn.execute("CREATE TABLE " + table(app, "submissions") + " (id int primary key)")
    with psycopg.connect(joblane_dsn) as c:
        with pytest.raises(RuntimeError):
            with c.transaction():
                c.execute("INSERT INTO " + table(app, "submissions") + " VALUES (1)")
                app.enqueue(c, "enrich", {"submission_id": 1})
                raise RuntimeError("the request failed")
        assert count(conn, app) == 0
        with c.transaction():
            c.execute("INSERT INTO " + table(app, "submissions") + " VALUES (2)")
            job_id = app.enqueue(c, "enrich", {"submission_id": 2})
            # not committed yet: another connection does not see it
            assert count(conn, app) == 0
    assert count(conn, app, "id = %s AND state = 'pending'", (job_id,)) == 1
    assert conn.execute("SELECT count(*) FROM " + table(app, "submissions")).fetchone()[0] == 1


def test_enqueue_never_commits_the_callers_transaction(app, joblane_dsn, conn):
    with psycopg.connect(joblane_dsn) as c:  # not autocommit: a transaction is open
        app.enqueue(c, "k", {})
        app.enqueue_many(c, [("k", {"i": i}) for i in range(3)])
        c.rollback()
    assert count(conn, app) == 0


async def test_enqueue_async_on_asyncpg_and_psycopg(app, joblane_dsn, conn):
    apg = await asyncpg.connect(joblane_dsn)
    try:
        tx = apg.transaction()
        await tx.start()
        await app.enqueue_async(apg, "k", {"driver": "asyncpg"})
        await tx.rollback()
        async with apg.transaction():
            a = await app.enqueue_async(apg, "k", {"driver": "asyncpg"})
            many = await app.enqueue_many_async(apg, [JobSpec("k", {"i": i}) for i in range(10)])
    finally:
        await apg.close()
    async with await psycopg.AsyncConnection.connect(joblane_dsn) as pc:
        b = await app.enqueue_async(pc, "k", {"driver": "psycopg"}, queue="other", priority=-5, delay=60)
        await pc.rollback()
        b = await app.enqueue_async(pc, "k", {"driver": "psycopg"}, queue="other", priority=-5, delay=60)
        await pc.commit()
    rows = dict(conn.execute(f"SELECT id, payload->>'driver' FROM {table(app, 'jobs')} WHERE payload ? 'driver'").fetchall())
    assert rows == {a: "asyncpg", b: "psycopg"}
    assert len(many) == 10
    queue, priority, delayed = conn.execute(
        f"SELECT queue, priority, run_after > now() + interval '50 seconds' FROM {table(app, 'jobs')} WHERE id = %s", (b,)
    ).fetchone()
    assert (queue, priority, delayed) == ("other", -5, True)


def test_enqueue_uses_task_defaults(app, conn):
    @app.task("classify", queue="models", max_attempts=3, priority=2)
    def classify(job):
        return None

    job_id = app.enqueue(conn, "classify", {"x": 1})
    assert conn.execute(f"SELECT queue, max_attempts, priority FROM {table(app, 'jobs')} WHERE id = %s",
                        (job_id,)).fetchone() == ("models", 3, 2)
    other = app.enqueue(conn, "classify", {"x": 1}, queue="models_slow", max_attempts=9, priority=0)
    assert conn.execute(f"SELECT queue, max_attempts, priority FROM {table(app, 'jobs')} WHERE id = %s",
                        (other,)).fetchone() == ("models_slow", 9, 0)


def test_unique_key_keeps_one_unfinished_job(app, conn):
    first = app.enqueue(conn, "sync", {"n": 1}, unique_key="tenant-7")
    again = app.enqueue(conn, "sync", {"n": 2}, unique_key="tenant-7")
    assert again == first
    assert count(conn, app) == 1
    ids = app.enqueue_many(conn, [JobSpec("sync", {"n": 3}, unique_key="tenant-7"), JobSpec("sync", {}, unique_key="tenant-8")])
    assert len(ids) == 1 and count(conn, app) == 2
    # once finished, the key is free again
    conn.execute(f"UPDATE {table(app, 'jobs')} SET state = 'done', finished_at = now() WHERE id = %s", (first,))
    third = app.enqueue(conn, "sync", {"n": 4}, unique_key="tenant-7")
    assert third != first


def test_duplicate_unique_key_does_not_abort_the_callers_transaction(app, joblane_dsn, conn):
    with psycopg.connect(joblane_dsn) as c:
        with c.transaction():
            a = app.enqueue(c, "k", {}, unique_key="u")
            b = app.enqueue(c, "k", {}, unique_key="u")
            c.execute("SELECT 1")  # the transaction is still usable
        assert a == b
    assert count(conn, app) == 1


def test_enqueue_many_is_chunked_not_one_round_trip_per_job(app, conn, monkeypatch):
    calls = []
    real = store.fetch

    def counting(c, stmt):
        calls.append(stmt.name)
        return real(c, stmt)

    monkeypatch.setattr(store, "fetch", counting)
    ids = app.enqueue_many(conn, ({"kind": "bulk", "payload": {"i": i}} for i in range(20_000)))
    assert len(ids) == 20_000 == len(set(ids))
    assert len(calls) == 4  # 5,000 per statement
    assert count(conn, app, "kind = 'bulk'") == 20_000
    payloads = conn.execute(f"SELECT (payload->>'i')::int FROM {table(app, 'jobs')} ORDER BY id").fetchall()
    assert [p[0] for p in payloads] == list(range(20_000))


def test_enqueue_notifies_in_the_same_round_trip(app, joblane_dsn):
    with psycopg.connect(joblane_dsn, autocommit=True) as listener, psycopg.connect(joblane_dsn, autocommit=True) as c:
        listener.execute(f'LISTEN "{app.channel}"')
        app.enqueue(c, "k", {}, queue="fast")
        app.enqueue(c, "k", {}, queue="later", delay=30)  # not ready: no notification
        app.enqueue_many(c, [("k", {}), ("k", {})])
        got = [n.payload for n in listener.notifies(timeout=0.5)]
    assert got == ["fast", "default"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"payload": {"x": object()}}, "not JSON-serialisable"),
        ({"payload": {"x": float("nan")}}, "not JSON-serialisable"),
        ({"payload": {"x": "a\x00b"}}, "NUL"),
        ({"payload": {"x": "y" * 2_000_000}}, "limit"),
        ({"queue": "bad queue"}, "invalid queue name"),
        ({"queue": "x'; DROP TABLE jobs; --"}, "invalid queue name"),
        ({"queue": ""}, "invalid queue name"),
        ({"delay": -1}, "delay must be"),
        ({"delay": float("inf")}, "delay must be"),
        ({"delay": 1e12}, "delay must be"),
        ({"priority": 1_000_000}, "priority must be"),
        ({"max_attempts": 0}, "max_attempts must be"),
        ({"run_after": dt.datetime(2030, 1, 1)}, "timezone-aware"),
        ({"unique_key": ""}, "unique_key"),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(app, conn, kwargs, message):
    payload = kwargs.pop("payload", {})
    with pytest.raises(joblane.JoblaneError, match=message):
        app.enqueue(conn, "k", payload, **kwargs)
    with pytest.raises(joblane.JoblaneError, match=message):
        app.enqueue_many(conn, [JobSpec("k", {"ok": 1}), JobSpec("k", payload, **kwargs)])
    assert count(conn, app) == 0


def test_bad_kind_is_refused(app, conn):
    for kind in ("", None, "a\x00b", "k" * 201):
        with pytest.raises(joblane.JoblaneError):
            app.enqueue(conn, kind, {})
    assert count(conn, app) == 0


def test_wrong_connection_type_gets_a_clear_error(app, joblane_dsn):
    with pytest.raises(joblane.JoblaneError, match="psycopg 3 Connection"):
        app.enqueue(object(), "k", {})


def test_run_after_and_payload_round_trip(app, conn):
    when = dt.datetime(2031, 5, 6, 7, 8, 9, tzinfo=dt.timezone.utc)
    payload = {"nested": {"list": [1, 2.5, None, True]}, "text": "héllo <script>"}
    job_id = app.enqueue(conn, "k", payload, run_after=when)
    job = app.get_job(job_id)
    assert job["payload"] == payload and job["run_after"] == when and job["state"] == "pending"
    assert json.loads(json.dumps(job["payload"])) == payload


def test_notifications_are_debounced_per_queue(app, joblane_dsn):
    app.notify_debounce = 60.0  # a long window: only the first enqueue per queue notifies
    with psycopg.connect(joblane_dsn, autocommit=True) as listener, psycopg.connect(joblane_dsn, autocommit=True) as c:
        listener.execute(f'LISTEN "{app.channel}"')
        for _ in range(5):
            app.enqueue(c, "k", {}, queue="a")
            app.enqueue(c, "k", {}, queue="b")
        got = [n.payload for n in listener.notifies(timeout=0.5)]
    assert got == ["a", "b"]
    with pytest.raises(joblane.JoblaneError):
        joblane.App(joblane_dsn, schema=app.schema, notify_debounce=-1)


async def test_jobs_whose_notification_was_skipped_start_without_waiting_for_the_poll(app, conn):
    """A burst shares one notification; the woken worker's follow-up claim finds the rest."""
    import asyncio
    import time

    from joblane.worker import Worker

    app.notify_debounce = 0.05
    seen = []

    @app.task("burst")
    async def burst(job):
        seen.append(time.monotonic())

    worker = Worker(app, poll_interval=30.0, concurrency=10)  # a poll would take 30 s
    runner = asyncio.create_task(worker.run(install_signals=False))
    await worker.started.wait()
    await asyncio.sleep(0.3)  # listening, idle
    started = time.monotonic()
    for i in range(5):
        await asyncio.to_thread(app.enqueue, conn, "burst", {"i": i})
    for _ in range(200):
        if len(seen) == 5:
            break
        await asyncio.sleep(0.05)
    worker.request_stop()
    await runner
    assert len(seen) == 5
    assert max(seen) - started < 10, "the burst waited for the 30 s poll"
