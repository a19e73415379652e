"""enqueue_many's three statements (alike, varied, unique), the typed bulk form, and the wake-up they send.

tests/test_enqueue.py covers the single enqueue and the common checks; this
file checks that every column arrives as given whichever statement carries
it, that ids come back in order, and that a bad job is named and writes
nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import re

import asyncpg
import psycopg
import pytest

import joblane
from joblane import JobSpec, store
from joblane.enqueue import CHUNK

from .conftest import count, table

UTC = dt.timezone.utc
COLUMNS = "id, queue, kind, payload, priority, max_attempts, state, unique_key, run_after"


def rows(conn, app, ids):
    got = conn.execute(f"SELECT {COLUMNS}, run_after - created_at FROM {table(app, 'jobs')} WHERE id = ANY(%s)",
                       (list(ids),)).fetchall()
    return {r[0]: r[1:] for r in got}


def statements(monkeypatch, runner="fetch"):
    """The names of the statements the store runs from now on."""
    names: list[str] = []
    real = getattr(store, runner)

    if runner == "fetch":
        def spy(conn, stmt):
            names.append(stmt.name)
            return real(conn, stmt)
    else:
        async def spy(conn, stmt):
            names.append(stmt.name)
            return await real(conn, stmt)
    monkeypatch.setattr(store, runner, spy)
    return names


@pytest.fixture
def tasks(app):
    @app.task("mail", queue="mail", priority=3, max_attempts=4)
    def mail(job):
        return None

    @app.task("report", queue="reports")
    def report(job):
        return None

    return mail, report


def test_jobs_of_one_task_take_the_alike_statement_and_keep_their_order(app, conn, tasks, monkeypatch):
    names = statements(monkeypatch)
    ids = app.enqueue_many(conn, [("mail", {"i": i}) for i in range(1000)] )
    assert names == ["enqueue_many"]
    assert ids == sorted(ids) and len(set(ids)) == 1000
    got = rows(conn, app, ids)
    for i, job_id in enumerate(ids):
        queue, kind, payload, priority, max_attempts, state, key, _, waited = got[job_id]
        assert (queue, kind, payload, priority, max_attempts, state, key) == ("mail", "mail", {"i": i}, 3, 4,
                                                                               "pending", None)
        assert waited == dt.timedelta(0)  # run_after is now()


def test_each_form_of_a_plain_job_is_the_same_job(app, conn, tasks, monkeypatch):
    names = statements(monkeypatch)
    ids = app.enqueue_many(conn, [("mail", {"a": 1}), {"kind": "mail", "payload": {"a": 1}}, JobSpec("mail", {"a": 1}),
                                  ("mail", None), {"kind": "mail"}])
    assert names == ["enqueue_many"]
    got = rows(conn, app, ids)
    assert [got[i][2] for i in ids] == [{"a": 1}] * 3 + [{}] * 2


def test_differing_columns_take_the_varied_statement(app, conn, tasks, monkeypatch):
    names = statements(monkeypatch)
    when = dt.datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    jobs = [
        ("mail", {"n": 0}),
        ("report", {"n": 1}),
        JobSpec("mail", {"n": 2}, queue="other", priority=-7, max_attempts=99),
        JobSpec("report", {"n": 3}, run_after=when),
        JobSpec("mail", {"n": 4}, delay=3600),
        JobSpec("report", {"n": 5}, held=True),
        {"kind": "mail", "payload": {"n": 6}, "priority": 5},
    ]
    ids = app.enqueue_many(conn, jobs)
    assert names == ["enqueue_many_varied"]
    assert ids == sorted(ids) and len(ids) == 7
    got = rows(conn, app, ids)
    by_n = {got[i][2]["n"]: got[i] for i in ids}
    assert [got[i][2]["n"] for i in ids] == list(range(7))
    assert by_n[0][:6] == ("mail", "mail", {"n": 0}, 3, 4, "pending")
    assert by_n[1][:6] == ("reports", "report", {"n": 1}, 0, 10, "pending")
    assert by_n[2][:6] == ("other", "mail", {"n": 2}, -7, 99, "pending")
    assert by_n[3][7] == when  # exact to the microsecond
    assert dt.timedelta(minutes=59) < by_n[4][8] <= dt.timedelta(hours=1, seconds=1)
    assert by_n[5][5] == "held"
    assert by_n[6][3] == 5


async def test_options_all_the_jobs_share_travel_once_on_every_driver(app, joblane_dsn, conn, monkeypatch):
    when = dt.datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    names = statements(monkeypatch)
    ids = app.enqueue_many(conn, [JobSpec("k", {"n": n}, run_after=when, priority=2) for n in range(3)])
    ids += app.enqueue_many(conn, [JobSpec("k", {"n": n}, delay=dt.timedelta(hours=1)) for n in range(3, 5)])
    assert names == ["enqueue_many"] * 2
    async_names = statements(monkeypatch, "fetch_async")
    apg = await asyncpg.connect(joblane_dsn)
    try:
        ids += await app.enqueue_many_async(apg, [JobSpec("k", {"n": n}, run_after=when, priority=2)
                                                  for n in range(5, 7)])
    finally:
        await apg.close()
    assert async_names == ["enqueue_many"]
    got = rows(conn, app, ids)
    assert [got[i][2]["n"] for i in ids] == list(range(7))
    assert {got[i][7] for i in ids[:3] + ids[5:]} == {when} and {got[i][3] for i in ids[:3]} == {2}
    assert all(dt.timedelta(minutes=59) < got[i][8] <= dt.timedelta(hours=1, seconds=1) for i in ids[3:5])


def test_unique_keys_take_the_unique_statement_and_skip_what_an_unfinished_job_holds(app, conn, monkeypatch):
    held = app.enqueue(conn, "sync", {"first": True}, unique_key="tenant-1")
    names = statements(monkeypatch)
    jobs = [JobSpec("sync", {"n": n}, unique_key=f"tenant-{n}") for n in range(5)] + [("sync", {"n": 5})]
    ids = app.enqueue_many(conn, jobs)
    assert names == ["enqueue_many_unique"]
    assert len(ids) == 5 and held not in ids  # tenant-1 was taken
    got = rows(conn, app, ids)
    assert [got[i][2]["n"] for i in ids] == [0, 2, 3, 4, 5]
    assert [got[i][6] for i in ids] == ["tenant-0", "tenant-2", "tenant-3", "tenant-4", None]
    # a key repeated within the batch keeps the first
    again = app.enqueue_many(conn, [JobSpec("sync", {"r": 1}, unique_key="dup"), JobSpec("sync", {"r": 2}, unique_key="dup")])
    assert len(again) == 1 and rows(conn, app, again)[again[0]][2] == {"r": 1}


def test_the_typed_bulk_form_shares_its_options(app, conn, monkeypatch):
    @app.task("resize", queue="images", priority=1)
    def resize(job):
        return None

    names = statements(monkeypatch)
    ids = resize.enqueue_many(conn, [{"img": i} for i in range(3)])
    later = resize.enqueue_many(conn, ({"img": i} for i in range(3, 5)), queue="slow", delay=60, max_attempts=2)
    parked = resize.enqueue_many(conn, [None], held=True)
    assert names == ["enqueue_many"] * 3
    got = rows(conn, app, ids + later + parked)
    assert [got[i][:6] for i in ids] == [("images", "resize", {"img": i}, 1, 10, "pending") for i in range(3)]
    assert [got[i][:6] for i in later] == [("slow", "resize", {"img": i}, 1, 2, "pending") for i in (3, 4)]
    assert all(got[i][8] >= dt.timedelta(seconds=59) for i in later)
    assert got[parked[0]][2:6:3] == ({}, "held")
    assert resize.enqueue_many(conn, []) == []
    with pytest.raises(joblane.JoblaneError, match=r"^payloads\[1\]: payload contains a NUL"):
        resize.enqueue_many(conn, [{"ok": 1}, {"x": "\x00"}])
    with pytest.raises(joblane.JoblaneError, match=r"^payloads\[2\]: payload is not JSON-serialisable: Circular"):
        resize.enqueue_many(conn, [{"ok": 1}, {"ok": 2}, CIRCULAR])
    with pytest.raises(joblane.JoblaneError, match="invalid queue name"):
        resize.enqueue_many(conn, [{"ok": 1}], queue="no such queue")
    with pytest.raises(TypeError):
        resize.enqueue_many(conn, [{"ok": 1}], unique_key="k")  # one key for many jobs means nothing
    assert count(conn, app) == 6


CIRCULAR: dict = {}
CIRCULAR["self"] = CIRCULAR  # the bulk encoder keeps no table of containers: to_json names this one


@pytest.mark.parametrize("bad, message", [
    (("k", {"x": "\x00"}), "payload contains a NUL"),
    (("k", CIRCULAR), "payload is not JSON-serialisable: Circular reference detected"),
    (("k", {"x": float("nan")}), "payload is not JSON-serialisable"),
    (JobSpec("k", {}, queue="bad queue"), "invalid queue name"),
    (JobSpec("k", {}, unique_key=""), "unique_key must be"),
    (("", {}), "task kind must be"),
    (42, "enqueue_many takes JobSpec"),
])
def test_a_bad_job_is_named_by_its_index_and_nothing_is_written(app, conn, bad, message):
    jobs = [("k", {"i": i}) for i in range(CHUNK + 7)]
    jobs.insert(CHUNK + 3, bad)  # in the second chunk: the first must not have been sent either
    with pytest.raises(joblane.JoblaneError, match=rf"^jobs\[{CHUNK + 3}\]: {message}"):
        app.enqueue_many(conn, jobs)
    assert count(conn, app) == 0


def test_payloads_over_the_limit_together_but_not_alone_are_accepted(joblane_dsn, joblane_schema, conn):
    small = joblane.App(joblane_dsn, schema=joblane_schema, max_payload_bytes=100)
    fits = {"x": "y" * (100 - len('{"x":""}'))}
    ids = small.enqueue_many(conn, [("k", fits)] * 50)  # 5 KB of JSON in all, each payload exactly 100 bytes
    assert len(ids) == 50
    with pytest.raises(joblane.JoblaneError, match=r"^jobs\[49\]: payload is 101 bytes"):
        small.enqueue_many(conn, [("k", fits)] * 49 + [("k", {"x": "y" * 93})])
    assert count(conn, small) == 50


def test_text_the_server_would_refuse_is_caught_in_a_batch(app, conn):
    payload = {"emoji": "😀", "escaped": "\\u0000 is text", "rtl": "\u202e"}
    ids = app.enqueue_many(conn, [("k", payload)] * 3)
    assert [app.get_job(i, conn)["payload"] for i in ids] == [payload] * 3
    with pytest.raises(joblane.JoblaneError, match=r"^jobs\[2\]: payload contains a lone surrogate"):
        app.enqueue_many(conn, [("k", payload), ("k", payload), ("k", {"x": "\ud800"})])
    assert count(conn, app) == 3


async def test_every_statement_on_asyncpg_and_psycopg_async(app, joblane_dsn, conn, monkeypatch):
    names = statements(monkeypatch, "fetch_async")
    batches = [
        [("k", {"i": i}) for i in range(3)],
        [("k", {"i": 0}), JobSpec("k", {"i": 1}, priority=2)],
        [JobSpec("k", {"i": 0}, unique_key="a"), JobSpec("k", {"i": 1}, unique_key="a")],
    ]
    got = []
    apg = await asyncpg.connect(joblane_dsn)
    try:
        async with apg.transaction():
            for jobs in batches:
                got.append(await app.enqueue_many_async(apg, jobs))
    finally:
        await apg.close()
    async with await psycopg.AsyncConnection.connect(joblane_dsn) as pc:
        for jobs in batches[:2]:
            got.append(await app.enqueue_many_async(pc, jobs))
        got.append(await app.enqueue_many_async(pc, [JobSpec("k", {}, unique_key="b")]))
        await pc.commit()
    assert names == ["enqueue_many", "enqueue_many_varied", "enqueue_many_unique"] * 2
    assert [len(ids) for ids in got] == [3, 2, 1, 3, 2, 1]
    assert count(conn, app) == 12
    assert conn.execute(f"SELECT count(*) FROM {table(app, 'jobs')} WHERE priority = 2").fetchone()[0] == 2


def test_a_duplicate_key_does_not_abort_the_callers_transaction(app, joblane_dsn, conn):
    with psycopg.connect(joblane_dsn) as c, c.transaction():
        first = app.enqueue_many(c, [JobSpec("k", {}, unique_key="u")])
        assert app.enqueue_many(c, [JobSpec("k", {}, unique_key="u")]) == []
        c.execute("SELECT 1")
    assert count(conn, app) == 1 and len(first) == 1


# -- the wake-up costs bulk enqueue nothing: one notification per queue per statement ------------------


def test_a_statement_of_5000_jobs_in_two_queues_sends_one_notification_per_queue(app, joblane_dsn):
    app.notify_debounce = 0  # every statement may notify
    jobs = [JobSpec("k", {"i": i}, queue="qa" if i % 2 else "qb") for i in range(5000)]
    with psycopg.connect(joblane_dsn, autocommit=True) as listener, \
            psycopg.connect(joblane_dsn, autocommit=True) as c:
        listener.execute(f'LISTEN "{app.channel}"')
        ids = app.enqueue_many(c, jobs)  # one statement (CHUNK is 5,000), one transaction
        first = sorted(n.payload for n in listener.notifies(timeout=0.5))
        app.enqueue_many(c, jobs * 3)  # three statements, autocommit: three transactions
        more = sorted(n.payload for n in listener.notifies(timeout=0.5))
    assert len(ids) == 5000
    assert first == ["qa", "qb"]
    assert more == ["qa"] * 3 + ["qb"] * 3


def actual(line: str) -> tuple[float, int] | None:
    """(rows, loops) of an EXPLAIN ANALYZE line: PostgreSQL 18 prints the rows as 2000.00, earlier ones 2000."""
    found = re.search(r"actual rows=(\d+(?:\.\d+)?) loops=(\d+)", line)
    return (float(found[1]), int(found[2])) if found else None


@pytest.mark.parametrize("jobs", [
    [("k", {"i": i}) for i in range(2000)],
    [JobSpec("k", {"i": i}, queue=f"q{i % 2}") for i in range(2000)],
    [JobSpec("k", {"i": i}, queue=f"q{i % 2}", unique_key=str(i)) for i in range(2000)],
], ids=["alike", "varied", "unique"])
def test_the_notifications_run_once_per_statement_not_once_per_row(app, conn, jobs):
    """PostgreSQL folds repeated notifications of a transaction, so a listener cannot tell: the plan can.

    The pg_notify calls sit in an init plan that runs once (loops=1) and
    returns one row per queue, however many rows the statement inserts.
    """
    from joblane.enqueue import chunks, statement

    app.notify_debounce = 0
    [chunk] = chunks(app, jobs)
    stmt = statement(app, chunk)
    with conn.transaction():
        with psycopg.RawCursor(conn) as cur:
            cur.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + stmt.sql, stmt.args, prepare=False)
            plan = "\n".join(r[0] for r in cur.fetchall())
        raise psycopg.Rollback()  # the rows EXPLAIN ANALYZE inserted, and the notifications
    lines = plan.splitlines()
    notify = [line for line in lines if "Function Scan on unnest q" in line]
    assert len(notify) == 1 and "InitPlan" in plan, plan
    assert actual(notify[0]) == (len(chunk.wake), 1), plan
    assert (2000, 1) in [actual(line) for line in lines], plan
    assert count(conn, app) == 0
