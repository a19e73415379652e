"""Rescue, pruning, heartbeats, cancellation and retry: fabricated aftermaths and live workers."""

from __future__ import annotations

import asyncio
import json
import uuid

import asyncpg
import psycopg
import pytest

import joblane
from joblane.maintenance import Pruner, Rescuer, Vacuumer
from joblane.maintenance import vacuumer as vacuumer_module
from joblane.store import outcome_rows
from joblane.types import Outcome
from joblane.testing import drain
from joblane.worker import Worker

from .conftest import count, table, wait_until
from .helpers import run_sql


def fabricate(conn, app, *, state="running", attempts=1, max_attempts=5, lease="- interval '1 minute'",
              finished=None) -> int:
    lease_sql = f"now() {lease}" if state == "running" else "NULL"
    worker = "'dead-host:1'" if state == "running" else "NULL"
    finished_sql = f"now() - interval '{finished}'" if finished else "NULL"
    return conn.execute(
        f"INSERT INTO {table(app, 'jobs')} (kind, state, attempts, max_attempts, lease_until, worker, finished_at)"
        f" VALUES ('k', %s, %s, %s, {lease_sql}, {worker}, {finished_sql}) RETURNING id",
        (state, attempts, max_attempts),
    ).fetchone()[0]


async def test_rescuer_returns_expired_leases_only(app, conn, joblane_dsn):
    expired = fabricate(conn, app, attempts=1)
    spent = fabricate(conn, app, attempts=5, max_attempts=5)
    alive = fabricate(conn, app, lease="+ interval '1 minute'")
    rescuer = Rescuer(app.store, interval=1)
    c = await asyncpg.connect(joblane_dsn)
    try:
        rescued = dict(await rescuer.run_once(c))
        assert rescued == {expired: "pending", spent: "failed"}
        assert await rescuer.run_once(c) == []
    finally:
        await c.close()
    rows = dict((r[0], r[1:]) for r in conn.execute(
        f"SELECT id, state, lease_until IS NULL, worker, last_error FROM {table(app, 'jobs')}").fetchall())
    assert rows[expired][:3] == ("pending", True, None)
    assert "dead-host:1 was lost during attempt 1" in rows[expired][3]
    assert rows[spent][0] == "failed"
    assert rows[alive][0] == "running"
    lost = conn.execute(f"SELECT job_id, attempt, outcome, worker FROM {table(app, 'attempts')} ORDER BY job_id").fetchall()
    assert lost == [(expired, 1, "lost", "dead-host:1"), (spent, 5, "lost", "dead-host:1")]


async def test_only_one_rescuer_works_at_a_time(app, conn, joblane_dsn):
    fabricate(conn, app)
    rescuer = Rescuer(app.store, interval=1)
    a, b = await asyncpg.connect(joblane_dsn), await asyncpg.connect(joblane_dsn)
    try:
        async with a.transaction():
            await a.fetchval(app.queries.try_service_lock, rescuer.lock)
            assert await rescuer.run_once(b) is None  # a holds the lock
        assert len(await rescuer.run_once(b)) == 1
    finally:
        await a.close()
        await b.close()


async def test_pruner_deletes_old_finished_jobs_and_their_attempts(app, conn, joblane_dsn):
    old_done = fabricate(conn, app, state="done", finished="8 days")
    old_failed = fabricate(conn, app, state="failed", finished="8 days")
    new_done = fabricate(conn, app, state="done", finished="1 hour")
    pending = fabricate(conn, app, state="pending")
    conn.execute(f"INSERT INTO {table(app, 'attempts')} (job_id, attempt, outcome) VALUES (%s, 1, 'done'), (%s, 1, 'done')",
                 (old_done, new_done))
    c = await asyncpg.connect(joblane_dsn)
    try:
        assert await Pruner(app.store, retention=7 * 86400).run_once(c) == [old_done]
        left = {r[0] for r in conn.execute(f"SELECT id FROM {table(app, 'jobs')}").fetchall()}
        assert left == {old_failed, new_done, pending}
        assert conn.execute(f"SELECT job_id FROM {table(app, 'attempts')}").fetchall() == [(new_done,)]
        assert await Pruner(app.store, retention=86400, prune_failed=True).run_once(c) == [old_failed]
    finally:
        await c.close()
    with pytest.raises(ValueError):
        Pruner(app.store, retention=-1)


def dead_rows(conn, app, name: str) -> tuple[int, bool]:
    """Dead row versions of a joblane table and whether a vacuum has run on it, from the statistics."""
    return conn.execute("SELECT n_dead_tup, last_vacuum IS NOT NULL FROM pg_stat_all_tables WHERE relid = %s::regclass",
                        (table(app, name),)).fetchone()


async def test_the_vacuumer_vacuums_a_table_once_its_dead_rows_pile_up(app, conn, joblane_dsn):
    ids = [fabricate(conn, app, state="pending") for _ in range(300)]
    c = await asyncpg.connect(joblane_dsn)
    try:
        vacuumer = Vacuumer(app.store, tables=("jobs", "outbox"), interval=30, min_dead=250)
        assert await vacuumer.run_once(c) == []  # no dead rows yet
        with conn.transaction():  # a claim and a completion each leave a dead version of the row
            conn.execute(f"UPDATE {table(app, 'jobs')} SET state = 'done', finished_at = now() WHERE id = ANY(%s)", (ids,))
            conn.execute("SELECT pg_stat_force_next_flush()")
        assert dead_rows(conn, app, "jobs") == (300, False)
        assert await vacuumer.run_once(c) == [("jobs", 300)]
        assert dead_rows(conn, app, "jobs") == (0, True)
        # vacuumed within the interval: not again, however many dead rows come meanwhile
        with conn.transaction():
            conn.execute(f"UPDATE {table(app, 'jobs')} SET priority = 1 WHERE id = ANY(%s)", (ids,))
            conn.execute("SELECT pg_stat_force_next_flush()")
        assert dead_rows(conn, app, "jobs")[0] == 300
        assert await vacuumer.run_once(c) == []
        assert await Vacuumer(app.store, tables=("jobs",), interval=0.001, min_dead=250).run_once(c) == [("jobs", 300)]
        assert count(conn, app) == 300  # a vacuum removes dead versions only
    finally:
        await c.close()
    for bad in ({"tables": ()}, {"tables": ("attempts",)}, {"tables": ("jobs",), "min_dead": 0},
                {"tables": ("jobs",), "interval": 0}):
        with pytest.raises(ValueError):
            Vacuumer(app.store, **bad)


async def test_the_vacuumer_stops_while_a_session_holds_the_horizon_and_names_it(app, conn, joblane_dsn, caplog):
    """A session idle in a REPEATABLE READ transaction: vacuum can remove nothing, so the vacuumer says who
    holds the horizon (pid, application, age, query), stops vacuuming, and starts again once it ends;
    status --health names the same session."""
    ids = [fabricate(conn, app, state="pending") for _ in range(300)]
    holder = psycopg.connect(joblane_dsn, application_name="nightly report")
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute(f"SELECT count(*) FROM {table(app, 'jobs')}").fetchone()  # takes its snapshot
    pid = holder.info.backend_pid
    c = await asyncpg.connect(joblane_dsn)
    try:
        await asyncio.sleep(vacuumer_module.HELD_SECONDS)  # a younger snapshot is ordinary traffic
        vacuumer = Vacuumer(app.store, tables=("jobs",), interval=0.001, check=0.001, min_dead=250)
        with conn.transaction():
            conn.execute(f"UPDATE {table(app, 'jobs')} SET priority = 1 WHERE id = ANY(%s)", (ids,))
            conn.execute("SELECT pg_stat_force_next_flush()")
        with caplog.at_level("INFO", logger="joblane"):
            assert await vacuumer.run_once(c) == [("jobs", 300)]  # it tried once, and removed nothing
            assert vacuumer.futile == 1 and vacuumer.blocked["jobs"]["who"] == str(pid)
            said = [r.getMessage() for r in caplog.records if "holds back the horizon" in r.getMessage()]
            assert len(said) == 1 and f"session pid {pid} (nightly report" in said[0], said
            assert "idle in transaction" in said[0] and "SELECT count(*)" in said[0]
            for _ in range(3):  # no vacuum while the session holds it
                assert await vacuumer.run_once(c) == []
            health = joblane.admin.health(app, conn)
            assert health["horizon"]["who"] == str(pid)
            holder.rollback()  # the report ends
            assert await vacuumer.run_once(c) == [("jobs", 300)]
            assert "jobs" not in vacuumer.blocked
            assert any("horizon moved on (session pid" in r.getMessage() for r in caplog.records)
        assert dead_rows(conn, app, "jobs") == (0, True)
    finally:
        holder.close()
        await c.close()


async def test_the_pruner_waits_while_a_session_holds_the_horizon(app, conn, joblane_dsn, caplog):
    """Deleting under a held horizon only makes dead rows no vacuum can remove: the pruner names the holder
    and waits, then deletes once it ends."""
    old = [fabricate(conn, app, state="done", finished="2 hours") for _ in range(20)]
    holder = psycopg.connect(joblane_dsn, application_name="weekly export")
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT 1").fetchone()
    c = await asyncpg.connect(joblane_dsn)
    try:
        pruner = Pruner(app.store, retention=3600)
        pruner.horizon_pause = 0.0  # as if the session had held it for a minute
        with caplog.at_level("INFO", logger="joblane"):
            assert await pruner.run_once(c) == []
            assert count(conn, app, "id = ANY(%s)", (old,)) == 20
            said = [r.getMessage() for r in caplog.records if "deleting waits until it ends" in r.getMessage()]
            assert len(said) == 1 and f"session pid {holder.info.backend_pid} (weekly export" in said[0]
            holder.rollback()
            assert sorted(await pruner.run_once(c)) == sorted(old)
            assert any("deleting again" in r.getMessage() for r in caplog.records)
    finally:
        holder.close()
        await c.close()


def test_status_health_names_the_session_that_holds_the_horizon(app, conn, joblane_dsn):
    from joblane import admin

    holder = psycopg.connect(joblane_dsn, application_name="forgotten psql")
    try:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 42").fetchone()
        backdated = admin.OLD_TRANSACTION_SECONDS
        admin.OLD_TRANSACTION_SECONDS = -1  # as if it had been open for longer than five minutes
        try:
            warnings = admin.health(app, conn)["warnings"]
        finally:
            admin.OLD_TRANSACTION_SECONDS = backdated
        [warning] = [w for w in warnings if "holds back vacuum's horizon" in w]
        assert warning.startswith(f"session pid {holder.info.backend_pid} (forgotten psql, user ")
        assert "idle in transaction for" in warning and "SELECT 42" in warning
    finally:
        holder.close()


async def test_the_vacuumer_comes_back_as_soon_as_its_vacuums_can_afford(app, conn, joblane_dsn):
    """The wait after a vacuum is its duration over ``share``, within [check, interval]: a quick vacuum of a
    busy table is followed by the next within seconds, however long the interval; a slow one is not."""
    ids = [fabricate(conn, app, state="pending") for _ in range(300)]

    def churn(priority: int) -> None:  # a dead version of every row, as claims and completions leave
        with conn.transaction():
            conn.execute(f"UPDATE {table(app, 'jobs')} SET priority = %s WHERE id = ANY(%s)", (priority, ids))
            conn.execute("SELECT pg_stat_force_next_flush()")

    c = await asyncpg.connect(joblane_dsn)
    try:
        vacuumer = Vacuumer(app.store, tables=("jobs",), interval=3600, min_dead=250, check=0.2, share=0.5)
        assert vacuumer.interval == 0.2  # a look at the statistics every check
        assert vacuumer.wait("jobs") == 3600  # nothing measured yet: the whole interval, as autovacuum's last pass
        churn(1)
        assert await vacuumer.run_once(c) == [("jobs", 300)]  # never vacuumed: due
        took = vacuumer.took["jobs"]
        assert vacuumer.wait("jobs") == max(0.2, took / 0.5) < 3600
        churn(2)
        assert await vacuumer.run_once(c) == []  # just vacuumed
        await asyncio.sleep(vacuumer.wait("jobs") + 0.05)
        assert await vacuumer.run_once(c) == [("jobs", 300)]  # an hour's interval, yet due again
        assert dead_rows(conn, app, "jobs") == (0, True)
        # a vacuum that took long keeps the table waiting in proportion (here: the whole interval)
        vacuumer.took["jobs"] = 3600.0
        churn(3)
        await asyncio.sleep(0.3)
        assert await vacuumer.run_once(c) == []
        assert dead_rows(conn, app, "jobs")[0] == 300
    finally:
        await c.close()
    for bad in ({"check": 0}, {"share": 0}, {"share": 1.5}):
        with pytest.raises(ValueError):
            Vacuumer(app.store, tables=("jobs",), **bad)


async def test_the_vacuumer_leaves_tables_it_does_not_own_to_autovacuum(app, conn, joblane_dsn):
    ids = [fabricate(conn, app, state="pending") for _ in range(50)]
    with conn.transaction():
        conn.execute(f"UPDATE {table(app, 'jobs')} SET state = 'done', finished_at = now() WHERE id = ANY(%s)", (ids,))
        conn.execute("SELECT pg_stat_force_next_flush()")
    role = f"jl_vacuum_{uuid.uuid4().hex[:10]}"
    conn.execute(f'CREATE ROLE "{role}" NOLOGIN')
    c = await asyncpg.connect(joblane_dsn)
    try:
        await c.execute(f'SET ROLE "{role}"')
        assert await Vacuumer(app.store, tables=("jobs",), interval=0.001, min_dead=10).run_once(c) == []
    finally:
        await c.close()
        conn.execute(f'DROP ROLE "{role}"')
    assert dead_rows(conn, app, "jobs") == (50, False)


def test_the_vacuumers_look_reads_only_its_own_tables(app, conn):
    """vacuum_due runs every second: it reads the statistics of its tables, not pg_stat_all_tables, which
    computes every table of the database (a sum of index scans per table) whatever the filter."""
    stmt = app.store.vacuum_due(["jobs", "outbox"], 1, 1.0)
    plan = "\n".join(r[0] for r in run_sql(conn, "EXPLAIN " + stmt.sql, stmt.args))
    assert "pg_index" not in plan and "Aggregate" not in plan, plan
    conn.execute(f"CREATE TABLE {table(app, 'unrelated')} (id int)")  # another table of the schema: not asked
    fabricate(conn, app, state="pending")
    with conn.transaction():
        conn.execute(f"DELETE FROM {table(app, 'jobs')}")
        conn.execute(f"DELETE FROM {table(app, 'outbox')}")
        conn.execute("SELECT pg_stat_force_next_flush()")
    assert [r[:2] for r in run_sql(conn, stmt.sql, stmt.args)] == [("jobs", 1)]


async def test_heartbeat_keeps_a_long_task_leased(app, conn):
    """A task running three leases long is not rescued: its worker heartbeats."""

    @app.task("long")
    async def long(job):
        await asyncio.sleep(3.5)
        return "finished"

    job_id = app.enqueue(conn, "long", {})
    stats = await drain(app, lease_seconds=1.0, heartbeat_seconds=0.25, rescue_interval=0.2, timeout=20)
    assert stats == {"done": 1}
    assert conn.execute(f"SELECT state, attempts FROM {table(app, 'jobs')} WHERE id = %s", (job_id,)).fetchone() == ("done", 1)
    assert conn.execute(f"SELECT count(*) FROM {table(app, 'attempts')} WHERE outcome = 'lost'").fetchone()[0] == 0


async def test_cancelling_a_running_job_stops_its_task(app, conn):
    started, stopped = asyncio.Event(), asyncio.Event()

    @app.task("forever")
    async def forever(job):
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            stopped.set()
            raise

    job_id = app.enqueue(conn, "forever", {})
    worker = Worker(app, lease_seconds=2, heartbeat_seconds=0.2, listen=False, poll_interval=0.05)
    runner = asyncio.create_task(worker.run(install_signals=False))
    await asyncio.wait_for(started.wait(), 10)
    assert await asyncio.to_thread(app.cancel, ids=[job_id], reason="not needed any more") == [job_id]
    await asyncio.wait_for(stopped.wait(), 5)
    worker.request_stop()
    await runner
    state, last_error = conn.execute(f"SELECT state, last_error FROM {table(app, 'jobs')} WHERE id = %s", (job_id,)).fetchone()
    assert (state, last_error) == ("cancelled", "not needed any more")
    # the try's row keeps the worker that ran it and when it started; the operator is in meta
    who, started_at, finished_at, meta = conn.execute(
        f"SELECT worker, started_at, finished_at, meta FROM {table(app, 'attempts')} WHERE job_id = %s",
        (job_id,)).fetchone()
    assert who == worker.name and started_at < finished_at and "@" in meta["cancelled_by"]


async def test_the_maintenance_services_begin_after_the_first_claim(app, conn):
    """A worker's first claim runs alone: its services' first rounds come after it, and still come
    (a crashed worker's expired job is rescued); a worker stopped before it claims stops all the same."""

    @app.task("k")
    async def k(job):
        return None

    app.enqueue_many(conn, [joblane.JobSpec("k", {"i": i}) for i in range(50)])
    lost = app.enqueue(conn, "k", {"lost": True})
    conn.execute(f"UPDATE {table(app, 'jobs')} SET state = 'running', attempts = 1, worker = 'gone',"
                 " lease_until = now() - interval '1 second' WHERE id = %s", (lost,))
    order: list[str] = []
    worker = Worker(app, concurrency=10, listen=False, poll_interval=0.05, rescue_interval=0.1)

    def record(name, fn):
        async def recorded(*args, **kwargs):
            result = await fn(*args, **kwargs)
            order.append(name)
            return result
        return recorded

    worker.producer.claim = record("claim", worker.producer.claim)
    for service in (worker.rescuer, worker.pruner, worker.history):
        service.run_once = record(service.name, service.run_once)
    runner = asyncio.create_task(worker.run(install_signals=False))
    await asyncio.wait_for(asyncio.to_thread(
        lambda: wait_until(lambda: count(conn, app, "state = 'done'") == 51, timeout=20, message="all done")), 30)
    worker.request_stop()
    await runner
    assert order[0] == "claim" and {"rescuer", "pruner", "history"} <= set(order), order
    # stopped before anything ran: no claim, no service round, and run() returns
    idle = Worker(app, concurrency=1, listen=False)
    idle.rescuer.run_once = record("late rescuer", idle.rescuer.run_once)
    idle.request_stop()
    await asyncio.wait_for(idle.run(install_signals=False), 30)
    assert "late rescuer" not in order


async def test_late_outcome_does_not_clobber_a_rescued_job(app, conn, joblane_dsn):
    """A worker whose job was rescued and re-claimed elsewhere cannot overwrite it."""
    job_id = app.enqueue(conn, "k", {})
    c = await asyncpg.connect(joblane_dsn)
    try:
        [row] = await c.fetch(app.queries.claim_jobs, ["default"], 1, "slow-worker", 30.0)
        conn.execute(f"UPDATE {table(app, 'jobs')} SET lease_until = now() - interval '1 second' WHERE id = %s", (job_id,))
        await Rescuer(app.store, interval=1).run_once(c)
        [again] = await c.fetch(app.queries.claim_jobs, ["default"], 1, "other-worker", 30.0)
        assert again["id"] == job_id and again["attempts"] == 2
        late = Outcome.done(job_id, 1)
        applied = await c.fetch(app.queries.complete_jobs, outcome_rows([late]), "slow-worker")
        assert applied == []
        # nor delete it, when the task is lean; the worker holding it now can
        assert await c.fetch(app.queries.delete_done, [job_id], [1], "slow-worker") == []
        assert await c.fetch(app.queries.delete_done, [job_id], [1], "other-worker") == [], "wrong try"
    finally:
        await c.close()
    assert conn.execute(f"SELECT state, worker FROM {table(app, 'jobs')} WHERE id = %s", (job_id,)).fetchone() == (
        "running", "other-worker")
    c = await asyncpg.connect(joblane_dsn)
    try:
        assert [r["id"] for r in await c.fetch(app.queries.delete_done, [job_id], [2], "other-worker")] == [job_id]
    finally:
        await c.close()
    assert count(conn, app, f"id = {job_id}") == 0


async def test_a_lean_completion_deletes_plain_jobs_and_sets_linked_ones_done(app, conn, joblane_dsn):
    """delete_done on one batch: plain jobs go with their steps and earlier tries; a job others wait for, and a
    batch member, are set done instead (its child released, the batch counted); another worker's job stays."""
    plain, retried, parent, other = (app.enqueue(conn, "k", {"n": n}) for n in range(4))
    child = app.enqueue(conn, "k", {"child": True}, after=[parent])
    batch = app.batch(conn)
    member = batch.enqueue(conn, "k", {"n": 4})
    batch.seal(conn)
    c = await asyncpg.connect(joblane_dsn)
    try:
        claimed = {r["id"] for r in await c.fetch(app.queries.claim_jobs, ["default"], 10, "w", 30.0)}
        assert claimed == {plain, retried, parent, other, member}
        jobs = table(app, "jobs")
        conn.execute(f"UPDATE {jobs} SET attempts = 2 WHERE id = %s", (retried,))
        conn.execute(f"INSERT INTO {table(app, 'attempts')} (job_id, attempt, outcome) VALUES (%s, 1, 'retry')",
                     (retried,))
        conn.execute(f"INSERT INTO {table(app, 'job_steps')} (job_id, name, attempt, result)"
                     " VALUES (%s, 'fetch', 1, '{}'), (%s, 'fetch', 1, '{}')", (plain, parent))
        conn.execute(f"UPDATE {jobs} SET worker = 'v' WHERE id = %s", (other,))
        ids = [plain, retried, parent, member, other]
        finished = await c.fetch(app.queries.delete_done, ids, [1, 2, 1, 1, 1], "w")
    finally:
        await c.close()
    assert sorted(r["id"] for r in finished) == sorted([plain, retried, parent, member])
    states = dict(conn.execute(f"SELECT id, state FROM {jobs} WHERE id = ANY(%s)", (ids + [child],)).fetchall())
    assert states == {parent: "done", member: "done", other: "running", child: "pending"}
    assert count(conn, app, "true") == 4
    steps = conn.execute(f"SELECT job_id FROM {table(app, 'job_steps')}").fetchall()
    assert steps == [(parent,)], "the deleted job's steps went with it; the kept job keeps its own"
    assert conn.execute(f"SELECT count(*) FROM {table(app, 'attempts')}").fetchone()[0] == 0
    assert batch.progress(conn)["done"] == 1


async def test_a_job_linked_while_its_lean_completion_waits_is_set_done_not_deleted(app, conn, joblane_dsn):
    """A child enqueued after= a running lean job, in a transaction that commits while the completion waits for
    the job's row: the completion sees the link, keeps the job as done, and the child is released."""
    parent = app.enqueue(conn, "k", {})
    c = await asyncpg.connect(joblane_dsn)
    try:
        [row] = await c.fetch(app.queries.claim_jobs, ["default"], 1, "w", 30.0)
        assert row["id"] == parent
        with psycopg.connect(joblane_dsn) as linker:
            child = app.enqueue(linker, "k", {"child": True}, after=[parent])  # locks the parent's row
            completion = asyncio.create_task(c.fetch(app.queries.delete_done, [parent], [1], "w"))
            pid = c.get_server_pid()
            waiting = "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s"
            for _ in range(500):
                await asyncio.sleep(0.01)
                if conn.execute(waiting, (pid,)).fetchone()[0]:
                    break
            else:
                raise AssertionError("the completion never waited for the parent's row")
            linker.commit()
        finished = await asyncio.wait_for(completion, 10)
    finally:
        await c.close()
    assert [r["id"] for r in finished] == [parent]
    jobs = table(app, "jobs")
    states = dict(conn.execute(f"SELECT id, state FROM {jobs} WHERE id IN (%s, %s)", (parent, child)).fetchall())
    assert states == {parent: "done", child: "pending"}


async def test_an_outcome_with_nothing_but_its_state_goes_short_and_applies_as_in_full(app, conn, joblane_dsn):
    """outcome_rows leaves out what is null or zero (most successes); complete_jobs reads it as written in full:
    a success, a retry due now with no error, and a try given back (refunded, delayed) side by side."""
    done_id, again_id, back_id = (app.enqueue(conn, "k", {"n": n}) for n in range(3))
    batch = [Outcome.done(done_id, 1, started_at=1.5, finished_at=2.5),
             Outcome(again_id, 1, "pending", "retry"),
             Outcome(back_id, 1, "pending", "released", refund=1, delay=60.0)]
    document = outcome_rows(batch)
    assert [len(o) for o in json.loads(document)] == [6, 6, 11]
    c = await asyncpg.connect(joblane_dsn)
    try:
        claimed = await c.fetch(app.queries.claim_jobs, ["default"], 3, "w", 30.0)
        assert sorted(r["id"] for r in claimed) == [done_id, again_id, back_id]
        applied = await c.fetch(app.queries.complete_jobs, document, "w")
    finally:
        await c.close()
    assert sorted(r["id"] for r in applied) == [done_id, again_id, back_id]
    rows = conn.execute(f"SELECT id, state, attempts, run_after <= now(), finished_at IS NOT NULL, last_error"
                        f" FROM {table(app, 'jobs')} ORDER BY id").fetchall()
    assert rows == [(done_id, "done", 1, True, True, None), (again_id, "pending", 1, True, False, None),
                    (back_id, "pending", 0, False, False, None)]
    tries = conn.execute(f"SELECT job_id, attempt, outcome, extract(epoch FROM started_at), error, meta"
                         f" FROM {table(app, 'attempts')} ORDER BY job_id").fetchall()
    assert tries == [(done_id, 1, "done", 1.5, None, None), (again_id, 1, "retry", None, None, None),
                     (back_id, 1, "released", None, None, None)]


async def test_an_outcome_repeated_within_one_batch_applies_once(app, conn, joblane_dsn):
    """Two outcomes of one try in one document (a try run twice, a batch put back beside its retry): the job
    changes once and that try gets one attempts row, not one per copy; the copy counts as not applied."""
    first, second = app.enqueue(conn, "k", {}), app.enqueue(conn, "k", {})
    c = await asyncpg.connect(joblane_dsn)
    try:
        rows = await c.fetch(app.queries.claim_jobs, ["default"], 2, "w1", 30.0)
        assert sorted(r["id"] for r in rows) == [first, second]
        retry = Outcome(first, 1, "pending", "retry", error="upstream refused", delay=0.0)
        batch = [retry, Outcome.done(second, 1), retry]
        applied = await c.fetch(app.queries.complete_jobs, outcome_rows(batch), "w1")
    finally:
        await c.close()
    assert sorted(r["id"] for r in applied) == [first, second]
    rows = conn.execute(f"SELECT job_id, attempt, outcome FROM {table(app, 'attempts')} ORDER BY job_id").fetchall()
    assert rows == [(first, 1, "retry"), (second, 1, "done")]
    assert conn.execute(f"SELECT state, attempts FROM {table(app, 'jobs')} WHERE id = %s", (first,)).fetchone() == (
        "pending", 1)


async def test_a_late_outcome_is_kept_on_the_attempts_row_of_its_try(app, conn, joblane_dsn):
    """The completer cannot apply an outcome for a rescued job, but the run it reports is not lost."""
    from collections import Counter

    from joblane.worker.completer import Completer

    job_id = app.enqueue(conn, "k", {})
    pool = await asyncpg.create_pool(joblane_dsn, min_size=1, max_size=2)
    try:
        async with pool.acquire() as c:
            await c.fetch(app.queries.claim_jobs, ["default"], 1, "blocked-worker", 30.0)
            conn.execute(f"UPDATE {table(app, 'jobs')} SET lease_until = now() - interval '1 second' WHERE id = %s",
                         (job_id,))
            await Rescuer(app.store, interval=1).run_once(c)
        stats: Counter = Counter()
        completer = Completer(app.store, "blocked-worker", stats)
        completer.start(pool)
        assert await completer.write([Outcome.done(job_id, 1, started_at=1.0, finished_at=2.0)]) == []
    finally:
        await pool.close()
    assert stats["stale"] == 1
    outcome, meta, worker, started = conn.execute(
        f"SELECT outcome, meta, worker, started_at FROM {table(app, 'attempts')} WHERE job_id = %s", (job_id,)).fetchone()
    assert (outcome, worker) == ("lost", "blocked-worker") and started is not None, "the lost try keeps its start"
    assert meta["late"]["outcome"] == "done" and meta["late"]["worker"] == "blocked-worker"


async def test_retry_and_cancel_admin_calls(app, conn):
    @app.task("boom", max_attempts=1)
    async def boom(job):
        raise RuntimeError("nope")

    failed = [app.enqueue(conn, "boom", {"i": i}) for i in range(3)]
    app.declare("other")  # a kind this process enqueues but does not run
    pending = app.enqueue(conn, "other", {}, queue="elsewhere")
    await drain(app)
    assert app.retry(ids=[failed[0], pending]) == [failed[0]]
    row = conn.execute(f"SELECT state, attempts, max_attempts, finished_at FROM {table(app, 'jobs')} WHERE id = %s",
                       (failed[0],)).fetchone()
    assert row == ("pending", 1, 2, None)  # the budget grows so the retry can run
    assert app.retry(kind="boom") == failed[1:]
    assert app.cancel(ids=[pending, failed[1], 999_999]) == [failed[1], pending]
    assert app.job_states([pending, 999_999]) == {pending: "cancelled"}
    with pytest.raises(joblane.JoblaneError):
        app.retry()


async def test_the_pruner_catches_up_on_a_backlog_in_short_rounds(app, conn, joblane_dsn):
    """A backlog of many rounds' worth of history is gone within seconds, not one round per interval."""
    conn.execute(
        f"INSERT INTO {table(app, 'jobs')} (queue, kind, state, attempts, finished_at)"
        " SELECT 'default', 'k', 'done', 1, now() - interval '2 hours' FROM generate_series(1, 25000)")
    keep = app.enqueue(conn, "k", {})
    pruner = Pruner(app.store, retention=3600, batch=1000, interval=60)  # 4,000 per round, a minute apart
    pool = await asyncpg.create_pool(joblane_dsn, min_size=1, max_size=2)
    stopping = asyncio.Event()
    runner = asyncio.create_task(pruner.run(pool, stopping))
    try:
        for _ in range(200):
            if pruner.total >= 25000:
                break
            await asyncio.sleep(0.05)
    finally:
        stopping.set()
        await runner
        await pool.close()
    assert pruner.total == 25000 and pruner.runs >= 7, "caught up in rounds that came back at once"
    assert not pruner.behind
    assert [r[0] for r in conn.execute(f"SELECT id FROM {table(app, 'jobs')}")] == [keep]


async def test_a_pruning_round_that_cannot_take_all_takes_the_oldest(app, conn, joblane_dsn):
    by_age = {age: fabricate(conn, app, state="done", finished=f"{age} hours") for age in (5, 30, 2, 50, 10)}
    for job in by_age.values():
        conn.execute(f"INSERT INTO {table(app, 'attempts')} (job_id, attempt, outcome) VALUES (%s, 1, 'done')", (job,))
    c = await asyncpg.connect(joblane_dsn)
    try:
        pruner = Pruner(app.store, retention=3600, batch=2)
        pruner.max_batches = 1
        assert sorted(await pruner.run_once(c)) == sorted([by_age[50], by_age[30]])
        assert pruner.behind
        assert sorted(await pruner.run_once(c)) == sorted([by_age[10], by_age[5]])
        assert await pruner.run_once(c) == [by_age[2]] and not pruner.behind
    finally:
        await c.close()
    assert count(conn, app) == 0
    assert conn.execute(f"SELECT count(*) FROM {table(app, 'attempts')}").fetchone()[0] == 0


async def test_the_outbox_pruner_deletes_sent_rows_past_the_retention_oldest_first(app, conn, joblane_dsn):
    from joblane.maintenance.outbox_pruner import OutboxPruner

    ids = [app.publish(conn, "orders.created", {"n": n}) for n in range(6)]
    outbox = table(app, "outbox")
    # sent 1, 9 and 3 days ago; sent an hour ago; never sent (pending), though old; failed, old
    for message, sent in zip(ids[:4], ("1 day", "9 days", "3 days", "1 hour")):
        conn.execute(f"UPDATE {outbox} SET state = 'sent', sent_at = now() - %s::interval WHERE id = %s", (sent, message))
    conn.execute(f"UPDATE {outbox} SET created_at = now() - interval '9 days' WHERE id = ANY(%s)", (ids[4:],))
    conn.execute(f"UPDATE {outbox} SET state = 'failed' WHERE id = %s", (ids[5],))
    c = await asyncpg.connect(joblane_dsn)
    try:
        pruner = OutboxPruner(app.store, retention=12 * 3600, batch=2)
        pruner.max_batches = 1
        assert sorted(await pruner.run_once(c)) == sorted([ids[1], ids[2]]) and pruner.behind
        assert await pruner.run_once(c) == [ids[0]] and not pruner.behind
    finally:
        await c.close()
    left = [r[0] for r in conn.execute(f"SELECT id FROM {outbox} ORDER BY id")]
    assert left == [ids[3], ids[4], ids[5]]
    with pytest.raises(ValueError):
        OutboxPruner(app.store, retention=-1)


async def test_pruning_reads_its_rows_by_index_whatever_the_history_holds(app, conn, joblane_dsn):
    """Each delete of a round finds its rows by index: a round costs the rows it deletes, not the table."""
    jobs, attempts, outbox = table(app, "jobs"), table(app, "attempts"), table(app, "outbox")
    conn.execute(f"INSERT INTO {jobs} (kind, state, attempts, finished_at)"
                 " SELECT 'k', 'done', 1, now() - g * interval '1 second' FROM generate_series(1, 100000) g")
    conn.execute(f"INSERT INTO {attempts} (job_id, attempt, outcome) SELECT id, 1, 'done' FROM {jobs}")
    # and tries in the next generation and in attempts_carried (job ids no generation covers): every
    # partition holds history, so none is cheaper to read whole than by index
    conn.execute(f"INSERT INTO {attempts} (job_id, attempt, outcome)"
                 " SELECT g * 1048576 + i, 1, 'done' FROM generate_series(1, 20000) i, generate_series(1, 2) g")
    conn.execute(f"INSERT INTO {outbox} (topic, payload, state, sent_at)"
                 " SELECT 't', '{}', 'sent', now() - g * interval '1 second' FROM generate_series(1, 100000) g")
    for name in (jobs, attempts, outbox):
        conn.execute(f"ANALYZE {name}")
    c = await asyncpg.connect(joblane_dsn)
    try:
        for stmt in (app.store.prune_finished(3600, False, 5000), app.store.prune_outbox(3600, 5000)):
            await c.execute("SET plan_cache_mode = force_generic_plan")  # as the pruner's prepared statement ends up
            plan = "\n".join(r[0] for r in await c.fetch("EXPLAIN " + stmt.sql, *stmt.args))
            assert "Seq Scan" not in plan and "Hash Join" not in plan, plan
    finally:
        await c.close()
