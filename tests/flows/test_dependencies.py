"""Dependencies (after=): real worker processes; a child runs once, after its last parent, never before."""

from __future__ import annotations

import psycopg
import pytest

import joblane
from joblane.testing import run_jobs
from tests.conftest import count, table, wait_until
from tests.helpers import create_runs_table

APP = "tests.apps.flows:app"


@pytest.fixture
def flow_app(app, conn):
    create_runs_table(conn, app.schema)
    app.declare("step")
    app.declare("summary")
    app.declare("waiter")
    return app


def finished(conn, app, ids) -> bool:
    return count(conn, app, "id = ANY(%s) AND state IN ('done', 'failed', 'cancelled')", (list(ids),)) == len(ids)


def runs_of(conn, app, job_id) -> int:
    return conn.execute(f"SELECT count(*) FROM {table(app, 'runs')} WHERE job_id = %s", (job_id,)).fetchone()[0]


def started_after_parents(conn, app, child: int, parents: list[int]) -> bool:
    """The child's only run began after every parent's completion committed its finished_at."""
    first_run, last_parent = conn.execute(
        f"SELECT (SELECT min(at) FROM {table(app, 'runs')} WHERE job_id = %s),"
        f"       (SELECT max(finished_at) FROM {table(app, 'jobs')} WHERE id = ANY(%s))",
        (child, parents)).fetchone()
    return first_run > last_parent


def test_diamond_runs_in_order_on_a_worker(flow_app, conn, spawn_worker):
    app = flow_app
    with psycopg.connect(app.dsn) as tx:
        a = app.enqueue(tx, "step", {"n": "a"})
        b = app.enqueue(tx, "step", {"n": "b"}, after=[a])
        c = app.enqueue(tx, "step", {"n": "c"}, after=[a])
        d = app.enqueue(tx, "step", {"n": "d"}, after=[b, c])
        states = dict(conn.execute(f"SELECT id, state FROM {table(app, 'jobs')}").fetchall())
    assert states == {}, "nothing is visible before the commit"
    assert count(conn, app, "state = 'waiting'") == 3
    assert app.job_flow(d, conn)["parents"] == [b, c]
    spawn_worker(APP, app.schema, "-c", "4")
    wait_until(lambda: finished(conn, app, [a, b, c, d]), message="the diamond to finish")
    assert count(conn, app, "state = 'done'") == 4
    for job in (a, b, c, d):
        assert runs_of(conn, app, job) == 1
    assert started_after_parents(conn, app, b, [a]) and started_after_parents(conn, app, c, [a])
    assert started_after_parents(conn, app, d, [b, c])


def test_fan_in_of_1000_parents_on_two_workers(flow_app, conn, spawn_worker):
    """Two workers finish parents at the same instants; the child runs exactly once, after the last of them."""
    app = flow_app
    parents = [joblane.JobSpec("step", {"n": i}) for i in range(1000)]
    child = joblane.JobSpec("summary", {"batch": {}}, after=parents)
    with psycopg.connect(app.dsn) as tx:
        ids = app.enqueue_many(tx, [*parents, child])
    child_id = ids[-1]
    assert count(conn, app, "id = %s AND state = 'waiting' AND parents_left = 1000", (child_id,)) == 1
    spawn_worker(APP, app.schema, "-c", "25")
    spawn_worker(APP, app.schema, "-c", "25")
    wait_until(lambda: finished(conn, app, ids), timeout=60, message="the fan-in to finish")
    assert runs_of(conn, app, child_id) == 1
    assert conn.execute(f"SELECT count(*) FROM {table(app, 'attempts')} WHERE job_id = %s",
                        (child_id,)).fetchone()[0] == 1
    assert started_after_parents(conn, app, child_id, ids[:-1])
    # both workers finished parents (so completions really raced on the child row)
    workers = conn.execute(f"SELECT count(DISTINCT worker) FROM {table(app, 'attempts')} WHERE job_id = ANY(%s)",
                           (ids[:-1],)).fetchone()[0]
    assert workers == 2


@pytest.fixture
def in_process(app):
    ran: list[str] = []

    @app.task("step")
    def step(job):
        ran.append(job.payload["n"])
        if job.payload.get("fail"):
            raise joblane.PermanentError("told to fail")

    app.ran = ran
    return app


def test_parent_failure_policies(in_process, conn):
    app = in_process
    with psycopg.connect(app.dsn) as tx:
        bad = app.enqueue(tx, "step", {"n": "bad", "fail": True})
        good = app.enqueue(tx, "step", {"n": "good"})
        cancel = app.enqueue(tx, "step", {"n": "cancel"}, after=[bad, good])
        grandchild = app.enqueue(tx, "step", {"n": "grandchild"}, after=[cancel], on_parent_failure="run")
        anyway = app.enqueue(tx, "step", {"n": "anyway"}, after=[bad, good], on_parent_failure="run")
        held = app.enqueue(tx, "step", {"n": "held"}, after=[bad, good], on_parent_failure="hold")
    run_jobs(app)
    jobs = {j: app.get_job(j, conn) for j in (cancel, grandchild, anyway, held)}
    assert jobs[cancel]["state"] == "cancelled"
    assert f"parent job {bad} failed" in jobs[cancel]["last_error"]
    assert [a["outcome"] for a in jobs[cancel]["attempt_rows"]] == ["cancelled"]
    # the cancelled child is a failed parent of its own child, whose policy is to run anyway
    assert jobs[grandchild]["state"] == "done"
    assert jobs[anyway]["state"] == "done" and "grandchild" in app.ran and "anyway" in app.ran
    assert jobs[held]["state"] == "held" and f"parent job {bad} failed" in jobs[held]["last_error"]
    assert [a["outcome"] for a in jobs[held]["attempt_rows"]] == ["held"]
    assert "held" not in app.ran and "cancel" not in app.ran
    # a person releases the held child: it runs
    with psycopg.connect(app.dsn) as tx:
        app.release(tx, held)
    run_jobs(app)
    assert app.get_job(held, conn)["state"] == "done"


def test_a_parent_cancelled_by_an_admin_cancels_its_children(in_process, conn):
    app = in_process
    with psycopg.connect(app.dsn) as tx:
        parent = app.enqueue(tx, "step", {"n": "p"}, delay=3600)
        child = app.enqueue(tx, "step", {"n": "c"}, after=parent)
    assert app.cancel(conn, ids=[parent]) == [parent]
    row = app.get_job(child, conn)
    assert row["state"] == "cancelled" and f"parent job {parent} cancelled" in row["last_error"]
    # an admin can cancel a waiting job itself
    with psycopg.connect(app.dsn) as tx:
        other = app.enqueue(tx, "step", {"n": "p2"}, delay=3600)
        waiting = app.enqueue(tx, "step", {"n": "c2"}, after=[other])
    assert app.cancel(conn, ids=[waiting]) == [waiting]


def test_after_a_parent_that_already_finished(in_process, conn):
    app = in_process
    with psycopg.connect(app.dsn) as tx:
        done = app.enqueue(tx, "step", {"n": "first"})
    run_jobs(app)
    with psycopg.connect(app.dsn) as tx:
        child = app.enqueue(tx, "step", {"n": "later"}, after=[done])
    assert app.get_job(child, conn)["state"] == "pending"
    with pytest.raises(psycopg.errors.ForeignKeyViolation, match="do not exist"):
        with psycopg.connect(app.dsn) as tx:
            app.enqueue(tx, "step", {"n": "orphan"}, after=[10**12])
    with pytest.raises(joblane.JoblaneError, match="on_parent_failure"):
        with psycopg.connect(app.dsn) as tx:
            app.enqueue(tx, "step", {}, after=[done], on_parent_failure="maybe")


def test_a_parent_the_rescuer_fails_cancels_its_child(flow_app, conn, spawn_worker):
    """The parent's worker is SIGKILLed on its last attempt: the rescuer fails it, and its child follows."""
    app = flow_app
    with psycopg.connect(app.dsn) as tx:
        parent = app.enqueue(tx, "step", {"sleep": 30}, max_attempts=1)
        child = app.enqueue(tx, "step", {"n": "child"}, after=[parent])
        kept = app.enqueue(tx, "step", {"n": "kept"}, after=[parent], on_parent_failure="run")
    env = {"TEST_LEASE": "2"}
    doomed = spawn_worker(APP, app.schema, "-c", "2", "--lease", "2", env=env)
    wait_until(lambda: runs_of(conn, app, parent) == 1, message="the parent to start")
    doomed.kill()
    spawn_worker(APP, app.schema, "-c", "2", "--lease", "2", env=env)  # its rescuer finds the lost lease
    wait_until(lambda: finished(conn, app, [parent, child, kept]), timeout=30, message="the rescue")
    assert app.get_job(parent, conn)["state"] == "failed"
    row = app.get_job(child, conn)
    assert row["state"] == "cancelled" and f"parent job {parent} failed" in row["last_error"]
    assert runs_of(conn, app, child) == 0
    assert app.get_job(kept, conn)["state"] == "done"


def test_the_typed_forms_take_parents_and_a_batch(app, conn):
    seen = []

    @app.task("part")
    def part(job):
        seen.append(job.payload["n"])

    @app.task("join")
    def join(job):
        seen.append("join")

    with psycopg.connect(app.dsn) as tx:
        batch = app.batch(tx)
        parts = part.enqueue_many(tx, [{"n": i} for i in range(3)], batch=batch)
        joined = join.enqueue_many(tx, [{}], after=parts, on_parent_failure="run")
        batch.seal(tx)
    assert app.job_flow(joined[0], conn)["parents"] == parts
    run_jobs(app)
    assert seen[-1] == "join" and sorted(seen[:3]) == [0, 1, 2]
    assert app.batch_progress(batch.id, conn)["done"] == 3
