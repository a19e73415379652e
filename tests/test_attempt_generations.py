"""attempts by generation (schema version 14): partitions by job id, made ahead, taken away whole."""

from __future__ import annotations

import logging

import asyncpg
import psycopg
import pytest

import joblane
from joblane import migrations
from joblane.maintenance import Pruner
from joblane.queries import quote_ident
from joblane.testing import isolated_schema

from .conftest import table

GEN = 1 << 20  # job ids per generation
DAY = 86400.0


def partitions(conn, app) -> dict[str, str]:
    """The partitions of attempts: name -> bounds."""
    return dict(conn.execute(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = %s::regclass", (table(app, "attempts"),)).fetchall())


def jobs_from(conn, app, first_id: int) -> None:
    """Hand out job ids from ``first_id`` on."""
    conn.execute(f"ALTER TABLE {table(app, 'jobs')} ALTER COLUMN id RESTART WITH {int(first_id)}")


def job(conn, app, state: str, finished: str | None = None) -> int:
    """A job in ``state``, finished ``finished`` ago (an interval) if given, with one try that ended then (or now)."""
    job_id = conn.execute(
        f"INSERT INTO {table(app, 'jobs')} (kind, state, attempts, finished_at)"
        " VALUES ('k', %s, 1, now() - %s::interval) RETURNING id", (state, finished)).fetchone()[0]
    conn.execute(f"INSERT INTO {table(app, 'attempts')} (job_id, attempt, outcome, finished_at)"
                 " VALUES (%s, 1, 'done', now() - coalesce(%s::interval, '0 s'))", (job_id, finished))
    return job_id


def where(conn, app, job_id: int) -> str:
    """The partition that holds the tries of ``job_id``."""
    return conn.execute(f"SELECT tableoid::regclass::text FROM {table(app, 'attempts')} WHERE job_id = %s",
                        (job_id,)).fetchone()[0].rsplit(".", 1)[-1]


async def generations(app, joblane_dsn, **pruner_options) -> dict[str, str]:
    c = await asyncpg.connect(joblane_dsn)
    try:
        out = await Pruner(app.store, **pruner_options).generations(c)
    finally:
        await c.close()
    return {name.rsplit(".", 1)[-1]: result for name, result in out.items()}


def test_a_new_schema_has_the_first_generations_and_a_default_partition(app, conn):
    assert partitions(conn, app) == {
        "attempts_v10": f"FOR VALUES FROM (MINVALUE) TO ('{GEN}')",
        "attempts_g1": f"FOR VALUES FROM ('{GEN}') TO ('{2 * GEN}')",
        "attempts_carried": "DEFAULT",
    }
    assert conn.execute(f"SELECT {quote_ident(app.schema)}.ensure_attempt_generations()").fetchone()[0] == 0


def test_tries_of_a_new_generation_land_in_its_partition_made_ahead(app, conn):
    first = app.enqueue(conn, "k", {})
    jobs_from(conn, app, 3 * GEN + 5)
    later = app.enqueue(conn, "k", {})
    assert later == 3 * GEN + 5
    # the pruner's round makes the generation of the highest job id and the next one
    assert conn.execute(f"SELECT {quote_ident(app.schema)}.ensure_attempt_generations()").fetchone()[0] == 2
    assert {"attempts_g3", "attempts_g4"} <= set(partitions(conn, app))
    assert conn.execute(f"SELECT {quote_ident(app.schema)}.ensure_attempt_generations()").fetchone()[0] == 0
    for job_id in (first, later):
        conn.execute(f"INSERT INTO {table(app, 'attempts')} (job_id, attempt, outcome, meta)"
                     " VALUES (%s, 1, 'done', '{\"model\": \"m\"}')", (job_id,))
    assert (where(conn, app, first), where(conn, app, later)) == ("attempts_v10", "attempts_g3")
    # a try whose generation has no partition (not made in time) goes to attempts_carried, and that
    # generation is then left to it: a partition cannot be made over rows of the DEFAULT partition
    jobs_from(conn, app, 9 * GEN)
    stray = app.enqueue(conn, "k", {})
    conn.execute(f"INSERT INTO {table(app, 'attempts')} (job_id, attempt, outcome) VALUES (%s, 1, 'done')", (stray,))
    assert where(conn, app, stray) == "attempts_carried"
    assert conn.execute(f"SELECT {quote_ident(app.schema)}.ensure_attempt_generations()").fetchone()[0] == 1
    assert "attempts_g9" not in partitions(conn, app) and "attempts_g10" in partitions(conn, app)
    # ids keep growing across partitions; every try reads back through attempts
    ids = [r[0] for r in conn.execute(f"SELECT id FROM {table(app, 'attempts')} ORDER BY job_id")]
    assert len(ids) == len(set(ids)) == 3
    assert [a["job_id"] for a in app.list_attempts(conn)] == [stray, later, first]  # newest id first
    assert [a["job_id"] for a in app.list_attempts(conn, before_id=ids[2])] == [later, first]
    assert [a["job_id"] for a in app.list_attempts(conn, model="m")] == [later, first]


async def test_a_generation_goes_only_once_every_job_in_it_finished_past_the_retention(app, conn, joblane_dsn):
    old = job(conn, app, "done", "8 days")  # in attempts_v10, with a pending job that keeps it
    job(conn, app, "pending")
    jobs_from(conn, app, GEN)
    finished = [job(conn, app, state, "8 days") for state in ("done", "done", "cancelled")]
    pending = job(conn, app, "pending")
    held = job(conn, app, "held")
    recent = job(conn, app, "done", "1 hour")
    failed = job(conn, app, "failed", "8 days")
    assert {where(conn, app, j) for j in finished + [pending, held, recent, failed]} == {"attempts_g1"}
    # job ids of g1 are still being handed out: it stays, whatever its jobs
    assert (await generations(app, joblane_dsn, retention=7 * DAY))["attempts_g1"].startswith("kept: job ids")
    jobs_from(conn, app, 2 * GEN + 10)
    next_gen = job(conn, app, "done", "8 days")
    jobs, attempts = table(app, "jobs"), table(app, "attempts")
    for blocker, state in ((pending, "done"), (held, "cancelled"), (recent, "done"), (failed, None)):
        result = await generations(app, joblane_dsn, retention=7 * DAY)
        assert result["attempts_g1"] == f"kept: job {blocker} is unfinished, kept or finished within the retention"
        assert result["attempts_v10"].startswith("kept: job")
        if state:
            conn.execute(f"UPDATE {jobs} SET state = %s, finished_at = now() - interval '8 days' WHERE id = %s",
                         (state, blocker))
    # failed jobs count once the pruner prunes them; a try that finished within the retention keeps it
    result = await generations(app, joblane_dsn, retention=7 * DAY, prune_failed=True)
    assert result["attempts_g1"] == "kept: a try finished within the retention"
    conn.execute(f"UPDATE {attempts} SET finished_at = now() - interval '8 days' WHERE job_id = ANY(%s)",
                 ([pending, held, recent],))
    # jobs deleted count as finished: the row pruner took one of them already
    conn.execute(f"DELETE FROM {jobs} WHERE id = %s", (finished[0],))
    before = conn.execute(f"SELECT count(*) FROM {attempts}").fetchone()[0]
    result = await generations(app, joblane_dsn, retention=7 * DAY, prune_failed=True)
    assert result["attempts_g1"] == "dropped"
    assert "attempts_g1" not in partitions(conn, app)
    # its rows are gone, the other generations' are there
    left = [r[0] for r in conn.execute(f"SELECT job_id FROM {attempts} ORDER BY job_id")]
    assert left == [old, old + 1, next_gen] and before - len(left) == 7
    assert (where(conn, app, old), where(conn, app, next_gen)) == ("attempts_v10", "attempts_g2")
    # a late try of a job of the dropped generation goes to attempts_carried: an insert never fails
    conn.execute(f"INSERT INTO {attempts} (job_id, attempt, outcome) VALUES (%s, 2, 'done')", (held,))
    assert where(conn, app, held) == "attempts_carried"


async def test_the_row_pruner_leaves_a_generation_to_go_whole_and_still_deletes_old_tries(app, conn, joblane_dsn):
    old = job(conn, app, "done", "8 days")
    job(conn, app, "pending")  # keeps attempts_v10
    jobs_from(conn, app, GEN)
    in_gen = job(conn, app, "done", "8 days")
    jobs_from(conn, app, 2 * GEN)
    app.enqueue(conn, "k", {})
    c = await asyncpg.connect(joblane_dsn)
    try:
        pruner = Pruner(app.store, retention=7 * DAY)
        pruner.generation_interval = 3600.0
        assert sorted(await pruner.run_once(c)) == sorted([old, in_gen])  # both jobs deleted, and generations run
        tries = {r[0] for r in conn.execute(f"SELECT job_id FROM {table(app, 'attempts')}")}
        # old's try (attempts_v10) went row by row; g1 went whole in the same round: all its jobs are gone
        assert old not in tries and in_gen not in tries
        assert "attempts_g1" not in partitions(conn, app) and "attempts_g2" in partitions(conn, app)
        assert pruner.generations_dropped == 1
        jobs_from(conn, app, 4 * GEN)
        app.enqueue(conn, "k", {})
        await pruner.run_once(c)  # the generation round waits for its interval
        assert "attempts_g4" not in partitions(conn, app)
        pruner.generation_interval = 0
        await pruner.run_once(c)
        assert {"attempts_g4", "attempts_g5"} <= set(partitions(conn, app))
    finally:
        await c.close()


async def test_a_row_pruned_job_of_a_generation_keeps_its_tries_until_the_generation_goes(app, conn, joblane_dsn):
    jobs_from(conn, app, GEN)
    gone = job(conn, app, "done", "8 days")
    job(conn, app, "pending")  # keeps g1
    jobs_from(conn, app, 2 * GEN)
    app.enqueue(conn, "k", {})
    c = await asyncpg.connect(joblane_dsn)
    try:
        assert await Pruner(app.store, retention=7 * DAY).run_once(c) == [gone]
    finally:
        await c.close()
    assert where(conn, app, gone) == "attempts_g1"


async def test_a_generation_that_cannot_be_locked_is_left_for_the_next_round_and_its_holder_named(
        app, conn, joblane_dsn, caplog):
    jobs_from(conn, app, GEN)
    job(conn, app, "done", "8 days")
    jobs_from(conn, app, 2 * GEN)
    app.enqueue(conn, "k", {})
    with psycopg.connect(joblane_dsn) as reader:
        reader.execute("SET application_name = 'nightly export'")
        reader.execute(f"SELECT count(*) FROM {table(app, 'attempts_g1')}")  # holds its lock until it ends
        pid = reader.info.backend_pid
        with caplog.at_level(logging.WARNING, logger="joblane.maintenance"):
            result = await generations(app, joblane_dsn, retention=7 * DAY)
        assert result["attempts_g1"] == "locked"
        said = [r.getMessage() for r in caplog.records if "attempts_g1" in r.getMessage()]
        assert len(said) == 1 and f"session pid {pid} (nightly export" in said[0], said
        assert "left for the next round" in said[0]
    # the reader ended: the next round truncates, then detaches and drops
    assert (await generations(app, joblane_dsn, retention=7 * DAY))["attempts_g1"] == "dropped"


def test_the_upgrade_keeps_every_try_of_the_previous_version_under_attempts(joblane_dsn):
    """Version 14 attaches the old table as the first partition: every row reads back under attempts, with
    the same columns, and new tries continue its ids."""
    versions = migrations.versions()
    previous = max(v for v in versions if v < 14)
    with isolated_schema(joblane_dsn, migrate=False) as schema:
        app = joblane.App(joblane_dsn, schema=schema)
        attempts = f"{quote_ident(schema)}.attempts"
        with psycopg.connect(joblane_dsn, autocommit=True) as conn:
            assert migrations.migrate(conn, schema, target=previous) == [v for v in versions if v <= previous]
            columns = """SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attidentity,
                                pg_get_expr(d.adbin, d.adrelid)
                           FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                          WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum"""
            before_columns = conn.execute(columns, (attempts,)).fetchall()
            jobs_from(conn, app, 2 * GEN + 7)
            ids = [app.enqueue(conn, "k", {"n": n}) for n in range(3)]
            conn.execute(f"INSERT INTO {attempts} (job_id, attempt, worker, started_at, outcome, error, meta)"
                         " SELECT j, a, 'w', now(), CASE WHEN a = 1 THEN 'retry' ELSE 'done' END, 'e' || a,"
                         " jsonb_build_object('model', 'm', 'a', a)"
                         " FROM unnest(%s::bigint[]) j, generate_series(1, 2) a", (ids,))
            rows = conn.execute(f"SELECT * FROM {attempts} ORDER BY id").fetchall()
            assert migrations.migrate(conn, schema) == [v for v in versions if v > previous]
            assert conn.execute(columns, (attempts,)).fetchall() == before_columns
            assert conn.execute(f"SELECT * FROM {attempts} ORDER BY id").fetchall() == rows
            assert partitions(conn, app)["attempts_v10"] == f"FOR VALUES FROM (MINVALUE) TO ('{3 * GEN}')"
            assert "attempts_g3" in partitions(conn, app)
            [(new_id,)] = conn.execute(f"INSERT INTO {attempts} (job_id, attempt, outcome) VALUES (%s, 3, 'done')"
                                       " RETURNING id", (ids[0],)).fetchall()
            assert new_id == max(r[0] for r in rows) + 1
            assert where(conn, app, ids[0]) == "attempts_v10"
            with pytest.raises(psycopg.errors.GeneratedAlways):
                conn.execute(f"INSERT INTO {attempts} (id, job_id, attempt, outcome) VALUES (1, 1, 1, 'done')")
            listed = app.list_attempts(conn, job_id=ids[1])
            assert [(a["attempt"], a["outcome"]) for a in listed] == [(2, "done"), (1, "retry")]
