"""A try of a job never starts while an earlier try of it still runs: tasks told to stop, by real workers.

Each test runs real worker processes on tests/apps/stopping.py, with a second
worker idle beside the first where a job could be run twice, and reads the
outside record every try writes (its start and end lines, with pid and time).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psycopg
import pytest

from tests.conftest import ROOT, WorkerProcess, count, table, wait_until

APP = "tests.apps.stopping:app"


@pytest.fixture
def record(tmp_path):
    return tmp_path / "record.txt"


def lines(record) -> list[tuple[str, int, int, int, float]]:
    if not record.exists():
        return []
    out = []
    for line in record.read_text().splitlines():
        what, job, attempt, pid, at = line.split()
        out.append((what, int(job), int(attempt), int(pid), float(at)))
    return out


def tries(record, job_id: int) -> list[dict]:
    """Each start of ``job_id`` with the end the same process wrote after it (None when it wrote none)."""
    found: list[dict] = []
    for what, job, attempt, pid, at in lines(record):
        if job != job_id:
            continue
        if what == "start":
            found.append({"pid": pid, "attempt": attempt, "start": at, "end": None})
        else:
            open_ = [t for t in found if t["pid"] == pid and t["end"] is None]
            assert open_, f"an end of job {job_id} by {pid} without its start"
            open_[-1]["end"] = at
    return found


@pytest.fixture
def spawn(spawn_worker, record):
    """``spawn(schema, *args, lease=, **env)``: a worker of the stop queue, stopped when the test ends."""
    def start(schema: str, *args: str, lease: float = 3.0, **env: str) -> WorkerProcess:
        return spawn_worker(APP, schema, "-q", "stop", "--lease", str(lease), *args,
                            env={"TEST_RECORD": str(record), "TEST_LEASE": str(lease), **env})
    return start


def enqueue(app, conn, kind: str, payload: dict) -> int:
    return app.enqueue(conn, kind, payload, queue="stop")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie has ended: it only waits for its parent to read its status
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def state(conn, app, job_id: int) -> str:
    return conn.execute(f"SELECT state FROM {table(app, 'jobs')} WHERE id = %s", (job_id,)).fetchone()[0]


def workers_json(app) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "joblane", "workers", "--json"], cwd=ROOT, capture_output=True,
                         text=True, env={**os.environ, "DATABASE_URL": app.dsn, "JOBLANE_SCHEMA": app.schema},
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def assert_one_at_a_time(found: list[dict], exits: dict[int, float] | None = None) -> None:
    """No try starts before the one before it has ended (its end line, or its process's exit)."""
    for before, after in zip(found, found[1:]):
        ended = before["end"] if before["end"] is not None else (exits or {}).get(before["pid"])
        assert ended is not None, f"try by {before['pid']} never ended before the next began: {found}"
        assert after["start"] >= ended, f"two tries at once: {found}"


def test_sigterm_during_a_plain_task_gives_its_job_back_only_once_its_thread_stopped(app, conn, record, spawn):
    first = spawn(app.schema, "--grace", "2")
    job_id = enqueue(app, conn, "steps", {"seconds": 15})
    wait_until(lambda: tries(record, job_id), 30, message="the first start")
    second = spawn(app.schema, "--grace", "2")  # idle beside it, ready to claim the job
    wait_until(lambda: len(workers_json(app)) == 2, 30, message="both workers registered")
    first.signal(signal.SIGTERM)
    # while it stops, the registry says which job keeps it alive
    stopping = wait_until(lambda: [w for w in workers_json(app) if w.get("stopping")], 10,
                          message="the stopping worker in the registry")
    assert [j["id"] for j in stopping[0]["stopping"]["jobs"]] == [job_id]
    assert first.wait(20) == 0
    wait_until(lambda: state(conn, app, job_id) == "done", 60, message="the job done by the second worker")
    found = tries(record, job_id)
    assert [t["pid"] for t in found] == [first.proc.pid, second.proc.pid]
    assert_one_at_a_time(found)
    # it stopped at the end of the grace, not at the end of its 15 s
    assert found[0]["end"] - found[0]["start"] < 8
    output = first.output()
    assert "giving back 1 job that did not finish within the grace period" in output
    attempts = conn.execute(f"SELECT outcome, error FROM {table(app, 'attempts')} WHERE job_id = %s ORDER BY id",
                            (job_id,)).fetchall()
    assert attempts[0][0] == "snoozed" and "shut down" in attempts[0][1]
    assert attempts[-1][0] == "done"


def test_a_thread_that_will_not_stop_keeps_its_job_until_the_worker_exits(app, conn, record, spawn):
    """Blocked in C: the worker exits after grace + stop wait, the job comes back through its lease."""
    first = spawn(app.schema, "--grace", "1", "--stop-wait", "1")
    job_id = enqueue(app, conn, "blocked", {"seconds": 20})
    wait_until(lambda: tries(record, job_id), 30, message="the first start")
    second = spawn(app.schema)
    wait_until(lambda: len(workers_json(app)) == 2, 30, message="both workers registered")
    signalled = time.time()
    first.signal(signal.SIGTERM)
    assert first.wait(20) == 3  # bounded: it did not wait for the 20 s call
    exited = time.time()
    assert exited - signalled < 10
    assert "did not stop 1s after being told" in first.output()
    wait_until(lambda: state(conn, app, job_id) == "done", 60, message="the job rescued and done")
    found = tries(record, job_id)
    assert [t["pid"] for t in found] == [first.proc.pid, second.proc.pid]
    assert found[0]["end"] is None  # its thread died with its process
    assert_one_at_a_time(found, {first.proc.pid: exited})
    outcomes = [r[0] for r in conn.execute(f"SELECT outcome FROM {table(app, 'attempts')} WHERE job_id = %s"
                                           " ORDER BY id", (job_id,))]
    assert outcomes == ["lost", "done"]


def test_a_timeout_stops_a_busy_loop_and_the_retry_starts_after_it(app, conn, record, spawn):
    spawn(app.schema)
    spawn(app.schema)
    job_id = enqueue(app, conn, "busy", {"seconds": 30})
    wait_until(lambda: state(conn, app, job_id) == "done", 60, message="the job retried and done")
    found = tries(record, job_id)
    assert len(found) == 2 and [t["attempt"] for t in found] == [1, 2]
    assert found[0]["end"] - found[0]["start"] < 3  # stopped about its 1 s timeout, not after 30 s
    assert_one_at_a_time(found)
    first = conn.execute(f"SELECT outcome, error FROM {table(app, 'attempts')} WHERE job_id = %s AND attempt = 1",
                         (job_id,)).fetchone()
    assert first[0] == "retry" and "timed out after 1s" in first[1]


def test_cancel_stops_a_running_plain_task(app, conn, record, spawn):
    worker = spawn(app.schema, lease=1.5)
    job_id = enqueue(app, conn, "steps", {"seconds": 30})
    wait_until(lambda: tries(record, job_id), 30, message="the start")
    out = subprocess.run([sys.executable, "-m", "joblane", "cancel", str(job_id)], cwd=ROOT, capture_output=True,
                         text=True, env={**os.environ, "DATABASE_URL": app.dsn, "JOBLANE_SCHEMA": app.schema},
                         timeout=60)
    assert out.returncode == 0, out.stderr
    wait_until(lambda: tries(record, job_id)[0]["end"] is not None, 10, message="the task stopped")
    found = tries(record, job_id)
    assert found[0]["end"] - found[0]["start"] < 10
    assert state(conn, app, job_id) == "cancelled"
    assert worker.proc.poll() is None  # the worker goes on


@pytest.mark.parametrize("how", ["timeout", "cancel", "shutdown"])
def test_a_task_in_a_child_process_is_ended_by_timeout_cancel_and_shutdown(app, conn, record, spawn, how):
    env = {"TEST_CHILD_TIMEOUT": "1"} if how == "timeout" else {}
    worker = spawn(app.schema, "--grace", "1", lease=1.5, **env)
    job_id = enqueue(app, conn, "child", {"seconds": 30})
    wait_until(lambda: tries(record, job_id), 30, message="the child's start")
    child_pid = tries(record, job_id)[0]["pid"]
    assert child_pid != worker.proc.pid
    told = time.time()
    if how == "cancel":
        out = subprocess.run([sys.executable, "-m", "joblane", "cancel", str(job_id)], cwd=ROOT,
                             capture_output=True, text=True, timeout=60,
                             env={**os.environ, "DATABASE_URL": app.dsn, "JOBLANE_SCHEMA": app.schema})
        assert out.returncode == 0, out.stderr
    elif how == "shutdown":
        worker.signal(signal.SIGTERM)
    # SIGTERM reaches the child's sleep at once; at worst SIGKILL follows 3 s later
    wait_until(lambda: not alive(child_pid), 10, message="the child ended")
    assert time.time() - told < 10
    found = tries(record, job_id)
    assert found[0]["end"] is not None  # its finally ran: it was sent SIGTERM first
    if how == "timeout":
        wait_until(lambda: state(conn, app, job_id) == "done", 30, message="the retry done")
        error = conn.execute(f"SELECT error FROM {table(app, 'attempts')} WHERE job_id = %s AND attempt = 1",
                             (job_id,)).fetchone()[0]
        assert "timed out after 1s" in error
        assert_one_at_a_time(tries(record, job_id))
    elif how == "cancel":
        assert state(conn, app, job_id) == "cancelled"
        assert worker.proc.poll() is None
    else:
        assert worker.wait(20) == 0
        assert state(conn, app, job_id) == "pending"  # given back, its attempt not spent
    for t in tries(record, job_id):
        assert not alive(t["pid"]) or t["pid"] == worker.proc.pid


def test_a_child_process_returns_its_result_records_and_errors(app, conn, record, spawn):
    spawn(app.schema)
    done = enqueue(app, conn, "child", {"seconds": 0})
    failing = enqueue(app, conn, "child", {"seconds": 0, "fail": True})
    dying = enqueue(app, conn, "child", {"seconds": 0, "die": True})
    wait_until(lambda: count(conn, app, "id = %s AND state = 'done'", (done,)) == 1, 30, message="done")
    result, = conn.execute(f"SELECT result FROM {table(app, 'jobs')} WHERE id = %s", (done,)).fetchone()
    assert result["pid"] != os.getpid() and not alive(result["pid"])
    meta, = conn.execute(f"SELECT meta FROM {table(app, 'attempts')} WHERE job_id = %s", (done,)).fetchone()
    assert meta["model"] == "m-1"
    wait_until(lambda: conn.execute(f"SELECT count(*) FROM {table(app, 'attempts')} WHERE job_id = ANY(%s)",
                                    ([failing, dying],)).fetchone()[0] >= 2, 30, message="the failing tries")
    rows = dict(conn.execute(f"SELECT job_id, outcome || ': ' || error FROM {table(app, 'attempts')}"
                             " WHERE job_id = ANY(%s) AND attempt = 1", ([failing, dying],)).fetchall())
    assert rows[failing].startswith("retry: ValueError: asked to fail")
    assert rows[dying].startswith("lost: the task's process ended without an answer (exit code 7)")


def test_executor_process_refuses_a_function_a_child_could_not_find():
    import joblane

    app = joblane.App("postgresql://unused", schema="s")

    def make():
        @app.task("local", executor="process")
        def local(job):  # defined inside a function: no module attribute names it
            return None

    with pytest.raises(joblane.JoblaneError, match="top level"):
        make()
    with pytest.raises(joblane.JoblaneError, match="executor must be"):
        app.task("x", executor="fork")(lambda job: None)
