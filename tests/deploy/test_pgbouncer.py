"""joblane behind a real PgBouncer: transaction pooling (the hard case) and session pooling.

Enqueue runs on the caller's connection with psycopg's default prepare
threshold, so a statement it prepared would break on the sixth call; workers
run with ``--pgbouncer`` (no named prepared statements, polling instead of
LISTEN). Every job must run exactly once with no error in the logs.
"""

from __future__ import annotations

import json
import signal
import threading
import uuid

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from joblane import JobSpec, store

from ..conftest import count, table, wait_until
from ..helpers import create_runs_table
from .pgbouncer import pgbouncer

APP = "tests.apps.runs:app"


@pytest.fixture
def transaction_pool(joblane_dsn):
    with pgbouncer(joblane_dsn, pool_mode="transaction", pool_size=4) as dsn:
        yield dsn


@pytest.fixture
def session_pool(joblane_dsn):
    with pgbouncer(joblane_dsn, pool_mode="session", pool_size=20) as dsn:
        yield dsn


def _enqueue_from_threads(app, dsn: str, threads: int, per_thread: int) -> list[int]:
    ids: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def producer(t: int) -> None:
        try:
            with psycopg.connect(dsn) as c:  # psycopg's defaults: prepare_threshold=5
                for i in range(per_thread):
                    with c.transaction():
                        job_id = app.enqueue(c, "record", {"t": t, "i": i})
                    with lock:
                        ids.append(job_id)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    workers = [threading.Thread(target=producer, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors == []
    return ids


def _problems(output: str) -> list[str]:
    lines = []
    for line in output.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            lines.append(line)  # a traceback or a line that is not the worker's log
            continue
        if str(record.get("level")).lower() in ("warning", "error", "critical"):
            lines.append(line)
    return lines


def _run_workers(app, conn, spawn_worker, dsn: str, joblane_dsn: str, ids: list[int], *args: str) -> list[str]:
    env = {"DATABASE_URL": dsn, "TEST_DIRECT_DSN": joblane_dsn}
    workers = [spawn_worker(APP, app.schema, "--concurrency", "8", *args, env=env) for _ in range(2)]
    wait_until(lambda: count(conn, app, "state IN ('pending', 'running')") == 0, timeout=120,
               message="every job finished")
    runs = conn.execute(f"SELECT job_id, count(*) FROM {table(app, 'runs')} GROUP BY job_id").fetchall()
    assert sorted(r[0] for r in runs) == sorted(ids), "every job ran"
    assert max(r[1] for r in runs) == 1, "no job ran twice"
    assert count(conn, app, "state = 'done'") == len(ids)
    for w in workers:
        w.signal(signal.SIGTERM)
        assert w.wait(30) == 0, w.output()
        assert _problems(w.output()) == [], w.output()[-3000:]
    return [w.output() for w in workers]


def test_enqueue_publish_and_admin_through_transaction_pooling(app, conn, transaction_pool):
    ids = _enqueue_from_threads(app, transaction_pool, threads=4, per_thread=150)
    assert len(set(ids)) == 600 and count(conn, app) == 600
    with psycopg.connect(transaction_pool) as c:
        for i in range(20):  # the same statements again and again on one connection
            with c.transaction():
                app.publish(c, "t.x", {"i": i})
                app.enqueue_many(c, [JobSpec("record", {"bulk": i})])
        assert len(app.list_jobs(c, limit=10)) == 10
        assert app.status(c)
    assert count(conn, app) == 620


def test_two_workers_through_transaction_pooling_run_every_job_once(app, conn, joblane_dsn, transaction_pool,
                                                                    spawn_worker):
    create_runs_table(conn, app.schema)
    ids = _enqueue_from_threads(app, transaction_pool, threads=4, per_thread=250)
    _run_workers(app, conn, spawn_worker, transaction_pool, joblane_dsn, ids, "--pgbouncer")


def test_workers_find_transaction_pooling_without_the_flag(app, conn, joblane_dsn, transaction_pool, spawn_worker):
    """No --pgbouncer: each worker sees at start that its connection's ends are a pooler's, says so in one
    line and runs as with the flag; before, its claims failed with "prepared statement does not exist"."""
    create_runs_table(conn, app.schema)
    ids = _enqueue_from_threads(app, transaction_pool, threads=2, per_thread=250)
    outputs = _run_workers(app, conn, spawn_worker, transaction_pool, joblane_dsn, ids)
    for output in outputs:
        said = [line for line in output.splitlines() if "reached through a pooler" in line]
        assert len(said) == 1, output[-3000:]


def test_two_workers_through_session_pooling_run_every_job_once(app, conn, joblane_dsn, session_pool, spawn_worker):
    create_runs_table(conn, app.schema)
    ids = _enqueue_from_threads(app, session_pool, threads=4, per_thread=250)
    _run_workers(app, conn, spawn_worker, session_pool, joblane_dsn, ids)


def test_the_default_app_prepares_nothing_behind_pgbouncer(app, session_pool):
    # session pooling keeps one server connection per client, so its prepared statements can be seen
    with psycopg.connect(session_pool, autocommit=True) as c:  # psycopg's prepare_threshold: 5
        assert store.reaches_server(c) is False
        for i in range(10):
            app.enqueue(c, "record", {"i": i})
            app.publish(c, "t.x", {"i": i})
        assert c.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0] == 0


def test_a_prepared_statement_the_pooler_lost_runs_again_unprepared(app, conn, joblane_dsn, transaction_pool):
    with psycopg.connect(transaction_pool, autocommit=True, prepare_threshold=0) as c, \
            psycopg.connect(transaction_pool) as other:
        store._reach[c] = True  # taken for a direct connection: a pooler that looks like none
        first = app.enqueue(c, "record", {"i": 0})  # prepared on the server connection it was given
        other.execute("SELECT 1")  # holds that server connection (the last one released) in a transaction
        second = app.enqueue(c, "record", {"i": 1})  # on another server connection, without the statement
        assert store._reach[c] is False  # ... so joblane never prepares on this connection again
        other.rollback()
        more = [app.enqueue(c, "record", {"i": i}) for i in range(2, 12)]
    assert len({first, second, *more}) == 12
    assert count(conn, app) == 12
    # inside the caller's transaction the error is the caller's: it is aborted, nothing runs again (a new
    # PgBouncer: the server connections of the one above keep their statements, as transaction pooling does)
    with pgbouncer(joblane_dsn, pool_mode="transaction") as pool, \
            psycopg.connect(pool, prepare_threshold=0) as c, psycopg.connect(pool) as other:
        store._reach[c] = True
        with c.transaction():
            app.enqueue(c, "record", {"i": 12})
        other.execute("SELECT 1")
        with pytest.raises(psycopg.errors.InvalidSqlStatementName), c.transaction():
            app.enqueue(c, "record", {"i": 13})
        assert store._reach[c] is False
        other.rollback()
        with c.transaction():
            app.enqueue(c, "record", {"i": 14})
    assert count(conn, app) == 14


def test_a_direct_connection_is_told_by_its_two_ends(joblane_dsn, conn):
    info = conninfo_to_dict(joblane_dsn)
    with psycopg.connect(joblane_dsn) as c:
        # TCP: the ends the server sees are the socket's own; a unix socket: one of the server's
        assert store.reaches_server(c) is True
    folders = [d.strip() for d in conn.execute("SHOW unix_socket_directories").fetchone()[0].split(",") if d.strip()]
    if not folders:
        pytest.skip("the server listens on no unix socket")
    port = conn.execute("SHOW port").fetchone()[0]
    over_socket = {**info, "host": folders[0], "port": port}
    with psycopg.connect(**over_socket) as c:
        assert store.reaches_server(c) is True
    role = f"jl_reach_{uuid.uuid4().hex[:10]}"
    conn.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        # a role that may not read unix_socket_directories cannot tell its socket from a pooler's: not prepared on
        with psycopg.connect(**{**over_socket, "user": role}) as c:
            assert store.reaches_server(c) is False
    finally:
        conn.execute(f'DROP ROLE "{role}"')
