#!/usr/bin/env python3
"""The cursor claim of issue 39, probed before it is built: is it correct, and does a held snapshot slow it?

    .venv/bin/python benchmarks/cursor_probe.py                      # checks, then 30 s + 120 s held, per claim
    .venv/bin/python benchmarks/cursor_probe.py --checks-only --dsn postgresql://postgres@127.0.0.1:5432/test
    .venv/bin/python benchmarks/cursor_probe.py --warmup 60 --hold 600 --rate 1000

In a scratch schema it creates (and drops at the end), it builds the smallest
form of the design in docs (architecture, "Storage that a long transaction
cannot slow down"):

- ``ready(lane_id, xid xid8 DEFAULT pg_current_xact_id(), job_id)``: one entry
  per job made claimable, append-only, indexed ``(lane_id, xid, job_id)``;
- ``lane_cursors(lane_id, step, lo, hi, last_xid, last_job, exhausted)``:
  append-only; a lane's cursor is its row of highest ``step``;
- ``probe_jobs``: a stand-in for ``jobs`` (id, lane, state, lease columns);
- ``claim(lanes, limit, worker, lease, lock_space)``, PL/pgSQL. Per lane: a
  transaction-scoped ``pg_try_advisory_xact_lock`` (a busy lane is passed
  over); the latest cursor row; when its range is exhausted a new range
  ``(lo, hi) := (previous hi, pg_current_snapshot())``, hi in a statement of
  its own so that every later statement's snapshot sees what hi sees; then
  the entries visible in hi and not in lo, in ``(xid, job_id)`` order after
  the resume point ``(last_xid, last_job)``, in two index-driven parts:

  A. one index probe per xid of ``xip(lo)`` that hi sees as finished (these
     xids are all below ``xmax(lo)``, so part A precedes part B in the order);
  B. one index range ``(xid, job_id) > max(resume point, (xmax(lo), -1))``,
     ``xid < xmax(hi)``, minus ``xip(hi)``.

  The taken jobs are marked running by primary key (guard: still pending) and
  a cursor row is appended, except when a new range came out empty (then the
  older ``lo`` stays, which only widens the next range).

Part 1 checks correctness with real concurrent sessions: (a) a job committed
after a later-started one, and after a claim, is still claimed; (b) a
producer idle in its transaction does not stall the cursor, its job is
claimed once it commits, an aborted producer's job never is; (c) with
producers and 3 claiming threads interleaved, every committed job is taken
exactly once and no aborted one is; (d) a claim never waits for another
claim that holds a lane.

Part 2 measures, for the cursor claim and then for a replica of today's claim
(``FOR UPDATE SKIP LOCKED`` over a partial index ``WHERE state = 'pending'``
ordered by priority, run_after, id, as joblane's ``jobs_ready``), each in a
fresh schema under the same load: a producer committing ``--rate`` jobs a
second in transactions of ``--per-tx``, one claim loop (claims of ``--batch``,
each claimed batch completed by primary key), ``--warmup`` seconds, then a
session idle in a REPEATABLE READ transaction for ``--hold`` seconds. Every
``--every`` seconds: the claim's mean and p99 time (client side), the index
entries and index buffers it read per claim (pg_stat_get_tuples_returned /
pg_stat_get_blocks_fetched of the indexes it walks), jobs/s and backlog. At
the end of warm-up and of the hold the scan runs once under EXPLAIN
(ANALYZE, BUFFERS). Everything goes to ``--out`` as JSON.

Without ``--dsn`` it starts a PostgreSQL cluster of its own with default
settings, as benchmarks/soak.py does.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import secrets
import statistics
import sys
import threading
import time
from pathlib import Path

import psycopg
from psycopg import sql

HERE = Path(__file__).resolve().parent

# ---------------------------------------------------------------------------------------------- schema

DDL = """
CREATE SCHEMA {s};
CREATE TABLE {s}.probe_jobs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    lane_id int NOT NULL,
    state text NOT NULL DEFAULT 'pending',
    priority smallint NOT NULL DEFAULT 0,
    run_after timestamptz NOT NULL DEFAULT now(),
    attempts int NOT NULL DEFAULT 0,
    worker text,
    lease_until timestamptz,
    payload text
);
CREATE TABLE {s}.ready (
    lane_id int NOT NULL,
    xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
    job_id bigint NOT NULL
);
CREATE INDEX ready_lane_xid ON {s}.ready (lane_id, xid, job_id);
CREATE TABLE {s}.lane_cursors (
    lane_id int NOT NULL,
    step bigint GENERATED ALWAYS AS IDENTITY,
    lo pg_snapshot NOT NULL,
    hi pg_snapshot NOT NULL,
    last_xid xid8 NOT NULL,
    last_job bigint NOT NULL,
    exhausted bool NOT NULL
);
CREATE INDEX lane_cursors_latest ON {s}.lane_cursors (lane_id, step);
"""

# today's claim, replicated: joblane's jobs_ready (migration 10) with the lane standing for hashtext(queue)
TODAY_DDL = """
CREATE INDEX probe_jobs_ready ON {s}.probe_jobs (lane_id, priority, run_after, id) WHERE state = 'pending';
"""

CLAIM_FUNCTION = """
CREATE FUNCTION {s}.claim(p_lanes int[], p_limit int, p_worker text, p_lease_seconds float8, p_space int)
RETURNS TABLE (job_id bigint, lane_id int, marked bool)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_lane int;
    v_found bool;
    v_lo pg_snapshot;
    v_hi pg_snapshot;
    v_last_xid xid8;
    v_last_job bigint;
    v_exhausted bool;
    v_new_range bool;
    v_wanted int;
    v_vis xid8[];
    v_xids xid8[];
    v_jobs bigint[];
    v_more_xids xid8[];
    v_more_jobs bigint[];
    v_taken bigint[] := '{{}}';
    v_lanes int[] := '{{}}';
    v_n int;
BEGIN
    -- each statement below must take a snapshot of its own: the cursor row read after the lane lock has to see
    -- the previous holder's commit. Under REPEATABLE READ it would read a stale cursor and take entries again.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'claim runs in READ COMMITTED only, not %', current_setting('transaction_isolation');
    END IF;
    FOREACH v_lane IN ARRAY p_lanes LOOP
        v_wanted := p_limit - cardinality(v_taken);
        EXIT WHEN v_wanted <= 0;
        -- one claim per lane at a time; a busy lane is passed over, never waited for
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(p_space, v_lane);
        SELECT c.lo, c.hi, c.last_xid, c.last_job, c.exhausted
          INTO v_lo, v_hi, v_last_xid, v_last_job, v_exhausted
          FROM {s}.lane_cursors AS c
         WHERE c.lane_id = v_lane
         ORDER BY c.step DESC
         LIMIT 1;
        v_found := FOUND;
        IF NOT v_found THEN
            v_hi := '1:1:'; v_exhausted := true;  -- a lane's first range starts at the first xid
        END IF;
        v_new_range := v_exhausted;
        IF v_exhausted THEN
            v_lo := v_hi;
            -- a statement of its own: the scans below take later snapshots, which see every commit hi sees
            v_hi := pg_current_snapshot();
            v_last_xid := '0'; v_last_job := 0;
        END IF;

        -- part A: the xids in progress in lo that hi sees finished, one index probe each, after the resume point
        v_vis := ARRAY(SELECT x FROM pg_snapshot_xip(v_lo) AS x
                        WHERE x >= v_last_xid AND pg_visible_in_snapshot(x, v_hi) ORDER BY x);
        v_xids := '{{}}'; v_jobs := '{{}}';
        IF cardinality(v_vis) > 0 THEN
            SELECT coalesce(array_agg(p.xid ORDER BY p.xid, p.job_id), '{{}}'),
                   coalesce(array_agg(p.job_id ORDER BY p.xid, p.job_id), '{{}}')
              INTO v_xids, v_jobs
              FROM (SELECT e.xid, e.job_id
                      FROM unnest(v_vis) AS v(x)
                     CROSS JOIN LATERAL (
                            SELECT r.xid, r.job_id FROM {s}.ready AS r
                             WHERE r.lane_id = v_lane AND r.xid = v.x
                               AND (r.xid, r.job_id) > (v_last_xid, v_last_job)
                             ORDER BY r.xid, r.job_id
                             LIMIT v_wanted) AS e
                     ORDER BY e.xid, e.job_id
                     LIMIT v_wanted) AS p;
        END IF;

        -- part B: from xmax(lo) (or the resume point, when it is past it) up to xmax(hi), without xip(hi)
        IF cardinality(v_xids) < v_wanted THEN
            IF v_last_xid < pg_snapshot_xmax(v_lo) THEN
                v_last_xid := pg_snapshot_xmax(v_lo); v_last_job := -1;
            END IF;
            SELECT coalesce(array_agg(p.xid ORDER BY p.xid, p.job_id), '{{}}'),
                   coalesce(array_agg(p.job_id ORDER BY p.xid, p.job_id), '{{}}')
              INTO v_more_xids, v_more_jobs
              FROM (SELECT r.xid, r.job_id FROM {s}.ready AS r
                     WHERE r.lane_id = v_lane
                       AND (r.xid, r.job_id) > (v_last_xid, v_last_job)
                       AND r.xid < pg_snapshot_xmax(v_hi)
                       AND r.xid <> ALL (ARRAY(SELECT pg_snapshot_xip(v_hi)))
                     ORDER BY r.xid, r.job_id
                     LIMIT v_wanted - cardinality(v_xids)) AS p;
            v_xids := v_xids || v_more_xids;
            v_jobs := v_jobs || v_more_jobs;
        END IF;

        v_n := cardinality(v_jobs);
        -- an empty new range writes nothing: the older lo stays, and the next range is wider by as much
        -- (unless lo's xip had transactions hi sees ended: then lo moves on, so they are not probed again)
        IF v_n > 0 OR NOT v_new_range OR cardinality(v_vis) > 0 THEN
            INSERT INTO {s}.lane_cursors (lane_id, lo, hi, last_xid, last_job, exhausted)
            VALUES (v_lane, v_lo, v_hi,
                    CASE WHEN v_n > 0 THEN v_xids[v_n] ELSE v_last_xid END,
                    CASE WHEN v_n > 0 THEN v_jobs[v_n] ELSE v_last_job END,
                    v_n < v_wanted);
        END IF;
        v_taken := v_taken || v_jobs;
        v_lanes := v_lanes || array_fill(v_lane, ARRAY[v_n]);
    END LOOP;

    -- the taken jobs, marked running by primary key; marked = false if the guard found one not pending
    RETURN QUERY
    WITH upd AS (
        UPDATE {s}.probe_jobs AS j
           SET state = 'running', attempts = j.attempts + 1, worker = p_worker,
               lease_until = now() + make_interval(secs => p_lease_seconds)
         WHERE j.id = ANY(v_taken) AND j.state = 'pending'
        RETURNING j.id
    )
    SELECT t.job_id, t.lane_id, EXISTS (SELECT 1 FROM upd WHERE upd.id = t.job_id)
      FROM unnest(v_taken, v_lanes) AS t(job_id, lane_id);
END
$$;
"""

TODAY_CLAIM = """
WITH picked AS (
    SELECT j.id FROM {s}.probe_jobs AS j
     WHERE j.lane_id = ANY(%(lanes)s) AND j.state = 'pending' AND j.run_after <= now()
     ORDER BY j.priority, j.run_after, j.id
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
UPDATE {s}.probe_jobs AS j
   SET state = 'running', attempts = j.attempts + 1, worker = %(worker)s,
       lease_until = now() + make_interval(secs => %(lease)s)
 WHERE j.id = ANY(ARRAY(SELECT id FROM picked))
RETURNING j.id, j.lane_id, true
"""

# the replica of today's claim for one lane, as joblane's claim_jobs probes one queue
TODAY_CLAIM_ONE = TODAY_CLAIM.replace("j.lane_id = ANY(%(lanes)s)", "j.lane_id = %(lane)s")

PRODUCE = """
WITH j AS (
    INSERT INTO {s}.probe_jobs (lane_id, payload)
    SELECT %(lane)s, 'x' FROM generate_series(1, %(n)s)
    RETURNING id, lane_id
)
INSERT INTO {s}.ready (lane_id, job_id) SELECT lane_id, id FROM j RETURNING job_id
"""

PRODUCE_TODAY = """
INSERT INTO {s}.probe_jobs (lane_id, payload) SELECT %(lane)s, 'x' FROM generate_series(1, %(n)s) RETURNING id
"""

COMPLETE = "UPDATE {s}.probe_jobs SET state = 'done', lease_until = NULL WHERE id = ANY(%(ids)s) AND state = 'running'"


class Probe:
    """One scratch schema, created by setup() and dropped by drop()."""

    def __init__(self, dsn: str, mode: str = "cursor", name: str | None = None) -> None:
        self.dsn, self.mode = dsn, mode
        self.name = name or f"cursor_probe_{secrets.token_hex(4)}"
        self.s = sql.Identifier(self.name)
        self.space = 0

    def q(self, text: str) -> sql.Composed:
        return sql.SQL(text).format(s=self.s)

    def connect(self, **kw) -> psycopg.Connection:
        return psycopg.connect(self.dsn, autocommit=True, **kw)

    def setup(self) -> None:
        if not self.name.replace("_", "").isalnum():
            raise ValueError("scratch schema names are letters, digits and underscores")
        with self.connect() as conn:
            conn.execute(self.q(DDL))
            if self.mode == "today":
                conn.execute(self.q(TODAY_DDL))
            conn.execute(self.q(CLAIM_FUNCTION))
            # the lock space of this schema's lanes: the ready table's oid, so two probes never share a lock
            ready = sql.Identifier(self.name, "ready").as_string(conn)
            self.space = conn.execute("SELECT %s::regclass::oid::int", (ready,)).fetchone()[0]

    def drop(self) -> None:
        with self.connect() as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(self.s))

    # -- statements ----------------------------------------------------------------------------------
    def produce(self, conn, lane: int, n: int = 1) -> list[int]:
        text = PRODUCE if self.mode == "cursor" else PRODUCE_TODAY
        return [r[0] for r in conn.execute(self.q(text), {"lane": lane, "n": n})]

    def claim(self, conn, lanes: list[int], limit: int = 10, worker: str = "probe") -> list[tuple[int, int, bool]]:
        if self.mode == "cursor":
            return conn.execute(sql.SQL("SELECT job_id, lane_id, marked FROM {}.claim(%s, %s, %s, %s, %s)").format(self.s),
                                (lanes, limit, worker, 30.0, self.space)).fetchall()
        if len(lanes) == 1:
            return conn.execute(self.q(TODAY_CLAIM_ONE), {"lane": lanes[0], "limit": limit, "worker": worker,
                                                          "lease": 30.0}).fetchall()
        return conn.execute(self.q(TODAY_CLAIM), {"lanes": lanes, "limit": limit, "worker": worker,
                                                  "lease": 30.0}).fetchall()

    def complete(self, conn, ids: list[int]) -> None:
        conn.execute(self.q(COMPLETE), {"ids": ids})

    def cursor(self, conn, lane: int) -> tuple | None:
        return conn.execute(self.q("SELECT lo::text, hi::text, last_xid::text, last_job, exhausted FROM {s}.lane_cursors"
                                   " WHERE lane_id = %s ORDER BY step DESC LIMIT 1"), (lane,)).fetchone()


def drain(probe: Probe, conn, lanes: list[int], limit: int = 50, rounds: int = 50) -> list[tuple[int, int, bool]]:
    """Claim until two claims in a row take nothing (the first may only close the range it was in)."""
    out: list[tuple[int, int, bool]] = []
    empty = 0
    for _ in range(rounds):
        got = probe.claim(conn, lanes, limit)
        out += got
        empty = 0 if got else empty + 1
        if empty >= 2:
            break
    return out


# ---------------------------------------------------------------------------------------------- part 1

def check_out_of_order(probe: Probe) -> dict:
    """(a) T1 inserts first and commits last, after T2 committed and a claim ran: T1's job is still claimed."""
    with probe.connect() as t1, probe.connect() as t2, probe.connect() as c:
        drain(probe, c, [1])
        t1.execute("BEGIN")
        j1 = probe.produce(t1, 1)[0]
        t1_xid = t1.execute("SELECT pg_current_xact_id()::text").fetchone()[0]
        j2 = probe.produce(t2, 1)[0]  # autocommit: a later xid, committed first
        first = [r[0] for r in drain(probe, c, [1])]
        t1.execute("COMMIT")
        # a claim right after: must take T1's job although its xid is below every xid claimed so far
        later = drain(probe, c, [1])
        return {
            "t1_job": j1, "t2_job": j2, "t1_xid": t1_xid,
            "claimed_while_t1_open": first, "claimed_after_t1_commit": [r[0] for r in later],
            "ok": first == [j2] and [r[0] for r in later] == [j1] and all(r[2] for r in later),
        }


def check_idle_producer(probe: Probe) -> dict:
    """(b) a producer idle in its transaction does not stall the cursor; its job comes once it commits;
    an aborted producer's job never comes."""
    with probe.connect() as idle, probe.connect() as aborted, probe.connect() as p, probe.connect() as c:
        drain(probe, c, [2])
        idle.execute("BEGIN")
        j_idle = probe.produce(idle, 2)[0]
        aborted.execute("BEGIN")
        j_aborted = probe.produce(aborted, 2)[0]
        rounds = []
        stalled = False
        for i in range(6):
            made = probe.produce(p, 2, 3)
            got = [r[0] for r in drain(probe, c, [2])]
            rounds.append({"produced": made, "claimed": got})
            if sorted(got) != sorted(made):
                stalled = True
            if i == 2:
                aborted.execute("ROLLBACK")  # aborted after it sat in xip(lo) of ranges already
        lo_while_idle = probe.cursor(c, 2)
        idle.execute("COMMIT")
        after = [r[0] for r in drain(probe, c, [2])]
        # a producer that aborts before any claim saw it
        q = probe.connect()
        q.execute("BEGIN")
        j_aborted2 = probe.produce(q, 2)[0]
        q.execute("ROLLBACK")
        q.close()
        made = probe.produce(p, 2, 2)
        final = [r[0] for r in drain(probe, c, [2])]
        everything = [x for r in rounds for x in r["claimed"]] + after + final
        return {
            "idle_job": j_idle, "aborted_jobs": [j_aborted, j_aborted2], "rounds": rounds,
            "cursor_while_idle": lo_while_idle, "claimed_after_idle_commit": after, "claimed_at_end": final,
            "not_stalled": not stalled,
            "idle_job_claimed_after_commit": after == [j_idle],
            "aborted_never_claimed": j_aborted not in everything and j_aborted2 not in everything,
            "ok": (not stalled) and after == [j_idle] and sorted(final) == sorted(made)
                  and j_aborted not in everything and j_aborted2 not in everything,
        }


def check_exactly_once(probe: Probe, seconds: float = 4.0, claimers: int = 3, producers: int = 2,
                       lanes: tuple[int, ...] = (3, 4, 5, 6)) -> dict:
    """(c) producers (some transactions held open a while, some rolled back) and claiming threads interleaved:
    every committed job taken exactly once, no aborted one taken, every take marked by the guard."""
    committed: list[int] = []
    rolled_back: list[int] = []
    claimed: list[tuple[int, int, bool]] = []
    errors: list[str] = []
    calls: list[int] = []
    lock = threading.Lock()
    stop = threading.Event()

    def produce(seed: int) -> None:
        rnd = random.Random(seed)
        try:
            with probe.connect() as conn:
                while not stop.is_set():
                    conn.execute("BEGIN")
                    ids = []
                    for _ in range(rnd.randint(1, 3)):
                        ids += probe.produce(conn, rnd.choice(lanes), rnd.randint(1, 4))
                    if rnd.random() < 0.3:
                        time.sleep(rnd.uniform(0.001, 0.05))  # held open: commits out of xid order
                    if rnd.random() < 0.1:
                        conn.execute("ROLLBACK")
                        with lock:
                            rolled_back.extend(ids)
                    else:
                        conn.execute("COMMIT")
                        with lock:
                            committed.extend(ids)
        except Exception as e:  # noqa: BLE001
            errors.append(f"producer: {e!r}")

    def claim(seed: int) -> None:
        rnd = random.Random(seed)
        order = list(lanes)
        try:
            with probe.connect() as conn:
                while not stop.is_set():
                    rnd.shuffle(order)
                    got = probe.claim(conn, order, rnd.randint(1, 7), f"c{seed}")
                    with lock:
                        claimed.extend(got)
                        calls.append(len(got))
                    if not got:
                        time.sleep(0.002)
        except Exception as e:  # noqa: BLE001
            errors.append(f"claimer: {e!r}")

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(producers)]
    threads += [threading.Thread(target=claim, args=(100 + i,)) for i in range(claimers)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    with probe.connect() as conn:
        claimed += drain(probe, conn, list(lanes))
        states = dict(conn.execute(probe.q("SELECT state, count(*) FROM {s}.probe_jobs WHERE lane_id = ANY(%s)"
                                           " GROUP BY state"), (list(lanes),)).fetchall())
        cursor_rows = conn.execute(probe.q("SELECT count(*) FROM {s}.lane_cursors WHERE lane_id = ANY(%s)"),
                                   (list(lanes),)).fetchone()[0]
    ids = [r[0] for r in claimed]
    duplicates = len(ids) - len(set(ids))
    missing = set(committed) - set(ids)
    aborted_taken = set(rolled_back) & set(ids)
    unmarked = [r[0] for r in claimed if not r[2]]
    return {
        "seconds": seconds, "claimers": claimers, "producers": producers, "lanes": len(lanes),
        "committed": len(committed), "rolled_back": len(rolled_back), "claimed": len(ids),
        "duplicates": duplicates, "missing": len(missing), "aborted_taken": len(aborted_taken),
        "unmarked": len(unmarked), "states": states, "cursor_rows": cursor_rows, "errors": errors,
        "claims": len(calls), "claims_nonempty": sum(1 for n in calls if n),
        "ok": not errors and duplicates == 0 and not missing and not aborted_taken and not unmarked
              and len(ids) == len(committed) and states.get("running", 0) == len(committed),
    }


def check_no_wait(probe: Probe) -> dict:
    """(d) a claim while another claim's transaction holds lane 7 returns at once, with lane 8's jobs only."""
    with probe.connect() as holder, probe.connect() as c, probe.connect() as p:
        c.execute("SET statement_timeout = '5s'")
        probe.claim(c, [9], 10)  # the function's first call on a connection compiles and plans it: not timed
        j7 = probe.produce(p, 7, 3)
        j8 = probe.produce(p, 8, 3)
        holder.execute("BEGIN")
        held = [r[0] for r in probe.claim(holder, [7], 1)]  # takes one job of lane 7, holds the lane
        try:
            t0 = time.perf_counter()
            both = probe.claim(c, [7, 8], 10)
            t_both = time.perf_counter() - t0
            t0 = time.perf_counter()
            only7 = probe.claim(c, [7], 10)
            t_only7 = time.perf_counter() - t0
        except psycopg.errors.QueryCanceled:  # it waited for the holder until statement_timeout
            holder.execute("ROLLBACK")
            return {"held_claim": held, "waited": True, "claim_7_8_ms": None, "claim_7_ms": None,
                    "claim_7_8_got": [], "claim_7_got": [], "after_release": [], "ok": False}
        holder.execute("COMMIT")
        after = [r[0] for r in drain(probe, c, [7, 8])]
        return {
            "held_claim": held, "claim_7_8_ms": round(t_both * 1000, 2), "claim_7_ms": round(t_only7 * 1000, 2),
            "claim_7_8_got": [r[0] for r in both], "claim_7_got": [r[0] for r in only7],
            "after_release": after,
            "ok": sorted(r[0] for r in both) == sorted(j8) and not only7 and t_both < 0.5 and t_only7 < 0.5
                  and sorted(after) == sorted(set(j7) - set(held)),
        }


# the design's sketch: one scan, the xip(lo) part as an OR; its index condition starts at the resume point,
# which is (0, 0) in every new range, so it walks the lane from its first entry
SKETCH_SCAN = """
SELECT r.xid, r.job_id FROM {s}.ready AS r
 WHERE r.lane_id = %(lane)s
   AND (r.xid, r.job_id) > (%(last_xid)s::xid8, %(last_job)s::bigint)
   AND (r.xid >= pg_snapshot_xmax(%(lo)s::pg_snapshot) OR r.xid = ANY(ARRAY(SELECT pg_snapshot_xip(%(lo)s::pg_snapshot))))
   AND r.xid < pg_snapshot_xmax(%(hi)s::pg_snapshot) AND pg_visible_in_snapshot(r.xid, %(hi)s::pg_snapshot)
 ORDER BY r.xid, r.job_id
 LIMIT %(limit)s
"""


def entries_read(probe: Probe, conn, statement, params=()) -> tuple[list, int, int]:
    """Run a statement in a transaction and return its rows and the entries it read of ready's index and of
    lane_cursors' (pg_stat_get_xact_tuples_returned: this transaction's own counts)."""
    counts = probe.q("SELECT pg_stat_get_xact_tuples_returned('{s}.ready_lane_xid'::regclass),"
                     " pg_stat_get_xact_tuples_returned('{s}.lane_cursors_latest'::regclass)")
    # the backend's counts not yet flushed to the cumulative statistics: flushed between transactions only,
    # so the difference within one transaction is the statement's own
    with conn.transaction():
        before = conn.execute(counts).fetchone()
        rows = conn.execute(statement, params).fetchall()
        after = conn.execute(counts).fetchone()
    return rows, after[0] - before[0], after[1] - before[1]


def claim_statement(probe: Probe, lanes: list[int], limit: int) -> tuple:
    return (sql.SQL("SELECT job_id, lane_id, marked FROM {}.claim(%s, %s, %s, %s, %s)").format(probe.s),
            (lanes, limit, "counted", 30.0, probe.space))


def measure_walks(probe: Probe, history: int = 20000) -> dict:
    """Index entries read, counted: the design's one-scan sketch against the two parts, on a lane with
    `history` entries claimed already; a large aborted transaction in an idle lane; a producer idle in a
    transaction."""
    out: dict = {}
    with probe.connect() as c:
        lane = 130
        for _ in range(history // 1000):
            probe.produce(c, lane, 1000)
        drain(probe, c, [lane], limit=1000, rounds=100)
        fresh = probe.produce(c, lane, 5)
        lo = c.execute(probe.q("SELECT hi::text FROM {s}.lane_cursors WHERE lane_id = %s ORDER BY step DESC LIMIT 1"),
                       (lane,)).fetchone()[0]
        hi = c.execute("SELECT pg_current_snapshot()::text").fetchone()[0]
        params = {"lane": lane, "lo": lo, "hi": hi, "last_xid": "0", "last_job": 0, "limit": 20}
        rows, sketch_entries, _ = entries_read(probe, c, probe.q(SKETCH_SCAN), params)
        got, claim_entries, cursor_entries = entries_read(probe, c, *claim_statement(probe, [lane], 20))
        out["history"] = history
        out["sketch_new_range"] = {"returned": len(rows), "ready_entries_read": sketch_entries}
        out["two_parts_new_range"] = {"returned": len(got), "ready_entries_read": claim_entries,
                                      "cursor_entries_read": cursor_entries}
        out["same_jobs"] = sorted(r[1] for r in rows) == sorted(r[0] for r in got) == sorted(fresh)

        # an aborted transaction of 1,000 entries in an idle lane, begun while a range was open
        lane = 131
        probe.produce(c, lane)
        drain(probe, c, [lane])
        with probe.connect() as big:
            big.execute("BEGIN")
            probe.produce(big, lane, 1000)
            _, during, _ = entries_read(probe, c, *claim_statement(probe, [lane], 20))
            big.execute("ROLLBACK")
        after = [entries_read(probe, c, *claim_statement(probe, [lane], 20))[1] for _ in range(4)]
        out["aborted_1000_in_idle_lane"] = {"entries_read_while_open": during, "entries_read_next_claims": after}

        # a producer idle in its transaction, 10 entries on a busy lane: what each claim of that lane reads
        lane = 132
        probe.produce(c, lane)
        drain(probe, c, [lane])
        with probe.connect() as idle:
            idle.execute("BEGIN")
            probe.produce(idle, lane, 10)
            reads = []
            for _ in range(5):
                probe.produce(c, lane, 5)
                got, n, m = entries_read(probe, c, *claim_statement(probe, [lane], 20))
                reads.append((len(got), n))
                drain(probe, c, [lane])
            idle.execute("ROLLBACK")
        out["idle_producer_10_entries"] = {"claims_taken_and_entries_read": reads}
    return out


def check_isolation(probe: Probe) -> dict:
    """(f) a claim inside a REPEATABLE READ transaction whose snapshot predates another claim: refused.
    Without the refusal (checked on a copy of the function) it would read the older cursor row."""
    with probe.connect() as rr, probe.connect() as c, probe.connect() as p:
        drain(probe, c, [150])
        jobs = probe.produce(p, 150, 3)
        rr.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        rr.execute("SELECT 1")  # its snapshot: before the claim below
        first = [r[0] for r in probe.claim(c, [150], 10)]
        try:
            again = probe.claim(rr, [150], 10)
            refused = False
        except psycopg.errors.RaiseException:
            again, refused = [], True
        except psycopg.errors.SerializationFailure as e:  # the copy without the refusal: it took them again
            again, refused = [("serialization failure", str(e).splitlines()[0])], False
        rr.execute("ROLLBACK")
        return {"first": first, "refused": refused, "again": [list(r) for r in again],
                "ok": refused and sorted(first) == sorted(jobs)}


def check_row_lock_wait(probe: Probe) -> dict:
    """(e) the guard's update by primary key waits for a transaction that holds the job's row (a cancel, a
    user's UPDATE) even though the lane itself is free: measured with a 1 s statement_timeout."""
    with probe.connect() as other, probe.connect() as c, probe.connect() as p:
        drain(probe, c, [140])
        jobs = probe.produce(p, 140, 2)
        other.execute("BEGIN")
        other.execute(probe.q("UPDATE {s}.probe_jobs SET payload = 'touched' WHERE id = %s"), (jobs[0],))
        c.execute("SET statement_timeout = '1s'")
        t0 = time.perf_counter()
        try:
            got = [r[0] for r in probe.claim(c, [140], 10)]
            waited = False
        except psycopg.errors.QueryCanceled:
            got, waited = [], True
        took = time.perf_counter() - t0
        other.execute("ROLLBACK")
        c.execute("SET statement_timeout = 0")
        after = [r[0] for r in drain(probe, c, [140])]
        return {"waited": waited, "ms": round(took * 1000, 1), "got": got, "after": after}


def measure_costs(probe: Probe, calls: int = 300) -> dict:
    """What a claim costs with nothing to take: one lane, eight lanes (client-side mean, one connection);
    a round trip of SELECT 1 for scale."""
    lanes = list(range(100, 108))
    with probe.connect() as c:
        for lane in lanes:  # each lane has a cursor row, its range exhausted: the steady state of an idle lane
            probe.produce(c, lane)
        drain(probe, c, lanes)

        def mean_ms(fn) -> float:
            for _ in range(20):
                fn()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            return (time.perf_counter() - t0) / calls * 1000

        rows_before = c.execute(probe.q("SELECT count(*) FROM {s}.lane_cursors")).fetchone()[0]
        out = {
            "select_1_ms": mean_ms(lambda: c.execute("SELECT 1").fetchone()),
            "empty_1_lane_ms": mean_ms(lambda: probe.claim(c, lanes[:1], 10)),
            "empty_8_lanes_ms": mean_ms(lambda: probe.claim(c, lanes, 10)),
        }
        # an idle producer on another lane puts its xid into every new range's xip
        idle = probe.connect()
        idle.execute("BEGIN")
        probe.produce(idle, 120)
        drain(probe, c, lanes)
        out["empty_8_lanes_idle_producer_ms"] = mean_ms(lambda: probe.claim(c, lanes, 10))
        idle.execute("ROLLBACK")
        idle.close()
        out["cursor_rows_written_by_empty_claims"] = (
            c.execute(probe.q("SELECT count(*) FROM {s}.lane_cursors")).fetchone()[0] - rows_before)
    return out


def correctness(dsn: str, seconds: float = 4.0, costs: bool = True) -> dict:
    probe = Probe(dsn, "cursor")
    probe.setup()
    try:
        return {
            "a_out_of_order": check_out_of_order(probe),
            "b_idle_producer": check_idle_producer(probe),
            "c_exactly_once": check_exactly_once(probe, seconds),
            "d_no_wait": check_no_wait(probe),
            "costs": measure_costs(probe) if costs else None,
            "walks": measure_walks(probe) if costs else None,
            "e_row_lock": check_row_lock_wait(probe) if costs else None,
            "f_isolation": check_isolation(probe),
        }
    finally:
        probe.drop()


# ---------------------------------------------------------------------------------------------- part 2

INDEX_STATS = """
SELECT c.relname, pg_stat_get_tuples_returned(c.oid), pg_stat_get_blocks_fetched(c.oid),
       pg_stat_get_blocks_fetched(c.oid) - pg_stat_get_blocks_hit(c.oid)
  FROM pg_class c WHERE c.relnamespace = %s::regnamespace AND c.relkind = 'i'
"""

TABLE_STATS = """
SELECT c.relname, pg_relation_size(c.oid), pg_stat_get_dead_tuples(c.oid), pg_stat_get_live_tuples(c.oid),
       pg_stat_get_vacuum_count(c.oid) + pg_stat_get_autovacuum_count(c.oid)
  FROM pg_class c WHERE c.relnamespace = %s::regnamespace AND c.relkind = 'r'
"""

# the indexes each claim walks
CLAIM_INDEXES = {"cursor": ("ready_lane_xid", "lane_cursors_latest"), "today": ("probe_jobs_ready",)}


def explain_scan(probe: Probe, conn, lane: int, limit: int) -> str:
    """The claim's scan once under EXPLAIN (ANALYZE, BUFFERS), in a transaction rolled back."""
    try:
        with conn.transaction(force_rollback=True):
            if probe.mode == "today":
                text = "EXPLAIN (ANALYZE, BUFFERS) " + TODAY_CLAIM_ONE
                rows = conn.execute(probe.q(text), {"lane": lane, "limit": limit, "worker": "explain", "lease": 30.0})
                return "\n".join(r[0] for r in rows)
            cur = conn.execute(probe.q("SELECT lo, hi, last_xid, last_job, exhausted FROM {s}.lane_cursors"
                                       " WHERE lane_id = %s ORDER BY step DESC LIMIT 1"), (lane,)).fetchone()
            if cur is None:
                return "no cursor row yet"
            lo, hi, last_xid, last_job, exhausted = cur
            if exhausted:  # the next claim opens a new range: scan it as that claim would
                lo, last_xid, last_job = hi, None, None
                hi = conn.execute("SELECT pg_current_snapshot()").fetchone()[0]
            text = """EXPLAIN (ANALYZE, BUFFERS)
SELECT r.xid, r.job_id FROM {s}.ready AS r
 WHERE r.lane_id = %(lane)s
   AND (r.xid, r.job_id) > (coalesce(greatest(%(last_xid)s::xid8, pg_snapshot_xmax(%(lo)s::pg_snapshot)), '0'),
                            CASE WHEN %(last_xid)s::xid8 >= pg_snapshot_xmax(%(lo)s::pg_snapshot)
                                 THEN %(last_job)s::bigint ELSE -1 END)
   AND r.xid < pg_snapshot_xmax(%(hi)s::pg_snapshot)
   AND r.xid <> ALL (ARRAY(SELECT pg_snapshot_xip(%(hi)s::pg_snapshot)))
 ORDER BY r.xid, r.job_id
 LIMIT %(limit)s"""
            rows = conn.execute(probe.q(text), {"lane": lane, "lo": str(lo), "hi": str(hi), "limit": limit,
                                                "last_xid": None if last_xid is None else str(last_xid),
                                                "last_job": last_job})
            return "\n".join(r[0] for r in rows)
    except psycopg.Error as e:
        return f"not measured: {e}".strip()


class Load:
    """A producer at a steady rate and one claim loop, sampled every `every` seconds."""

    def __init__(self, probe: Probe, args: argparse.Namespace, console) -> None:
        self.probe, self.args, self.console = probe, args, console
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.produced = 0
        self.claimed = 0
        self.claims = 0
        self.claim_times: list[float] = []
        self.errors: list[str] = []

    def producer(self) -> None:
        a = self.args
        per_tx = max(1, a.per_tx)
        interval = per_tx / a.rate
        try:
            with self.probe.connect() as conn:
                start = time.monotonic()
                sent = 0
                while not self.stop.is_set():
                    due = start + sent / a.rate
                    now = time.monotonic()
                    if due > now:
                        time.sleep(min(due - now, interval))
                        continue
                    n = len(self.probe.produce(conn, 1, per_tx))
                    sent += n
                    with self.lock:
                        self.produced += n
        except Exception as e:  # noqa: BLE001
            self.errors.append(f"producer: {e!r}")

    def claimer(self) -> None:
        try:
            with self.probe.connect() as conn:
                while not self.stop.is_set():
                    t0 = time.perf_counter()
                    got = self.probe.claim(conn, [1], self.args.batch, "loop")
                    took = time.perf_counter() - t0
                    if got:
                        self.probe.complete(conn, [r[0] for r in got])
                    with self.lock:
                        self.claims += 1
                        self.claimed += len(got)
                        self.claim_times.append(took)
                    if len(got) < self.args.batch:
                        time.sleep(0.005)  # caught up: as a worker does, wait a moment before the next claim
        except Exception as e:  # noqa: BLE001
            self.errors.append(f"claimer: {e!r}")

    def index_stats(self, conn) -> dict[str, tuple[int, int, int]]:
        return {r[0]: (r[1], r[2], r[3]) for r in conn.execute(INDEX_STATS, (self.probe.name,))}

    def run(self) -> dict:
        from rich.table import Table

        a, probe = self.args, self.probe
        rows: list[dict] = []
        explains: dict[str, str] = {}
        threads = [threading.Thread(target=self.producer), threading.Thread(target=self.claimer)]
        for t in threads:
            t.start()
        holder = probe.connect()
        mon = probe.connect()
        total = a.warmup + a.hold + a.after
        start = time.monotonic()
        phase = "warm-up"
        prev = {"at": start, "stats": self.index_stats(mon), "produced": 0, "claimed": 0, "claims": 0, "times": 0}
        table = Table(title=f"{probe.mode} claim: {a.rate:,.0f} jobs/s offered, claims of {a.batch}",
                      show_lines=False)
        for col in ("t s", "phase", "produced/s", "claimed/s", "backlog", "claims/s", "claim ms mean", "p99",
                    "entries/claim", "idx bufs/claim", "cursor rows"):
            table.add_column(col, justify="right")
        tick = 1
        hold_at, end_at = start + a.warmup, start + total
        try:
            while True:
                next_tick = start + tick * a.every
                boundary = hold_at if phase == "warm-up" else hold_at + a.hold if phase == "held" else end_at
                wake = min(next_tick, boundary, end_at)
                now = time.monotonic()
                if wake > now:
                    time.sleep(wake - now)
                now = time.monotonic()
                if self.errors:
                    break
                window_phase = phase  # the phase the sample's window was in
                if phase == "warm-up" and now >= hold_at:
                    explains["end of warm-up"] = explain_scan(probe, mon, 1, a.batch)
                    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                    holder.execute(probe.q("SELECT count(*) FROM {s}.probe_jobs"))  # takes the snapshot
                    phase = "held"
                elif phase == "held" and now >= hold_at + a.hold:
                    explains["end of hold"] = explain_scan(probe, mon, 1, a.batch)
                    holder.execute("COMMIT")
                    phase = "after"
                if now < next_tick - 0.001:
                    if now >= end_at:
                        break
                    continue
                tick += 1
                stats = self.index_stats(mon)
                with self.lock:
                    produced, claimed, claims = self.produced, self.claimed, self.claims
                    times = self.claim_times[prev["times"]:]
                    n_times = len(self.claim_times)
                secs = now - prev["at"]
                d_claims = claims - prev["claims"]
                entries = sum(stats[i][0] - prev["stats"][i][0] for i in CLAIM_INDEXES[probe.mode])
                bufs = sum(stats[i][1] - prev["stats"][i][1] for i in CLAIM_INDEXES[probe.mode])
                ready_entries = (stats["ready_lane_xid"][0] - prev["stats"]["ready_lane_xid"][0]
                                 if probe.mode == "cursor" else None)
                cursor_rows = (mon.execute(probe.q("SELECT count(*) FROM {s}.lane_cursors")).fetchone()[0]
                               if probe.mode == "cursor" else None)
                row = {
                    "t": round(now - start, 1), "phase": window_phase,
                    "produced_per_s": (produced - prev["produced"]) / secs,
                    "claimed_per_s": (claimed - prev["claimed"]) / secs,
                    "backlog": produced - claimed,
                    "claims_per_s": d_claims / secs,
                    "claim_ms_mean": statistics.fmean(times) * 1000 if times else None,
                    "claim_ms_p99": sorted(times)[int(0.99 * (len(times) - 1))] * 1000 if times else None,
                    "index_entries_per_claim": entries / d_claims if d_claims else None,
                    "ready_entries_per_claim": ready_entries / d_claims if d_claims and ready_entries is not None
                    else None,
                    "index_buffers_per_claim": bufs / d_claims if d_claims else None,
                    "cursor_rows": cursor_rows,
                    "tables": {r[0]: {"bytes": r[1], "dead": r[2], "live": r[3], "vacuums": r[4]}
                               for r in mon.execute(TABLE_STATS, (probe.name,))},
                }
                rows.append(row)
                prev = {"at": now, "stats": stats, "produced": produced, "claimed": claimed, "claims": claims,
                        "times": n_times}

                def f(v, fmt="{:,.1f}"):
                    return "-" if v is None else fmt.format(v)

                table.add_row(f(row["t"], "{:.0f}"), window_phase, f(row["produced_per_s"], "{:,.0f}"),
                              f(row["claimed_per_s"], "{:,.0f}"), f(row["backlog"], "{:,}"),
                              f(row["claims_per_s"], "{:,.0f}"), f(row["claim_ms_mean"], "{:.2f}"),
                              f(row["claim_ms_p99"], "{:.2f}"), f(row["index_entries_per_claim"]),
                              f(row["index_buffers_per_claim"]), f(cursor_rows, "{:,}"))
                self.console.print(f"  [{probe.mode}] t={row['t']:.0f}s {window_phase}: claim {f(row['claim_ms_mean'], '{:.2f}')} ms,"
                                   f" {f(row['index_entries_per_claim'])} entries/claim,"
                                   f" {f(row['index_buffers_per_claim'])} idx bufs/claim, backlog {row['backlog']:,}")
                if now >= end_at - 0.001:
                    break
        finally:
            self.stop.set()
            for t in threads:
                t.join()
            try:
                holder.execute("ROLLBACK")
            except psycopg.Error:
                pass
            holder.close()
            mon.close()
        self.console.print(table)
        for label, text in explains.items():
            self.console.print(f"[bold]{probe.mode}, {label}[/bold]: EXPLAIN (ANALYZE, BUFFERS) of the scan")
            self.console.print(text, markup=False, highlight=False)
        return {"mode": probe.mode, "rows": rows, "explains": explains, "errors": self.errors,
                "claims": self.claims, "claimed": self.claimed, "produced": self.produced}


def summarise(result: dict, args: argparse.Namespace) -> dict:
    """Means over the last `window` seconds before the hold and the last `window` seconds of the hold."""
    rows = result["rows"]
    window = min(30.0, args.warmup, args.hold)
    warm_end = args.warmup
    hold_end = args.warmup + args.hold

    def mean(key: str, lo: float, hi: float) -> float | None:
        vals = [r[key] for r in rows if lo < r["t"] <= hi + 0.5 and r[key] is not None]
        return statistics.fmean(vals) if vals else None

    out = {}
    for label, lo, hi in (("before hold", warm_end - window, warm_end), ("end of hold", hold_end - window, hold_end)):
        out[label] = {k: mean(k, lo, hi) for k in ("claim_ms_mean", "claim_ms_p99", "index_entries_per_claim",
                                                   "index_buffers_per_claim", "claimed_per_s", "claims_per_s")}
        out[label]["backlog"] = next((r["backlog"] for r in reversed(rows) if r["t"] <= hi + 0.5), None)
    return out


# ---------------------------------------------------------------------------------------------- main

def print_checks(console, checks: dict) -> None:
    from rich.table import Table

    table = Table(title="Correctness of the cursor claim (real concurrent sessions)")
    table.add_column("check")
    table.add_column("held", justify="center")
    table.add_column("what was seen")
    a, b, c, d = (checks[k] for k in ("a_out_of_order", "b_idle_producer", "c_exactly_once", "d_no_wait"))
    table.add_row("a. late commit of an earlier xid is not skipped", str(a["ok"]),
                  f"claimed while T1 open {a['claimed_while_t1_open']} (T2's job {a['t2_job']}); "
                  f"after T1's commit {a['claimed_after_t1_commit']} (T1's job {a['t1_job']})")
    table.add_row("b. idle-in-transaction producer does not stall; aborted never returned", str(b["ok"]),
                  f"{len(b['rounds'])} rounds all claimed: {b['not_stalled']}; idle job {b['idle_job']} after its "
                  f"commit: {b['claimed_after_idle_commit']}; aborted {b['aborted_jobs']} never claimed: "
                  f"{b['aborted_never_claimed']}")
    table.add_row("c. exactly once (3 claimers, 2 producers, 4 lanes)", str(c["ok"]),
                  f"committed {c['committed']:,}, claimed {c['claimed']:,}, duplicates {c['duplicates']}, "
                  f"missing {c['missing']}, aborted taken {c['aborted_taken']} (of {c['rolled_back']}), "
                  f"guard misses {c['unmarked']}, cursor rows {c['cursor_rows']:,} "
                  f"{'errors ' + '; '.join(c['errors']) if c['errors'] else ''}")
    table.add_row("d. a claim never waits on another", str(d["ok"]),
                  f"lane 7 held: claim(7,8) {d['claim_7_8_ms']} ms -> {d['claim_7_8_got']}; "
                  f"claim(7) {d['claim_7_ms']} ms -> {d['claim_7_got']}; after release {d['after_release']}")
    console.print(table)
    e = checks.get("costs")
    if e:
        console.print(f"A claim with nothing to take (mean of 300, client side): 1 lane {e['empty_1_lane_ms']:.3f} ms, "
                      f"8 lanes {e['empty_8_lanes_ms']:.3f} ms, 8 lanes with a producer idle in a transaction "
                      f"{e['empty_8_lanes_idle_producer_ms']:.3f} ms; SELECT 1 {e['select_1_ms']:.3f} ms; "
                      f"cursor rows written by empty claims: {e['cursor_rows_written_by_empty_claims']}. "
                      f"Check c: {c['claims']:,} claims ({c['claims_nonempty']:,} took jobs) wrote "
                      f"{c['cursor_rows']:,} cursor rows.")
    w = checks.get("walks")
    if w:
        console.print(f"Index entries read, lane with {w['history']:,} entries claimed already, 5 new: the design's "
                      f"one-scan sketch {w['sketch_new_range']['ready_entries_read']:,} "
                      f"(returned {w['sketch_new_range']['returned']}); the two parts "
                      f"{w['two_parts_new_range']['ready_entries_read']:,} (returned "
                      f"{w['two_parts_new_range']['returned']}); same jobs: {w['same_jobs']}. "
                      f"Aborted 1,000-entry transaction in an idle lane: {w['aborted_1000_in_idle_lane']}. "
                      f"Producer idle with 10 entries: (taken, entries read) per claim "
                      f"{w['idle_producer_10_entries']['claims_taken_and_entries_read']}.")
    r = checks.get("e_row_lock")
    if r:
        console.print(f"e. the guard's update by key while another transaction holds a pending job's row: "
                      f"waited {r['waited']} ({r['ms']} ms, statement_timeout 1 s), got {r['got']}, "
                      f"after its release {r['after']}")
    i = checks.get("f_isolation")
    if i:
        console.print(f"f. a claim in a REPEATABLE READ transaction older than the last claim: refused {i['refused']} "
                      f"(held: {i['ok']})")


def main() -> int:
    from rich.console import Console
    from rich.table import Table

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", help="a server to use (a scratch schema in its database); default: start one")
    parser.add_argument("--checks-only", action="store_true", help="part 1 only")
    parser.add_argument("--skip-checks", action="store_true", help="part 2 only")
    parser.add_argument("--check-seconds", type=float, default=4.0, help="length of check c")
    parser.add_argument("--modes", default="cursor,today", help="claims measured in part 2, in this order")
    parser.add_argument("--rate", type=float, default=1000.0, help="jobs per second the producer commits")
    parser.add_argument("--per-tx", type=int, default=10, help="jobs per producer transaction")
    parser.add_argument("--batch", type=int, default=20, help="jobs per claim")
    parser.add_argument("--warmup", type=float, default=30.0)
    parser.add_argument("--hold", type=float, default=120.0)
    parser.add_argument("--after", type=float, default=0.0, help="seconds of load after the hold ends")
    parser.add_argument("--every", type=float, default=10.0)
    parser.add_argument("--out", default=str(HERE / "results-cursor-probe.json"))
    args = parser.parse_args()
    console = Console(width=170)

    cluster = None
    dsn = args.dsn
    if dsn is None:
        sys.path.insert(0, str(HERE))
        from soak import Cluster  # noqa: E402

        cluster = Cluster()
        dsn = cluster.start()
        console.print(f"PostgreSQL of its own, default settings: {dsn}")
    result: dict = {
        "command": "benchmarks/cursor_probe.py " + " ".join(sys.argv[1:]),
        "at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "note": "cores shared with other work; compare the claims within one run"},
        "args": vars(args),
    }
    ok = True
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            result["server"] = conn.execute("SHOW server_version").fetchone()[0]
        if not args.skip_checks:
            checks = correctness(dsn, args.check_seconds)
            result["checks"] = checks
            print_checks(console, checks)
            ok = all(v["ok"] for k, v in checks.items() if k[:2] in ("a_", "b_", "c_", "d_", "f_"))
        if not args.checks_only:
            result["measured"] = {}
            for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
                probe = Probe(dsn, mode)
                probe.setup()
                try:
                    console.print(f"[bold]{mode} claim[/bold]: {args.warmup:.0f} s of load, then a snapshot held "
                                  f"{args.hold:.0f} s (schema {probe.name})")
                    run = Load(probe, args, console).run()
                    run["summary"] = summarise(run, args)
                    result["measured"][mode] = run
                finally:
                    probe.drop()
            table = Table(title="Claim before and at the end of the hold (means of the last 30 s of each)")
            for col in ("claim", "when", "claim ms mean", "p99 ms", "index entries/claim", "index bufs/claim",
                        "claimed/s", "backlog"):
                table.add_column(col, justify="right")
            for mode, run in result["measured"].items():
                for label, s in run["summary"].items():
                    def f(v, fmt="{:,.2f}"):
                        return "-" if v is None else fmt.format(v)
                    table.add_row(mode, label, f(s["claim_ms_mean"]), f(s["claim_ms_p99"]),
                                  f(s["index_entries_per_claim"], "{:,.1f}"), f(s["index_buffers_per_claim"], "{:,.1f}"),
                                  f(s["claimed_per_s"], "{:,.0f}"), f(s["backlog"], "{:,}"))
            console.print(table)
    finally:
        if cluster is not None:
            cluster.stop()
        Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
        console.print(f"written: {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
