"""Migrations, the query catalogue and the claim's query plan."""

from __future__ import annotations

import threading

import psycopg
import pytest

import joblane
from joblane import migrations
from joblane.queries import Queries, catalogue, parse, quote_ident, validate_schema
from joblane.store import outcome_rows
from joblane.testing import isolated_schema, new_schema_name
from joblane.types import Outcome
from .helpers import run_sql


def test_migrate_twice_is_a_no_op(joblane_dsn):
    with isolated_schema(joblane_dsn, migrate=False) as schema:
        app = joblane.App(joblane_dsn, schema=schema)
        assert app.migrate() == migrations.versions()
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
        assert sorted(map(len, results)) == [0, 0, 0, len(migrations.versions())]


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


def statement_plans(conn, sql: str, args, types: str | None = None) -> dict[str, str]:
    """EXPLAIN of a statement (no rows written): the plan made for ``args``, and its generic plan
    (``types``: the parameters' types, where the statement does not say them)."""
    custom = "\n".join(r[0] for r in run_sql(conn, "EXPLAIN " + sql, args))
    cur = psycopg.ClientCursor(conn)
    with conn.transaction():
        cur.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cur.execute("PREPARE probe" + (f"({types})" if types else "") + " AS " + sql)
        try:
            cur.execute("EXPLAIN EXECUTE probe(" + ", ".join(["%s"] * len(args)) + ")", args)
            generic = "\n".join(r[0] for r in cur.fetchall())
        finally:
            cur.execute("DEALLOCATE probe")
    return {"custom": custom, "generic": generic}


def index_reads(conn, schema: str) -> dict[str, int]:
    """Index scans so far of every index of ``schema`` (pg_stat_user_indexes; call flush_stats in the sessions
    that ran the statements first)."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return {r[0]: r[1] for r in conn.execute(
        "SELECT indexrelname, idx_scan FROM pg_stat_user_indexes WHERE schemaname = %s", (schema,))}


def claim_and_flush(conn, app, queues: list[str], n: int) -> list:
    """claim_jobs once, then this session's statistics reported at once (PostgreSQL 15's
    pg_stat_force_next_flush; otherwise they are flushed at most once a second)."""
    rows = run_sql(conn, app.queries.claim_jobs, [queues, n, "w", 30.0])
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT 1")  # the flush happens when the session goes idle after a statement
    return rows


def test_claim_reads_its_lane_not_the_jobs_indexes(joblane_dsn, joblane_schema):
    """The claim reads the lanes' ready entries and cursor rows, then the jobs it took by primary key: no
    other index of jobs (jobs_ready, walked by version 12, passes every dead version a held snapshot
    keeps) and no sequential scan of jobs."""
    app = joblane.App(joblane_dsn, schema=joblane_schema)
    jobs = quote_ident(joblane_schema) + ".jobs"
    with psycopg.connect(joblane_dsn, autocommit=True) as conn, psycopg.connect(joblane_dsn, autocommit=True) as obs:
        conn.execute(
            f"INSERT INTO {jobs} (queue, kind, payload, state, finished_at)"
            " SELECT 'q' || (i % 3), 'k', '{}', CASE WHEN i % 4 = 0 THEN 'pending' ELSE 'done' END,"
            " CASE WHEN i % 4 = 0 THEN NULL ELSE now() END FROM generate_series(1, 20000) i")
        conn.execute(f"ANALYZE {jobs}")
        claim_and_flush(conn, app, ["q0", "q1"], 10)  # plans made, lanes' first cursors written
        before = index_reads(obs, joblane_schema)
        seq_before = obs.execute("SELECT seq_scan FROM pg_stat_user_tables WHERE relid = %s::regclass",
                                 (jobs,)).fetchone()[0]
        taken = sum(len(claim_and_flush(conn, app, ["q0", "q1"], 10)) for _ in range(20))
        after = index_reads(obs, joblane_schema)
        seq_after = obs.execute("SELECT seq_scan FROM pg_stat_user_tables WHERE relid = %s::regclass",
                                (jobs,)).fetchone()[0]
    assert taken == 200
    used = {name for name in after if after[name] > before.get(name, 0)}
    assert "jobs_pkey" in used and any(name.startswith("ready_") for name in used), used
    assert not {name for name in used if name.startswith("jobs_") and name != "jobs_pkey"}, used
    assert seq_after == seq_before


def test_the_claim_function_is_the_claim_the_worker_sends(joblane_dsn, joblane_schema):
    """The named query claim_jobs calls the function, and the function claims in order, pauses honoured."""
    app = joblane.App(joblane_dsn, schema=joblane_schema)
    assert f"{quote_ident(joblane_schema)}.claim_jobs(" in app.queries.claim_jobs
    with app.connect() as conn:
        jobs = quote_ident(joblane_schema) + ".jobs"
        conn.execute(f"INSERT INTO {jobs} (queue, kind, payload, priority) VALUES"
                     " ('a', 'k', '{\"n\": 1}', 1), ('a', 'k', '{\"n\": 2}', 0), ('b', 'k', '{}', 0),"
                     " ('paused', 'k', '{}', 0)")
        conn.execute(f"INSERT INTO {quote_ident(joblane_schema)}.queue_pauses (queue, until)"
                     " VALUES ('paused', now() + interval '1 hour')")
        conn.commit()
        [first] = run_sql(conn, app.queries.claim_jobs, [["a", "paused"], 1, "w-1", 30.0])
        assert (first[1], first[3], first[4]) == ("a", '{"n": 2}', 1)  # priority 0 before 1; attempts counted
        rows = run_sql(conn, app.queries.claim_jobs, [["a", "paused"], 5, "w-2", 30.0])
        assert [(r[1], r[3], r[4]) for r in rows] == [("a", '{"n": 1}', 1)]  # the paused queue gives nothing
        states = conn.execute(f"SELECT queue, state, worker, lease_until > now() FROM {jobs} ORDER BY id").fetchall()
        assert states == [("a", "running", "w-2", True), ("a", "running", "w-1", True), ("b", "pending", None, None),
                          ("paused", "pending", None, None)]


@pytest.mark.parametrize("claim", [1, 10, 200])
def test_the_claim_reads_a_few_pages_with_a_million_jobs_waiting(million_pending, claim):
    """PGMQ's trap was a plan that flips to a scan once the backlog is large. With 1,000,000 pending jobs
    (and finished ones beside them) the claim reads its lanes' entries after their cursors and the jobs
    it takes: the buffers of a claim grow with the jobs it takes, not with the backlog."""
    app, conn = million_pending
    with conn.transaction(force_rollback=True):  # the session's first call reads the catalog and plans
        conn.execute(f"SELECT * FROM {quote_ident(app.schema)}.claim_jobs(%s, %s, 'w', 30)", (["q0", "q1"], claim))
    with conn.transaction(force_rollback=True):
        lines = [r[0] for r in conn.execute(
            f"EXPLAIN (ANALYZE, BUFFERS) SELECT * FROM {quote_ident(app.schema)}.claim_jobs(%s, %s, 'w', 30)",
            (["q0", "q1"], claim))]
    buffers = int(next(line for line in lines if "Buffers:" in line).split("hit=")[1].split()[0].rstrip(","))
    rows = float(lines[0].split("rows=")[2].split()[0])  # PostgreSQL 18 prints it with decimals
    assert rows == claim, lines
    assert buffers < 200 + 40 * claim, lines  # each job taken: its row, 8 index entries, its lane entry


def test_completions_and_heartbeats_read_the_jobs_they_name_not_every_running_job(million_pending):
    """complete_jobs, delete_done and extend_leases reach their 200 jobs through the primary key. Through
    jobs_lease they would read all 5,000 running jobs of every worker and test each against the id array."""
    app, conn = million_pending
    jobs = quote_ident(app.schema) + ".jobs"
    with conn.transaction(force_rollback=True):  # the module's other tests see the million pending jobs again
        conn.execute(
            f"UPDATE {jobs} SET state = 'running', attempts = 1, lease_until = now() + interval '1 minute',"
            " worker = CASE WHEN id % 25 = 0 THEN 'w' ELSE 'elsewhere' END"
            f" WHERE id IN (SELECT id FROM {jobs} WHERE state = 'pending' ORDER BY id LIMIT 5000)")
        conn.execute(f"ANALYZE {jobs}")
        mine = [r[0] for r in conn.execute(f"SELECT id FROM {jobs} WHERE worker = 'w' ORDER BY id")]
        assert len(mine) == 200
        outcomes = outcome_rows([Outcome.done(i, 1, started_at=1.0, finished_at=2.0) for i in mine])
        for name, args in (("complete_jobs", (outcomes, "w")), ("delete_done", (mine, [1] * len(mine), "w")),
                           ("extend_leases", (mine, "w", 30.0))):
            for mode, text in statement_plans(conn, getattr(app.queries, name), args).items():
                assert "jobs_pkey" in text, (name, mode, text)
                assert "jobs_lease" not in text and "Seq Scan on jobs" not in text, (name, mode, text)


def test_an_upgrade_to_version_10_keeps_every_waiting_job_claimable_in_order(joblane_dsn):
    """Version 10 rebuilds jobs_ready on a hash of the queue's name: jobs that waited across the upgrade
    are claimed as before, by queue, priority and age, and a job claimed before it finishes after it."""
    with isolated_schema(joblane_dsn, migrate=False) as schema:
        app = joblane.App(joblane_dsn, schema=schema)
        jobs = quote_ident(schema) + ".jobs"
        # the claim as workers of versions 8 to 15 call it (four arguments)
        claim = f"SELECT * FROM {quote_ident(schema)}.claim_jobs($1::text[], $2::int, $3::text, $4::float8)"
        with app.connect() as conn:
            assert migrations.migrate(conn, schema, target=9) == list(range(1, 10))
            conn.execute(f"INSERT INTO {jobs} (queue, kind, payload, priority)"
                         " SELECT 'q' || (i % 2), 'k', jsonb_build_object('n', i), (i % 3)::smallint"
                         " FROM generate_series(1, 30) AS i")
            conn.commit()
            [running] = run_sql(conn, claim, [["q0"], 1, "before", 30.0])
            conn.commit()
            assert migrations.migrate(conn, schema, target=10) == [10]
            index = conn.execute("SELECT pg_get_indexdef(to_regclass(%s))", (f"{quote_ident(schema)}.jobs_ready",))
            assert "hashtext(queue)" in index.fetchone()[0]
            expected = conn.execute(
                f"SELECT id FROM {jobs} WHERE state = 'pending' AND queue = 'q0' ORDER BY priority, run_after, id"
            ).fetchall()
            first = run_sql(conn, claim, [["q0"], 5, "after", 30.0])
            rest = run_sql(conn, claim, [["q0"], 100, "after", 30.0])
            conn.commit()
            assert len(expected) == 14
            assert {r[0] for r in first} == {r[0] for r in expected[:5]}  # priority, then age, as before
            assert {r[0] for r in rest} == {r[0] for r in expected[5:]}
            finished = run_sql(conn, app.queries.complete_jobs, [
                '[{"id": %d, "attempt": 1, "state": "done", "outcome": "done", "refund": 0,'
                ' "started_at": 0, "finished_at": 0}]' % running[0], "before"])
            conn.commit()
            assert [r[0] for r in finished] == [running[0]]
            assert len(run_sql(conn, claim, [["q1"], 100, "after", 30.0])) == 15


def test_queues_whose_names_share_a_hash_keep_their_jobs_apart(joblane_dsn, joblane_schema):
    """jobs_ready is keyed by hashtext(queue): a claim, the drain count and the dashboard's counts of one
    queue never take or count the jobs of another queue whose name has the same hash."""
    app = joblane.App(joblane_dsn, schema=joblane_schema)
    with app.connect() as conn:
        [(a, b)] = conn.execute(
            "SELECT 'q22137', n FROM (SELECT 'q' || i AS n FROM generate_series(1, 1000000) AS i) AS s"
            " WHERE hashtext(n) = hashtext('q22137') AND n <> 'q22137' LIMIT 1").fetchall()
        assert conn.execute("SELECT hashtext(%s) = hashtext(%s)", (a, b)).fetchone()[0]
        jobs = quote_ident(joblane_schema) + ".jobs"
        conn.execute(f"INSERT INTO {jobs} (queue, kind, payload, priority)"
                     " SELECT CASE WHEN i %% 2 = 0 THEN %s ELSE %s END, 'k', jsonb_build_object('n', i), 0"
                     " FROM generate_series(1, 40) AS i", (a, b))
        conn.commit()
        assert run_sql(conn, app.queries.unfinished_count, [[a]]) == [(20,)]
        counts = {(r[0], r[1]): r[2] for r in run_sql(conn, app.queries.dashboard_queue_counts, [])}
        assert counts[(a, "pending")] == 20 and counts[(b, "pending")] == 20
        mine = [r[0] for r in conn.execute(f"SELECT id FROM {jobs} WHERE queue = %s ORDER BY id", (a,))]
        first = run_sql(conn, app.queries.claim_jobs, [[a], 15, "w", 30.0])
        second = run_sql(conn, app.queries.claim_jobs, [[a], 15, "w", 30.0])
        conn.commit()
        assert {r[1] for r in first + second} == {a}
        assert {r[0] for r in first} == set(mine[:15]) and {r[0] for r in second} == set(mine[15:])
        assert len(run_sql(conn, app.queries.claim_jobs, [[a, b], 100, "w", 30.0])) == 20  # b's, untouched so far


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
