"""Real worker processes: exactly once across processes, SIGKILL, SIGTERM, dropped connections."""

from __future__ import annotations

import signal
import time


from joblane import JobSpec

from .conftest import count, table, wait_until
from .helpers import create_runs_table

APP = "tests.apps.runs:app"


def unfinished(conn, app) -> int:
    return count(conn, app, "state IN ('pending', 'running')")


def test_two_processes_run_5000_jobs_exactly_once(app, conn, spawn_worker):
    create_runs_table(conn, app.schema)
    ids = app.enqueue_many(conn, [JobSpec("record", {"i": i}) for i in range(5000)])
    workers = [spawn_worker(APP, app.schema, "--concurrency", "10") for _ in range(2)]
    wait_until(lambda: unfinished(conn, app) == 0, timeout=120, message="all jobs finished")
    runs = conn.execute(f"SELECT job_id, count(*), count(DISTINCT pid) FROM {table(app, 'runs')} GROUP BY job_id").fetchall()
    assert sorted(r[0] for r in runs) == sorted(ids), "every job ran"
    assert max(r[1] for r in runs) == 1, "no job ran twice"
    pids = {r[0] for r in conn.execute(f"SELECT DISTINCT pid FROM {table(app, 'runs')}").fetchall()}
    assert len(pids) == 2, "both workers took part"
    assert count(conn, app, "state = 'done'") == 5000
    for w in workers:
        w.signal(signal.SIGTERM)
        assert w.wait(30) == 0, w.output()


def test_sigkill_mid_task_jobs_finish_after_rescue(app, conn, spawn_worker):
    create_runs_table(conn, app.schema)
    env = {"TEST_LEASE": "2"}
    ids = app.enqueue_many(conn, [JobSpec("sleepy", {"seconds": 1.5}) for _ in range(8)])
    victim = spawn_worker(APP, app.schema, "--concurrency", "8", env=env)
    wait_until(lambda: count(conn, app, "state = 'running'") == 8, timeout=30, message="8 running jobs")
    wait_until(lambda: conn.execute(f"SELECT count(*) FROM {table(app, 'runs')}").fetchone()[0] == 8, timeout=10)
    victim.kill()  # SIGKILL: no goodbye, leases stay behind
    assert count(conn, app, "state = 'running'") == 8
    spawn_worker(APP, app.schema, "--concurrency", "8", env=env)
    wait_until(lambda: unfinished(conn, app) == 0, timeout=60, message="rescued jobs finished")
    rows = conn.execute(f"SELECT id, state, attempts FROM {table(app, 'jobs')} ORDER BY id").fetchall()
    assert rows == [(i, "done", 2) for i in sorted(ids)]
    outcomes = conn.execute(
        f"SELECT job_id, array_agg(outcome ORDER BY id) FROM {table(app, 'attempts')} GROUP BY job_id").fetchall()
    assert all(o == ["lost", "done"] for _, o in outcomes), outcomes
    # each job ran at most twice, and the second run only after the first was recorded as lost
    runs = conn.execute(f"SELECT job_id, count(*) FROM {table(app, 'runs')} GROUP BY job_id").fetchall()
    assert {n for _, n in runs} == {2}


def test_sigterm_gives_back_unfinished_jobs_without_spending_attempts(app, conn, spawn_worker):
    create_runs_table(conn, app.schema)
    quick = app.enqueue_many(conn, [JobSpec("sleepy", {"seconds": 0.3}, priority=0) for _ in range(4)])
    slow = app.enqueue_many(conn, [JobSpec("sleepy", {"seconds": 30}, priority=1) for _ in range(4)])
    w = spawn_worker(APP, app.schema, "--concurrency", "8", "--grace", "1.5")
    wait_until(lambda: count(conn, app, "state = 'running'") == 8, timeout=30, message="8 running jobs")
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.output()
    states = dict(conn.execute(f"SELECT id, (state, attempts) FROM {table(app, 'jobs')}").fetchall())
    for i in quick:
        assert states[i] == ("done", "1")
    for i in slow:
        assert states[i] == ("pending", "0"), "given back with the attempt refunded"
    given_back = conn.execute(
        f"SELECT count(*) FROM {table(app, 'attempts')} WHERE outcome = 'snoozed' AND error LIKE '%%shut down%%'").fetchone()[0]
    assert given_back == 4
    assert count(conn, app, "state = 'running'") == 0


def test_sigterm_waits_for_running_jobs_within_grace(app, conn, spawn_worker):
    create_runs_table(conn, app.schema)
    ids = app.enqueue_many(conn, [JobSpec("sleepy", {"seconds": 1.0}) for _ in range(5)])
    w = spawn_worker(APP, app.schema, "--concurrency", "5", "--grace", "20")
    # every task has started (each records its run first): claimed jobs not yet started would be given back
    wait_until(lambda: conn.execute(f"SELECT count(*) FROM {table(app, 'runs')}").fetchone()[0] == 5, timeout=30)
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0
    assert count(conn, app, "state = 'done'") == len(ids)


def test_second_signal_exits_at_once_and_leases_cover_it(app, conn, spawn_worker):
    create_runs_table(conn, app.schema)
    app.enqueue(conn, "sleepy", {"seconds": 60})
    w = spawn_worker(APP, app.schema, "--grace", "60", env={"TEST_LEASE": "2"})
    # the task has begun (its run recorded), not only been claimed: a SIGINT between the claim's commit
    # and the task's first step gives the job back at once and the worker exits 0 before the second
    wait_until(lambda: conn.execute(f"SELECT count(*) FROM {table(app, 'runs')}").fetchone()[0] == 1, timeout=30)
    w.signal(signal.SIGINT)
    time.sleep(0.3)
    w.signal(signal.SIGINT)
    assert w.wait(5) != 0
    assert count(conn, app, "state = 'running'") == 1  # left for the rescuer


def test_worker_survives_its_connections_being_terminated(app, conn, spawn_worker):
    create_runs_table(conn, app.schema)
    first = app.enqueue_many(conn, [JobSpec("record", {"i": i}) for i in range(500)])
    w = spawn_worker(APP, app.schema, "--concurrency", "10", "--poll-interval", "0.2")
    wait_until(lambda: unfinished(conn, app) == 0, timeout=60)
    pid = w.proc.pid
    killed = 0
    for _ in range(3):
        killed += len(conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (f"joblane worker {pid}",)).fetchall())
        time.sleep(0.3)
    assert killed > 0
    second = app.enqueue_many(conn, [JobSpec("record", {"i": i}) for i in range(500)])
    wait_until(lambda: unfinished(conn, app) == 0, timeout=60, message="jobs after reconnect")
    runs = conn.execute(f"SELECT count(*), count(DISTINCT job_id) FROM {table(app, 'runs')}").fetchone()
    assert runs == (len(first) + len(second),) * 2
    assert w.proc.poll() is None and w.proc.pid == pid  # the same process carried on


def test_bad_app_spec_and_unmigrated_schema_fail_in_one_line(joblane_dsn, spawn_worker):
    w = spawn_worker("tests.apps.nope:app", "whatever")
    assert w.wait(30) == 1
    assert "cannot import 'tests.apps.nope'" in w.output()
    w = spawn_worker(APP, "not_migrated_here")
    assert w.wait(30) == 1
    out = w.output()
    assert "run `joblane migrate`" in out and "Traceback" not in out
