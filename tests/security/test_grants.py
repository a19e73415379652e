"""Least privilege: `joblane grants` statements, applied to real roles, are enough and no more."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.parse
import uuid

import psycopg
import pytest

import joblane
from joblane import grants, migrations
from joblane.queries import quote_ident
from joblane.testing import new_schema_name

from ..conftest import ROOT, count, table, wait_until
from ..helpers import run_sql

APP = "tests.security.apps:app"


@pytest.fixture
def make_role(conn):
    """Create throwaway roles (cluster-wide names, so unique per test); drop them and what they hold after."""
    made: list[str] = []

    def make(kind: str, *, login: bool = False) -> str:
        name = f"jl_{kind}_{uuid.uuid4().hex[:10]}"
        conn.execute(f'CREATE ROLE "{name}" {"LOGIN" if login else "NOLOGIN"}')
        made.append(name)
        return name

    yield make
    for name in made:
        conn.execute(f'DROP OWNED BY "{name}" CASCADE')
        conn.execute(f'DROP ROLE "{name}"')


def apply(conn, role: str, user: str, schema: str) -> list[str]:
    """Run what `joblane grants` prints, through the real command line."""
    out = subprocess.run(
        [sys.executable, "-m", "joblane", "--schema", schema, "grants", "--role", role, "--user", user],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    statements = [line for line in out.stdout.splitlines() if line and not line.startswith("--")]
    for statement in statements:
        conn.execute(statement)
    return statements


def as_user(dsn: str, user: str) -> str:
    parts = urllib.parse.urlsplit(dsn)
    if parts.scheme not in ("postgresql", "postgres"):
        pytest.skip("DATABASE_URL is not a postgresql:// URL, so the test cannot log in as another role")
    host = parts.netloc.rsplit("@", 1)[-1]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{urllib.parse.quote(user)}@{host}"))


def denied(conn, sql: str, params=()) -> bool:
    try:
        conn.execute(sql, params)
    except psycopg.errors.InsufficientPrivilege:
        return True
    return False


def test_every_table_has_a_row_in_the_grants_table(conn, joblane_schema):
    # the partitions of attempts come and go with its generations: reached through its grants, never named
    tables = {r[0] for r in conn.execute(
        "SELECT c.relname FROM pg_class c WHERE c.relnamespace = %s::regnamespace AND c.relkind IN ('r', 'p')"
        " AND NOT EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent"
        "                  WHERE i.inhrelid = c.oid AND p.relname = ANY(%s))",
        (joblane_schema, list(grants.PARTITIONED))).fetchall()}
    assert tables == set(grants.TABLES), "add the new table to joblane.grants.TABLES"


def test_statements_quote_every_name():
    sql = "\n".join(grants.statements("app", 'we"ird; DROP ROLE x; --', "s1"))
    assert '"we""ird; DROP ROLE x; --"' in sql and '"s1"."jobs"' in sql
    assert grants.quote_role("lè_rôle") == '"lè_rôle"'
    for bad in ("", "a\x00b", "x" * 64):
        with pytest.raises(joblane.JoblaneError):
            grants.statements("app", bad, "s1")
    with pytest.raises(joblane.JoblaneError, match="database"):
        grants.statements("admin", "a", "s1", None)
    with pytest.raises(joblane.JoblaneError, match="unknown role"):
        grants.statements("root", "a", "s1")


def test_app_role_enqueues_and_publishes_but_cannot_read_or_alter_jobs(app, conn, joblane_dsn, make_role):
    role = make_role("app")
    apply(conn, "app", role, app.schema)
    secret = app.enqueue(conn, "echo", {"card": "4111"})  # someone else's job
    with psycopg.connect(joblane_dsn, autocommit=True) as c:
        c.execute(f'SET ROLE "{role}"')
        with c.transaction():
            own = app.enqueue(c, "echo", {"mine": 1})
            again = app.enqueue(c, "echo", {"mine": 2}, unique_key="tenant-1")
            assert app.enqueue(c, "echo", {"mine": 3}, unique_key="tenant-1") == again
            many = app.enqueue_many(c, [("echo", {"i": i}) for i in range(3)])
            message = app.publish(c, "lead.created", {"id": 1})
            assert app.inbox(c, "msg-1") is True
            assert app.inbox(c, "msg-1") is False
        assert len(many) == 3 and message > 0
        for sql in (
            f"SELECT payload FROM {table(app, 'jobs')}",
            f"SELECT * FROM {table(app, 'jobs')} WHERE id = {secret}",
            f"SELECT result, last_error, kind FROM {table(app, 'jobs')}",
            f"UPDATE {table(app, 'jobs')} SET state = 'done' WHERE id = {secret}",
            f"UPDATE {table(app, 'jobs')} SET payload = '{{}}' WHERE id = {own}",
            f"DELETE FROM {table(app, 'jobs')} WHERE id = {secret}",
            f"TRUNCATE {table(app, 'jobs')}",
            f"SELECT * FROM {table(app, 'attempts')}",
            f"INSERT INTO {table(app, 'attempts')} (job_id, attempt, outcome) VALUES ({secret}, 1, 'done')",
            f"SELECT payload FROM {table(app, 'outbox')}",
            f"UPDATE {table(app, 'outbox')} SET state = 'sent'",
            f"DELETE FROM {table(app, 'inbox')}",
            f"CREATE TABLE {table(app, 'mine')} (x int)",
        ):
            assert denied(c, sql), sql
        # the same from a job the role wrote itself: enqueueing does not make it the reader
        assert denied(c, f"SELECT payload FROM {table(app, 'jobs')} WHERE id = %s", (own,))
    assert app.get_job(secret, conn)["payload"] == {"card": "4111"}
    assert count(conn, app, "state = 'pending'") == 1 + 1 + 1 + 3


def test_worker_role_runs_jobs_relays_rescues_and_prunes(app, conn, joblane_dsn, make_role, spawn_worker,
                                                         tmp_path):
    writer, runner = make_role("app"), make_role("worker", login=True)
    apply(conn, "app", writer, app.schema)
    apply(conn, "worker", runner, app.schema)
    with psycopg.connect(joblane_dsn, autocommit=True) as c:
        c.execute(f'SET ROLE "{writer}"')
        echo = app.enqueue_many(c, [("echo", {"i": i}) for i in range(20)])
        refused = app.enqueue(c, "refuse", {})
        held = app.enqueue(c, "review", {})
        limited = app.enqueue_many(c, [("limited", {"i": i}, "limited") for i in range(5)])
        paused = app.enqueue(c, "pauses", {}, queue="pausable")
    # a dead worker's job and an old finished job, for the rescuer and the pruner
    lost = conn.execute(
        f"INSERT INTO {table(app, 'jobs')} (kind, state, attempts, lease_until, worker)"
        " VALUES ('echo', 'running', 1, now() - interval '1 minute', 'gone:1') RETURNING id").fetchone()[0]
    old = conn.execute(
        f"INSERT INTO {table(app, 'jobs')} (kind, state, attempts, finished_at)"
        " VALUES ('echo', 'done', 1, now() - interval '2 hours') RETURNING id").fetchone()[0]
    w = spawn_worker(APP, app.schema, "--lease", "3", "--poll-interval", "0.1", "--retention", "3600",
                     env={"DATABASE_URL": as_user(joblane_dsn, runner)})
    try:
        wait_until(lambda: count(conn, app, "state IN ('pending', 'running')") == 0, timeout=60,
                   message="the worker role finishing every job")
        wait_until(lambda: count(conn, app, "kind = 'tick' AND state = 'done'") >= 1, timeout=30,
                   message="the periodic scheduler under the worker role enqueueing a tick")
    except AssertionError as exc:
        w.stop()
        raise AssertionError(f"{exc}\n{w.output()[-3000:]}") from None
    states = dict(conn.execute(f"SELECT id, state FROM {table(app, 'jobs')}").fetchall())
    assert all(states[i] == "done" for i in echo + [lost] + limited + [paused])
    for name in ("queue_limits", "queue_starts", "queue_pauses", "periodic_ticks"):
        assert conn.execute(f"SELECT count(*) FROM {table(app, name)}").fetchone()[0] > 0, name
    assert (states[refused], states[held]) == ("failed", "held")
    assert old not in states, "pruned"
    assert conn.execute(f"SELECT count(*) FROM {table(app, 'job_steps')}").fetchone()[0] == len(echo) + 1
    outcomes = dict(conn.execute(
        f"SELECT job_id, array_agg(outcome ORDER BY id) FROM {table(app, 'attempts')} GROUP BY job_id").fetchall())
    assert outcomes[lost] == ["lost", "done"]
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.output()
    assert "permission denied" not in w.output(), w.output()[-3000:]  # the pruner's generations too
    # the relay runs under the worker role too
    with psycopg.connect(joblane_dsn, autocommit=True) as c:
        c.execute(f'SET ROLE "{writer}"')
        with c.transaction():
            messages = [app.publish(c, "t.lead", {"i": i}) for i in range(10)]
    sink = tmp_path / "sink.log"
    relay = subprocess.Popen(
        [sys.executable, "-m", "joblane", "relay", APP, "--poll-interval", "0.1", "--log-format", "json"],
        cwd=ROOT, env={**os.environ, "DATABASE_URL": as_user(joblane_dsn, runner), "JOBLANE_SCHEMA": app.schema,
                       "PYTHONPATH": str(ROOT), "SECURITY_SINK": str(sink)},
        stdout=open(tmp_path / "relay.log", "w"), stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: conn.execute(f"SELECT count(*) FROM {table(app, 'outbox')} WHERE state = 'sent'")
                   .fetchone()[0] == 10, timeout=60, message="the relay under the worker role delivering")
    finally:
        relay.send_signal(signal.SIGTERM)
        code = relay.wait(30)
    assert code == 0, (tmp_path / "relay.log").read_text()[-2000:]
    assert sorted(json.loads(line)[0] for line in sink.read_text().splitlines()) == sorted(
        f"outbox:{i}" for i in messages)
    with psycopg.connect(as_user(joblane_dsn, runner), autocommit=True) as c:
        for sql in (
            f"CREATE TABLE {table(app, 'mine')} (x int)",
            f"DROP TABLE {table(app, 'attempts')}",
            f"ALTER TABLE {table(app, 'jobs')} ADD COLUMN x int",
            f"TRUNCATE {table(app, 'jobs')}",
            f"DELETE FROM {table(app, 'inbox')}",
            f"DELETE FROM {table(app, 'migrations')}",
        ):
            assert denied(c, sql), sql


def test_admin_role_migrates_a_new_schema_and_takes_over_an_existing_one(app, conn, joblane_dsn, make_role):
    admin = make_role("admin")
    database = conn.execute("SELECT current_database()").fetchone()[0]
    for line in grants.statements("admin", admin, app.schema, database):
        if not line.startswith("--"):
            conn.execute(line)
    job = app.enqueue(conn, "echo", {})
    fresh = new_schema_name("adm")
    try:
        with psycopg.connect(joblane_dsn, autocommit=True) as c:
            c.execute(f'SET ROLE "{admin}"')
            # an existing install, now owned by the admin role: migrate, operate, alter
            assert app.migrate(c) == []
            assert app.cancel(c, ids=[job], reason="by the admin") == [job]
            assert app.retry(c, ids=[job]) == [job]
            c.execute(f"ALTER TABLE {table(app, 'jobs')} ADD COLUMN future_migration int")
            # a fresh schema: the admin role creates it and owns what it creates
            other = joblane.App(joblane_dsn, schema=fresh)
            assert other.migrate(c) == migrations.versions()
            other.enqueue(c, "echo", {})
        owner = conn.execute("SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = %s",
                             (fresh,)).fetchone()[0]
        assert owner.strip('"') == admin
    finally:
        conn.execute(f'DROP SCHEMA IF EXISTS "{fresh}" CASCADE')


def test_grants_command_errors_are_one_line():
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    for args in (["grants", "--role", "admin", "--user", "a"], ["grants", "--role", "app", "--user", ""],
                 ["--schema", "x;y", "grants", "--role", "app"]):
        out = subprocess.run([sys.executable, "-m", "joblane", *args], cwd=ROOT, capture_output=True, text=True,
                             timeout=60, env=env)
        assert out.returncode == 1
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr


def test_app_role_runs_workflows_through_the_functions_only(app, conn, joblane_dsn, make_role):
    role = make_role("app")
    apply(conn, "app", role, app.schema)
    app.declare("echo")
    with psycopg.connect(joblane_dsn, autocommit=True) as c:
        c.execute(f'SET ROLE "{role}"')
        with c.transaction():
            parent = app.enqueue(c, "echo", {})
            child = app.enqueue(c, "echo", {}, after=[parent])
            batch = app.batch(c, on_complete=("echo", {}))
            app.enqueue(c, "echo", {}, batch=batch)
            batch.seal(c)
            assert app.signal(c, "approval:1", {"ok": True}) == 0
            sql_id = c.execute(f"SELECT {quote_ident(app.schema)}.enqueue('echo', '{{}}')").fetchone()[0]
        for sql in (
            f"SELECT {quote_ident(app.schema)}.release_children({parent}, 'done')",
            f"SELECT {quote_ident(app.schema)}.finish_batch({batch.id})",
            f"UPDATE {table(app, 'jobs')} SET state = 'pending' WHERE id = {child}",
            f"SELECT * FROM {table(app, 'signals')}",
            f"DELETE FROM {table(app, 'batches')}",
        ):
            assert denied(c, sql), sql
    assert app.get_job(child, conn)["state"] == "waiting" and sql_id > child
    assert app.batch_progress(batch.id, conn)["sealed_at"] is not None


def test_insert_job_needs_no_grant_of_its_own_and_gives_none(app, conn, joblane_dsn, make_role):
    """insert_job runs as its caller: a role granted before schema version 7 (no EXECUTE on it) keeps
    enqueueing, and a role without INSERT on jobs cannot insert through it."""
    s = quote_ident(app.schema)
    signature = f"{s}.insert_job(text, text, text, integer, integer, timestamptz, double precision, text, bigint," \
                " boolean, text, text)"
    before = make_role("app")
    apply(conn, "app", before, app.schema)
    conn.execute(f'REVOKE EXECUTE ON FUNCTION {signature} FROM "{before}"')  # what a version-6 grant lacked
    outsider = make_role("app")
    conn.execute(f'GRANT USAGE ON SCHEMA {s} TO "{outsider}"')
    call = f"SELECT {s}.insert_job('default', 'echo', '{{}}', 0, 1, NULL, 0, 'pending', NULL, false, 'x', NULL)"
    with psycopg.connect(joblane_dsn, autocommit=True) as c:
        c.execute(f'SET ROLE "{before}"')
        job = app.enqueue(c, "echo", {"n": 1})
        c.execute(f'SET ROLE "{outsider}"')
        assert denied(c, call)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.enqueue(c, "echo", {"n": 2})
    assert app.get_job(job, conn)["state"] == "pending"
    assert count(conn, app, "true") == 1


def test_claim_jobs_needs_no_grant_of_its_own_and_gives_none(app, conn, joblane_dsn, make_role):
    """claim_jobs runs as its caller: a worker role granted before schema version 8 (no EXECUTE on it)
    keeps claiming, and the app role, which may not change jobs, cannot claim through it."""
    s = quote_ident(app.schema)
    signature = f"{s}.claim_jobs(text[], integer, text, double precision, boolean)"
    job = app.enqueue(conn, "echo", {"n": 1})
    conn.commit()
    before = make_role("worker")
    apply(conn, "worker", before, app.schema)
    conn.execute(f'REVOKE EXECUTE ON FUNCTION {signature} FROM "{before}"')  # what a version-7 grant lacked
    writer = make_role("app")
    apply(conn, "app", writer, app.schema)
    with psycopg.connect(joblane_dsn, autocommit=True) as c:
        c.execute(f'SET ROLE "{writer}"')
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            run_sql(c, app.queries.claim_jobs, [["default"], 10, "w-app", 30.0])
        c.execute(f'SET ROLE "{before}"')
        [row] = run_sql(c, app.queries.claim_jobs, [["default"], 10, "w-old", 30.0])
    assert row[0] == job
    assert app.get_job(job, conn)["state"] == "running" and app.get_job(job, conn)["worker"] == "w-old"
