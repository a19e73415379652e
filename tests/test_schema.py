"""Migrations, the query catalogue and the claim's query plan."""

from __future__ import annotations

import threading

import psycopg
import pytest

import joblane
from joblane import migrations
from joblane.queries import Queries, catalogue, parse, quote_ident, validate_schema
from joblane.testing import isolated_schema, new_schema_name
from .helpers import run_sql


def test_migrate_twice_is_a_no_op(joblane_dsn):
    with isolated_schema(joblane_dsn, migrate=False) as schema:
        app = joblane.App(joblane_dsn, schema=schema)
        assert app.migrate() == list(range(1, migrations.latest_version() + 1))
        assert app.migrate() == []
        with app.connect() as conn:
            assert migrations.check(conn, schema) == migrations.latest_version()


def test_concurrent_migrations_apply_once(joblane_dsn):
    with isolated_schema(joblane_dsn, migrate=False) as schema:
        results, errors = [], []

        def run():
            try:
                results.append(joblane.App(joblane_dsn, schema=schema).migrate())
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=run) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert sorted(map(len, results)) == [0, 0, 0, migrations.latest_version()]


def test_newer_database_is_refused(joblane_dsn, joblane_schema):
    with psycopg.connect(joblane_dsn, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {quote_ident(joblane_schema)}.migrations (version, name) VALUES (999, 'future')")
        with pytest.raises(joblane.SchemaVersionError, match="newer than this joblane"):
            migrations.migrate(conn, joblane_schema)
        with pytest.raises(joblane.SchemaVersionError, match="upgrade joblane"):
            migrations.check(conn, joblane_schema)


def test_missing_schema_says_run_migrate(joblane_dsn):
    with psycopg.connect(joblane_dsn, autocommit=True) as conn:
        with pytest.raises(joblane.SchemaVersionError, match="joblane migrate"):
            migrations.check(conn, new_schema_name("absent"))


@pytest.mark.parametrize("name", ["", "1abc", 'x"; DROP TABLE jobs; --', "a b", "é", "x" * 49, "a;b", None])
def test_hostile_schema_names_are_rejected(name):
    with pytest.raises((ValueError, joblane.JoblaneError)):
        validate_schema(name)
    with pytest.raises((ValueError, joblane.JoblaneError)):
        joblane.App("postgresql://unused", schema=name if name is not None else 12)


def test_every_named_query_prepares(joblane_dsn, joblane_schema):
    """A typo in any .sql file fails here: each query is prepared against a migrated schema."""
    queries = Queries(joblane_schema)
    assert len(queries.names()) >= 10
    for name, query in catalogue().items():
        assert query.description, name
    with psycopg.connect(joblane_dsn, autocommit=True) as conn:
        for name in queries.names():
            sql = getattr(queries, name)
            result = conn.pgconn.prepare(f"q_{name}".encode(), sql.encode())
            assert result.status == psycopg.pq.ExecStatus.COMMAND_OK, (name, result.error_message)


def test_catalogue_parser_rejects_missing_description():
    with pytest.raises(ValueError, match="description"):
        parse("-- name: broken\nSELECT 1;\n")
    with pytest.raises(ValueError, match="twice"):
        parse("-- name: a\n-- one\nSELECT 1;\n-- name: a\n-- two\nSELECT 2;\n")


def test_claim_reads_the_partial_index(joblane_dsn, joblane_schema):
    """The claim must walk jobs_ready, not scan or sort the table, however many jobs wait."""
    app = joblane.App(joblane_dsn, schema=joblane_schema)
    with app.connect() as conn:
        jobs = quote_ident(joblane_schema) + ".jobs"
        conn.execute(
            f"INSERT INTO {jobs} (queue, kind, payload, state, finished_at)"
            " SELECT 'q' || (i % 3), 'k', '{}', CASE WHEN i % 4 = 0 THEN 'pending' ELSE 'done' END,"
            " CASE WHEN i % 4 = 0 THEN NULL ELSE now() END FROM generate_series(1, 20000) i"
        )
        conn.execute(f"ANALYZE {jobs}")
        plan = run_sql(conn, "EXPLAIN " + app.queries.claim_jobs, [["q0", "q1"], 10, "w", 30.0])
        text = "\n".join(r[0] for r in plan)
        assert "jobs_ready" in text, text
        assert "Seq Scan" not in text and "Sort Key: j.priority" not in text.split("Limit")[-1], text


@pytest.mark.parametrize("claim", [1, 10, 50, 200, 500])
def test_the_claim_stays_an_index_scan_with_a_million_jobs_waiting(million_pending, claim):
    """PGMQ's trap: a plan that flips to a sequential scan or a hash join once the backlog is large.

    With 1,000,000 pending jobs (and finished ones beside them), every claim
    size walks jobs_ready per queue and updates through the primary key.
    """
    app, conn = million_pending
    plan = run_sql(conn, "EXPLAIN " + app.queries.claim_jobs, [["q0", "q1"], claim, "w", 30.0])
    text = "\n".join(r[0] for r in plan)
    assert "jobs_ready" in text and "jobs_pkey" in text, text
    assert "Seq Scan" not in text and "Hash" not in text, text
    assert "Sort Key: j.priority" not in text.split("Limit")[-1], text  # no sort of the queue's backlog


@pytest.fixture(scope="module")
def million_pending(joblane_dsn):
    """A schema with 1,000,000 pending jobs in three queues and 100,000 finished ones, analysed."""
    with isolated_schema(joblane_dsn, new_schema_name("million")) as schema:
        app = joblane.App(joblane_dsn, schema=schema)
        with app.connect() as conn:
            jobs = quote_ident(schema) + ".jobs"
            conn.execute(
                f"INSERT INTO {jobs} (queue, kind, payload, priority, run_after)"
                " SELECT 'q' || (i % 3), 'k', '{}', (i % 5)::smallint, now() - make_interval(secs => i % 1000)"
                " FROM generate_series(1, 1000000) AS i")
            conn.execute(
                f"INSERT INTO {jobs} (queue, kind, payload, state, finished_at)"
                " SELECT 'q' || (i % 3), 'k', '{}', 'done', now() FROM generate_series(1, 100000) AS i")
            conn.execute(f"ANALYZE {jobs}")
            yield app, conn


def test_schema_sql_is_what_the_migrations_produce(joblane_dsn, joblane_schema):
    """sql/schema.sql is the reviewable dump; regenerate it with `python -m joblane.schema_dump`."""
    from joblane.schema_dump import SCHEMA_FILE, dump

    committed = SCHEMA_FILE.read_text()
    with psycopg.connect(joblane_dsn, autocommit=True) as conn:
        assert dump(conn, joblane_schema) == committed, "a migration changed the schema: run python -m joblane.schema_dump"
        # and the dump itself builds the same catalog
        with isolated_schema(joblane_dsn, migrate=False) as fresh:
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(fresh)}")
            conn.execute(committed.replace("{schema}", quote_ident(fresh)))
            assert dump(conn, fresh) == committed
