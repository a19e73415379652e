"""Production shapes with real worker processes: a task that blocks the event loop, a rolling deploy."""

from __future__ import annotations

import re
import signal
import urllib.request

from joblane import JobSpec

from ..conftest import count, table, wait_until
from ..helpers import create_runs_table

OLD = "tests.apps.runs:app"
NEW = "tests.apps.rolling:app"


def _registered(conn, app, n: int) -> bool:
    return conn.execute(f"SELECT count(*) FROM {table(app, 'processes')} WHERE lease_until > now()").fetchone()[0] >= n


def test_an_async_task_that_blocks_the_loop_past_its_lease_runs_once_and_ends_done(app, conn, spawn_worker):
    create_runs_table(conn, app.schema)
    env = {"TEST_LEASE": "3"}  # heartbeats every second; the task blocks the loop for 8
    workers = [spawn_worker(OLD, app.schema, "--concurrency", "2", "--metrics-port", "0", env=env) for _ in range(2)]
    wait_until(lambda: _registered(conn, app, 2), message="both workers registered")
    job_id = app.enqueue(conn, "blocks_loop", {"seconds": 8})
    wait_until(lambda: count(conn, app, "state = 'done'") == 1, timeout=60, message="the job done")
    runs = conn.execute(f"SELECT count(*) FROM {table(app, 'runs')} WHERE job_id = %s", (job_id,)).fetchone()[0]
    assert runs == 1, "the blocked task ran once: its lease was kept while the loop was blocked"
    outcomes = [r[0] for r in conn.execute(f"SELECT outcome FROM {table(app, 'attempts')} WHERE job_id = %s",
                                           (job_id,))]
    assert outcomes == ["done"]
    wait_until(lambda: "the event loop is free again" in "".join(w.output() for w in workers), timeout=10,
               message="the end of the stall logged")
    logs = "".join(w.output() for w in workers)
    assert "the event loop has been blocked" in logs and "runs.py" in logs and "blocks_loop" in logs, logs[-3000:]
    stalls = 0.0
    for w in workers:  # the stall is counted in the metrics of the worker that ran the task
        port = re.search(r"metrics at http://127\.0\.0\.1:(\d+)/metrics", w.output()).group(1)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        stalls += float(re.search(r"^joblane_event_loop_stalls_total (\S+)$", text, re.M).group(1))
    assert stalls == 1.0
    for w in workers:
        w.signal(signal.SIGTERM)
        assert w.wait(30) == 0, w.output()[-2000:]


def test_an_old_worker_leaves_a_kind_it_does_not_know_to_a_new_one(app, conn, spawn_worker):
    create_runs_table(conn, app.schema)
    old = spawn_worker(OLD, app.schema, "--concurrency", "4")
    wait_until(lambda: _registered(conn, app, 1), message="the old worker registered")
    new = spawn_worker(NEW, app.schema, "--concurrency", "4")
    wait_until(lambda: _registered(conn, app, 2), message="the new worker registered")
    ids = app.enqueue_many(conn, [JobSpec("added_later", {"i": i}) for i in range(40)])
    wait_until(lambda: count(conn, app, "state = 'done'") == 40, timeout=90, message="every job done")
    runs = conn.execute(f"SELECT job_id, count(*), min(pid) FROM {table(app, 'runs')} GROUP BY job_id").fetchall()
    assert sorted(r[0] for r in runs) == sorted(ids) and max(r[1] for r in runs) == 1
    assert {r[2] for r in runs} == {new.proc.pid}, "only the worker that knows the kind ran it"
    assert count(conn, app, "state = 'failed'") == 0
    spent = conn.execute(f"SELECT max(attempts) FROM {table(app, 'jobs')}").fetchone()[0]
    assert spent == 1, "a give-back spends no attempt"
    assert old.output().count("does not know task kind 'added_later'") == 1, "said once"
    for w in (old, new):
        w.signal(signal.SIGTERM)
        assert w.wait(30) == 0
    assert count(conn, app) == 40
    assert conn.execute(f"SELECT count(*) FROM {table(app, 'processes')}").fetchone()[0] == 0, "both deregistered"


def test_a_kind_no_live_worker_knows_fails_once_old_enough(app, conn, spawn_worker):
    create_runs_table(conn, app.schema)
    worker = spawn_worker(OLD, app.schema, "--unknown-kind-timeout", "2")
    job_id = app.enqueue(conn, "added_later", {})
    wait_until(lambda: count(conn, app, "state = 'failed'") == 1, timeout=60, message="the job failed")
    last_error, attempts = conn.execute(f"SELECT last_error, attempts FROM {table(app, 'jobs')} WHERE id = %s",
                                        (job_id,)).fetchone()
    assert "unknown task kind 'added_later'" in last_error and attempts == 1
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0


def test_joblane_workers_lists_live_workers_and_drops_stopped_ones(app, conn, spawn_worker):
    import json
    import subprocess
    import sys

    from ..conftest import ROOT

    worker = spawn_worker(OLD, app.schema, "--concurrency", "3", "-q", "default")
    wait_until(lambda: _registered(conn, app, 1), message="the worker registered")
    env = {"DATABASE_URL": app.dsn, "JOBLANE_SCHEMA": app.schema, "PATH": "/usr/bin:/bin"}

    def listed() -> list[dict]:
        done = subprocess.run([sys.executable, "-m", "joblane", "workers", "--json"], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    [row] = listed()
    assert (row["pid"], row["role"], row["queues"], row["concurrency"]) == (worker.proc.pid, "worker", ["default"], 3)
    assert "record" in row["kinds"] and row["version"]
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    assert listed() == []
