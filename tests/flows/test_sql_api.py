"""The SQL API: enqueue, publish and signal as functions, for triggers and producers that are not Python."""

from __future__ import annotations

import subprocess

import psycopg
import pytest

from joblane.queries import quote_ident
from tests.conftest import count, table, wait_until
from tests.flows.test_dependencies import APP, flow_app, runs_of  # noqa: F401 - the fixture

pytestmark = pytest.mark.usefixtures("flow_app")


def notifications(listener: psycopg.Connection) -> list[tuple[str, str]]:
    return [(n.channel, n.payload) for n in listener.notifies(timeout=0.5, stop_after=1)]


def test_enqueue_from_a_trigger_rolled_back_and_committed(app, conn):
    s = quote_ident(app.schema)
    conn.execute(f"CREATE TABLE {s}.orders (id bigint PRIMARY KEY, total numeric)")
    conn.execute(f"""
        CREATE FUNCTION {s}.order_placed() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM {s}.enqueue('step', jsonb_build_object('order', NEW.id), queue => 'orders', priority => 1);
            RETURN NEW;
        END $$;
        CREATE TRIGGER order_placed AFTER INSERT ON {s}.orders FOR EACH ROW EXECUTE FUNCTION {s}.order_placed();
    """)
    with psycopg.connect(app.dsn, autocommit=True) as listener:
        listener.execute(f"LISTEN {app.channel}")
        with pytest.raises(RuntimeError):
            with psycopg.connect(app.dsn) as tx:
                tx.execute(f"INSERT INTO {s}.orders VALUES (1, 10)")
                assert count(tx, app, "kind = 'step'") == 1
                raise RuntimeError("the order failed")
        assert count(conn, app) == 0
        assert notifications(listener) == [], "a rolled-back enqueue wakes nobody"
        with psycopg.connect(app.dsn) as tx:
            tx.execute(f"INSERT INTO {s}.orders VALUES (2, 20)")
        # the same channel and payload (the queue) as App.enqueue: an idle worker of that queue wakes up
        assert notifications(listener) == [(app.channel, "orders")]
    row = conn.execute(f"SELECT queue, kind, payload, priority, state FROM {table(app, 'jobs')}").fetchone()
    assert row == ("orders", "step", {"order": 2}, 1, "pending")


def test_a_psql_session_as_the_producer(app, conn, spawn_worker):
    spawn_worker(APP, app.schema, "-c", "4")
    s = quote_ident(app.schema)
    script = f"""
        BEGIN;
        SELECT {s}.enqueue('step', '{{"from": "psql"}}');
        SELECT {s}.enqueue('waiter', '{{"key": "review:9"}}', unique_key => 'review-9');
        SELECT {s}.enqueue('waiter', '{{"key": "review:9"}}', unique_key => 'review-9');
        COMMIT;
    """
    out = subprocess.run(["psql", app.dsn, "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-c", script],
                         capture_output=True, text=True, check=True).stdout.split()
    first, waiter, same = (int(x) for x in out)
    assert same == waiter  # the unfinished job holding the unique key
    wait_until(lambda: app.get_job(first, conn)["state"] == "done", message="the psql job to run")
    wait_until(lambda: app.get_job(waiter, conn)["state"] == "waiting", message="the wait")
    subprocess.run(["psql", app.dsn, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-c",
                    f"""SELECT {s}.signal('review:9', '{{"verdict": "ok"}}')"""], check=True, capture_output=True)
    wait_until(lambda: app.get_job(waiter, conn)["state"] == "done", message="the signalled job")
    assert app.get_job(waiter, conn)["result"]["signal"] == {"verdict": "ok"}
    assert runs_of(conn, app, first) == 1


@pytest.mark.parametrize("call, message", [
    ("enqueue('', '{}')", "kind must be"),
    ("enqueue('step', '{}', queue => 'bad queue')", "invalid queue name"),
    ("enqueue('step', '{}', priority => 40000)", "priority must be"),
    ("enqueue('step', '{}', max_attempts => 0)", "max_attempts must be"),
    ("publish('', '{}')", "topic must be"),
    ("publish('t', '{}', headers => '[1]')", "headers must be"),
    ("signal('', NULL)", "signal key"),
])
def test_the_sql_api_refuses_what_python_refuses(app, conn, call, message):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        conn.execute(f"SELECT {quote_ident(app.schema)}.{call}")


def test_publish_from_sql(app, conn):
    s = quote_ident(app.schema)
    with psycopg.connect(app.dsn, autocommit=True) as listener:
        listener.execute(f"LISTEN {app.schema}_outbox")
        with psycopg.connect(app.dsn) as tx:
            first = tx.execute(f"SELECT {s}.publish('crm.lead', '{{\"lead\": 7}}', key => 'lead-7')").fetchone()[0]
            second = tx.execute(f"SELECT {s}.publish('crm.lead', '{{}}', idempotency_key => 'lead-7-v2')").fetchone()[0]
        assert notifications(listener) == [(f"{app.schema}_outbox", "")]
    rows = conn.execute(f"SELECT id, topic, key, idempotency_key, payload, state FROM {table(app, 'outbox')} ORDER BY id"
                        ).fetchall()
    assert rows == [(first, "crm.lead", "lead-7", f"outbox:{first}", {"lead": 7}, "pending"),
                    (second, "crm.lead", None, "lead-7-v2", {}, "pending")]


def test_the_workflow_functions_check_what_they_write(app, conn):
    s = quote_ident(app.schema)
    job = app.enqueue(conn, "step", {}, delay=3600)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="on_parent_failure"):
        conn.execute(f"SELECT * FROM {s}.link_jobs(ARRAY[{job}]::bigint[], ARRAY[{job}]::bigint[], ARRAY['maybe'])")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="on_timeout"):
        conn.execute(f"""SELECT {s}.park_jobs('[{{"id": {job}, "attempt": 1, "key": "k", "on_timeout": "never"}}]', 'w')""")
