"""A worker of schema version 10, as a process of its own, for the upgrade test (test_upgrade.py).

It claims and completes with the SQL that version 10 shipped: the claim is
``claim_jobs`` as the database has it at the moment of the call (version 10's
function before the migration, today's after it), and the completion is
version 10's ``complete_jobs`` statement, written out below as it was
(sql/jobs.sql at schema version 10). Each try's task body is recorded in the
``upgrade_runs`` table the test makes, with its start and end.
"""

from __future__ import annotations

import json
import time

import psycopg

from joblane.queries import quote_ident

# sql/jobs.sql of version 10, "claim_jobs" and "complete_jobs", with $n written as named parameters
V10_CLAIM = "SELECT * FROM {schema}.claim_jobs(%(queues)s::text[], %(limit)s::int, %(worker)s::text, %(lease)s::float8)"

V10_COMPLETE = """
WITH outcome AS (
    SELECT DISTINCT ON (id) *
      FROM jsonb_to_recordset(%(outcomes)s::text::jsonb)
           AS o(id bigint, attempt int, state text, outcome text, error text, delay float8, refund int,
                result jsonb, started_at float8, finished_at float8, meta jsonb)
     ORDER BY id, finished_at
), applied AS (
    UPDATE {schema}.jobs AS j
       SET state = o.state,
           attempts = j.attempts - coalesce(o.refund, 0),
           last_error = coalesce(o.error, j.last_error),
           result = coalesce(o.result, j.result),
           run_after = CASE WHEN o.state = 'pending'
                            THEN now() + make_interval(secs => coalesce(o.delay, 0))
                            ELSE j.run_after END,
           lease_until = NULL,
           worker = NULL,
           finished_at = CASE WHEN o.state IN ('done', 'failed', 'cancelled') THEN now() END
      FROM outcome AS o
     WHERE j.id = ANY(ARRAY(SELECT id FROM outcome)) AND j.id = o.id
       AND (j.state = 'running') IS TRUE AND j.attempts = o.attempt AND j.worker = %(worker)s
 RETURNING j.id
), audit AS (
    INSERT INTO {schema}.attempts (job_id, attempt, worker, started_at, finished_at, outcome, error, meta)
    SELECT o.id, o.attempt, %(worker)s, to_timestamp(o.started_at), coalesce(to_timestamp(o.finished_at), now()),
           o.outcome, o.error, o.meta
      FROM outcome AS o
      JOIN applied USING (id)
)
SELECT id FROM applied
"""

# version 10's enqueue of a job that waits for parents: the job is inserted 'waiting', then linked
V10_LINK = "SELECT * FROM {schema}.link_jobs(%(children)s::bigint[], %(parents)s::bigint[], %(policies)s::text[])"


def sql(text: str, schema: str) -> str:
    return text.replace("{schema}", quote_ident(schema))


def claim(conn, schema: str, queues: list[str], limit: int, worker: str, lease: float) -> list:
    return conn.execute(sql(V10_CLAIM, schema),
                        {"queues": queues, "limit": limit, "worker": worker, "lease": lease}).fetchall()


def complete(conn, schema: str, worker: str, outcomes: list[dict]) -> list[int]:
    rows = conn.execute(sql(V10_COMPLETE, schema), {"outcomes": json.dumps(outcomes), "worker": worker}).fetchall()
    return [r[0] for r in rows]


def done(job_id: int, attempt: int, started: float, finished: float) -> dict:
    return {"id": job_id, "attempt": attempt, "state": "done", "outcome": "done",
            "started_at": started, "finished_at": finished}


def run(dsn: str, schema: str, worker: str, queues: list[str], carried: list[tuple[int, int]],
        claimed_once, migrated, stop, results) -> None:
    """Claim two jobs at a time from ``queues`` and finish them until ``stop`` is set.

    ``carried`` are (id, attempt) of jobs this worker claimed before the
    upgrade and still runs: their bodies began then, and they are finished
    once ``migrated`` is set. ``claimed_once`` is set after the first claim.
    What it saw goes to ``results``: its claims (time, rows) and how many rows
    of NULLs the claim returned (version 10's worker has no use for them).
    """
    runs = f"{quote_ident(schema)}.upgrade_runs"
    claims: list[tuple[float, float, list]] = []
    nulls = 0
    error = None
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                if carried and migrated.is_set():
                    at = time.time()
                    conn.execute(f"UPDATE {runs} SET finished_at = %s WHERE job_id = ANY(%s) AND worker = %s"
                                 " AND finished_at IS NULL", (at, [c[0] for c in carried], worker))
                    applied = complete(conn, schema, worker, [done(i, a, at, at) for i, a in carried])
                    assert sorted(applied) == sorted(c[0] for c in carried), (applied, carried)
                    carried = []
                began = time.time()
                rows = claim(conn, schema, queues, 2, worker, 30.0)
                jobs = [r for r in rows if r[0] is not None]
                nulls += len(rows) - len(jobs)
                claims.append((began, time.time(), [(r[0], r[1], r[6]) for r in jobs]))
                claimed_once.set()
                for row in sorted(jobs, key=lambda r: (r[6], r[0])):  # priority, then age, as v10 started them
                    job_id, attempt = row[0], row[4]
                    started = time.time()
                    conn.execute(f"INSERT INTO {runs} (job_id, attempt, worker, started_at) VALUES (%s, %s, %s, %s)",
                                 (job_id, attempt, worker, started))
                    time.sleep(0.01)
                    finished = time.time()
                    conn.execute(f"UPDATE {runs} SET finished_at = %s WHERE job_id = %s AND attempt = %s"
                                 " AND worker = %s", (finished, job_id, attempt, worker))
                    assert complete(conn, schema, worker, [done(job_id, attempt, started, finished)]) == [job_id]
                if not jobs:
                    time.sleep(0.02)
    except BaseException as exc:  # reported to the test, which fails on it
        error = f"{type(exc).__name__}: {exc}"
    results.put({"claims": claims, "nulls": nulls, "error": error, "carried_left": carried})
