"""The claim's cursor storage (migration 13): what makes cursors hard, against a real server.

Each lane's cursor is a pair of snapshots and a position (docs/architecture.md,
"The claim: a cursor per lane"). These tests hold the cases the design names:
a held snapshot, jobs committed out of order, a producer idle in a
transaction, jobs not due yet (and one committed after its due time), a row
another transaction holds, cancel of a pending job, the ring's rotation, and
claimers at once.
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

import joblane
from joblane import store
from joblane.queries import quote_ident
from .helpers import plan_buffers, run_sql


@pytest.fixture
def app(joblane_dsn, joblane_schema):
    return joblane.App(joblane_dsn, schema=joblane_schema)


def claim(conn, app, n: int = 100, queues=("q",), worker: str = "w") -> list[int]:
    """Ids of the jobs one claim_jobs call took (its row of NULLs, if any, left out)."""
    rows, _ = store.claimed_rows(run_sql(conn, app.queries.claim_jobs, [list(queues), n, worker, 30.0]))
    return [r[0] for r in rows]


def claim_all(conn, app, queues=("q",), calls: int = 5) -> list[int]:
    """Claim until a call takes nothing (a promotion or a busy lane can leave one call empty-handed)."""
    got: list[int] = []
    empty = 0
    while empty < calls:
        ids = claim(conn, app, 1000, queues)
        got += ids
        empty = 0 if ids else empty + 1
    return got


def insert(conn, app, n: int = 1, queue: str = "q", delay: float = 0.0) -> list[int]:
    jobs = quote_ident(app.schema) + ".jobs"
    return [r[0] for r in conn.execute(
        f"INSERT INTO {jobs} (queue, kind, payload, run_after)"
        " SELECT %s, 'k', jsonb_build_object('n', i), now() + make_interval(secs => %s)"
        " FROM generate_series(1, %s) AS i RETURNING id", (queue, delay, n))]


def finish(conn, app, ids: list[int]) -> None:
    conn.execute(f"UPDATE {quote_ident(app.schema)}.jobs SET state = 'done', finished_at = now(), worker = NULL,"
                 " lease_until = NULL WHERE id = ANY(%s)", (ids,))


def claim_buffers(conn, app, n: int = 10) -> int:
    """Shared buffers one claim of ``n`` reads (EXPLAIN (ANALYZE, BUFFERS)), in a rolled-back transaction."""
    with conn.transaction(force_rollback=True):
        lines = [r[0] for r in conn.execute(
            f"EXPLAIN (ANALYZE, BUFFERS) SELECT * FROM {quote_ident(app.schema)}.claim_jobs(ARRAY['q'], %s, 'w', 30)",
            (n,))]
    return plan_buffers(lines)


def test_pages_read_per_claim_stay_flat_behind_a_held_snapshot(joblane_dsn, app):
    """100,000 jobs claimed and finished while a session holds a REPEATABLE READ snapshot: every version
    they left stays, and a claim reads as many pages at the end as after the first thousand."""
    with psycopg.connect(joblane_dsn, autocommit=True) as conn, psycopg.connect(joblane_dsn) as holder:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM pg_class")  # the snapshot is taken here and kept
        for _ in range(100):
            insert(conn, app, 1000)  # a transaction each: a thousand xids in the lane
        insert(conn, app, 20)  # the last ones the probes look at
        claim(conn, app, 10)  # the session's first claim reads the catalog and plans
        finish(conn, app, claim(conn, app, 990))
        early = min(claim_buffers(conn, app) for _ in range(3))
        done = 1000
        while done < 100_000:
            ids = claim(conn, app, 1000)
            finish(conn, app, ids)
            done += len(ids)
        late = min(claim_buffers(conn, app) for _ in range(3))
        dead = conn.execute("SELECT n_dead_tup + n_live_tup FROM pg_stat_user_tables WHERE relid = %s::regclass",
                            (quote_ident(app.schema) + ".jobs",)).fetchone()
        holder.rollback()
    assert done == 100_000, done
    assert dead is not None
    # the v12 claim read ~2 pages per job claimed since the snapshot here (200,000 and more)
    assert late <= early * 1.5 + 20, (early, late)


def test_a_job_committed_late_is_claimed_and_an_open_producer_holds_nothing_back(joblane_dsn, app):
    """A producer's transaction that began first and commits last: the jobs committed meanwhile are claimed
    at once (no wait on it), then its job, on the claim after its commit; a rolled-back one never."""
    with psycopg.connect(joblane_dsn, autocommit=True) as conn, \
            psycopg.connect(joblane_dsn) as late, psycopg.connect(joblane_dsn) as aborted:
        [slow] = insert(late, app)  # uncommitted
        insert(aborted, app)  # uncommitted, rolled back below
        others = []
        for _ in range(5):  # several ranges come and go while both stay open
            others += insert(conn, app, 3)
            conn.execute("SET statement_timeout = '2s'")
            taken = claim(conn, app)
            assert slow not in taken
            for i in taken:
                others.remove(i)
        assert others == []
        aborted.rollback()
        late.commit()
        assert claim_all(conn, app) == [slow]


def test_jobs_not_due_are_promoted_when_due_even_when_committed_after_it(joblane_dsn, app):
    with psycopg.connect(joblane_dsn, autocommit=True) as conn, psycopg.connect(joblane_dsn) as producer:
        [soon] = insert(conn, app, delay=1.0)
        [tardy] = insert(producer, app, delay=0.3)  # due in 0.3 s, committed 1.5 s from now
        assert claim_all(conn, app, calls=2) == []
        time.sleep(1.2)
        assert claim_all(conn, app) == [soon]  # promotion has gone past tardy's due time meanwhile
        producer.commit()
        assert claim_all(conn, app) == [tardy]
        # a retry with a delay: pending again, due later
        conn.execute(f"UPDATE {quote_ident(app.schema)}.jobs SET state = 'pending', worker = NULL, lease_until = NULL,"
                     " run_after = now() + interval '0.5 seconds' WHERE id = %s", (soon,))
        assert claim_all(conn, app, calls=2) == []
        time.sleep(0.7)
        assert claim_all(conn, app) == [soon]


def deferred_rows(conn, app) -> list[int]:
    return sorted(r[0] for r in conn.execute(f"SELECT job_id FROM {quote_ident(app.schema)}.deferred"))


def test_promoted_rows_leave_deferred_and_the_rest_stay(joblane_dsn, app):
    """prune_deferred deletes the rows the promotion took, never one it may still need: a row not due yet,
    or one whose transaction was still open when the promotion last looked."""
    prune = f"SELECT {quote_ident(app.schema)}.prune_deferred(%s)"
    with psycopg.connect(joblane_dsn, autocommit=True) as conn, psycopg.connect(joblane_dsn) as producer:
        soon = insert(conn, app, n=3, delay=0.3)
        [later] = insert(conn, app, delay=3600)
        [tardy] = insert(producer, app, delay=0.3)  # due in 0.3 s, committed after the next promotion
        time.sleep(0.5)
        assert sorted(claim_all(conn, app)) == soon  # the promotion's snapshot had tardy's transaction open
        producer.commit()  # visible to the prune now, not promoted yet
        assert conn.execute(prune, (1000,)).fetchone()[0] == 3
        assert deferred_rows(conn, app) == sorted([later, tardy])
        assert claim_all(conn, app) == [tardy]
        assert conn.execute(prune, (1000,)).fetchone()[0] == 1
        assert deferred_rows(conn, app) == [later]
        # in batches, the oldest due first
        many = insert(conn, app, n=5, delay=0.2)
        time.sleep(1.3)
        assert sorted(claim_all(conn, app)) == many
        assert conn.execute(prune, (2,)).fetchone()[0] == 2
        assert conn.execute(prune, (10,)).fetchone()[0] == 3
        assert deferred_rows(conn, app) == [later]


def test_a_row_another_transaction_holds_is_passed_over_without_waiting_then_claimed(joblane_dsn, app):
    with psycopg.connect(joblane_dsn, autocommit=True) as conn, psycopg.connect(joblane_dsn) as other:
        held, free = insert(conn, app, 2)
        other.execute(f"SELECT 1 FROM {quote_ident(app.schema)}.jobs WHERE id = %s FOR UPDATE", (held,))
        conn.execute("SET statement_timeout = '2s'")  # a wait on the row would end the claim in an error
        assert claim_all(conn, app, calls=2) == [free]
        other.commit()
        assert claim_all(conn, app) == [held]


def test_a_cancelled_or_deleted_pending_job_is_passed_over(joblane_dsn, app):
    with psycopg.connect(joblane_dsn, autocommit=True) as conn:
        a, b, c = insert(conn, app, 3)
        assert app.cancel(conn, ids=[a], reason="no") == [a]
        conn.execute(f"DELETE FROM {quote_ident(app.schema)}.jobs WHERE id = %s", (b,))
        assert claim_all(conn, app) == [c]
        assert app.get_job(a, conn)["state"] == "cancelled"


def test_the_claim_refuses_a_snapshot_older_than_its_statement(joblane_dsn, app):
    """In REPEATABLE READ a claim would read a stale cursor row and could take the same entries twice."""
    with psycopg.connect(joblane_dsn) as conn:
        insert(conn, app)
        conn.commit()
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="READ COMMITTED"):
            claim(conn, app)


def test_rotation_empties_slots_under_claims_and_loses_nothing(joblane_dsn, app):
    """The ring turns and empties slots while jobs are added and claimed: every job is claimed once."""
    s = quote_ident(app.schema)
    enqueued: list[int] = []
    claimed: list[int] = []
    cleared = 0
    with psycopg.connect(joblane_dsn, autocommit=True) as conn, psycopg.connect(joblane_dsn, autocommit=True) as rot:
        for round_ in range(40):
            enqueued += insert(conn, app, 25)
            if round_ % 3 == 0:  # some left behind for a later slot
                claimed += claim(conn, app, 40)
            done = rot.execute(f"SELECT {s}.rotate_ready(0)").fetchone()[0]
            cleared += sum(1 for d in done if d.startswith("cleared"))
        claimed += claim_all(conn, app)
        sizes = conn.execute(f"SELECT count(*) FROM {s}.ready").fetchone()[0]
    assert sorted(claimed) == sorted(enqueued) and len(set(claimed)) == len(claimed)
    assert cleared >= 3, cleared
    assert sizes < len(enqueued)  # emptied slots gave their entries back


def test_claimers_at_once_take_every_job_exactly_once(joblane_dsn, app):
    with psycopg.connect(joblane_dsn, autocommit=True) as conn:
        for _ in range(20):
            insert(conn, app, 100)
    taken: list[list[int]] = [[] for _ in range(4)]
    busy = [0] * 4

    def run(i: int) -> None:
        with psycopg.connect(joblane_dsn, autocommit=True) as c:
            empty = 0
            while empty < 20:
                rows, again = store.claimed_rows(run_sql(c, app.queries.claim_jobs, [["q"], 7, f"w{i}", 30.0]))
                busy[i] += again
                taken[i] += [r[0] for r in rows]
                empty = 0 if rows or again else empty + 1

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    everything = [i for ids in taken for i in ids]
    assert len(everything) == 2000 and len(set(everything)) == 2000
    assert sum(1 for ids in taken if ids) >= 2  # not one claimer alone
