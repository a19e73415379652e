-- joblane schema, version 13: the claim reads ready jobs from a cursor, never
-- past what it already handed out (docs/architecture.md, "Storage that a long
-- transaction cannot slow down", build step 5).
--
-- Until now claim_jobs walked jobs_ready from the first position a ready job
-- could have. While any session held an old snapshot, every job claimed since
-- left a dead version on that walk, and each claim read them all (286,000
-- index entries per claim after ten minutes at 1,000 jobs/s). Now:
--
-- * Every time a job becomes pending, one narrow row is appended: to `ready`
--   when it is due, to `deferred` when it is not. Triggers on jobs write them,
--   whichever path made the job pending (enqueue, a retry, a rescue, a release,
--   a plain INSERT ...), so none can forget.
-- * A lane is one queue at one priority (its shard column, 0 for now, leaves
--   room to split a busy queue's lane for many claimers).
--   Its cursor is a pair of snapshots (lo, hi) and a position: the range holds
--   the lane's entries whose transaction is visible in hi and was not in lo,
--   read in (xid, job id) order. A transaction that commits late lands in the
--   range whose hi first sees it, so it is never skipped, and a producer idle
--   in a transaction holds nothing back (its xid is probed once per range).
-- * Cursor rows are appended, never updated: one per claim that moved a lane.
--   A claim reads a lane's latest row and the entries after it, then the
--   jobs it took by primary key. Nothing it reads was ever updated or deleted.
-- * A lane is claimed by one claim statement at a time (a transaction-scoped
--   try-lock); a claimer that finds a lane busy goes on to the next one and
--   never waits.
-- * Deferred jobs are promoted into `ready` by the claims themselves, one
--   claimer at a time, with a cursor of their own (lane 0): the rows due since
--   its time, and the rows of transactions it could not see yet.
-- * `ready` and `cursors` are rings of four partitions. rotate_ready (run by
--   the rescuer) turns to the next slot every few seconds and empties a slot
--   with TRUNCATE once every transaction that wrote into it has ended and every
--   lane's cursor is past it: space comes back however old a snapshot is.
--
-- jobs stays a table: the claim marks the jobs it took running by primary key,
-- skipping any row another transaction holds (and appending it again).
-- jobs_ready stays for the limited claim and the dashboard; rescue still walks
-- jobs_lease.
--
-- Upgrade: every pending job gets its entry here, in one statement each for
-- the due and the deferred ones (a read of the pending jobs); a claim of
-- version 12 still running keeps working on jobs_ready meanwhile.

-- A lane's id is a hash of its queue and priority (lane_of), so a producer
-- writes its entries without looking a lane up. lanes lists the lanes in use
-- for the claimers; it has no unique key on purpose: the first producers of a
-- new lane may each add its row (harmless duplicates), where a unique key
-- would make each of them wait for the first one's commit. Two lanes whose
-- hashes meet share the id: a claimer of one passes over the other's jobs,
-- which go back to the lane (claim_jobs), so nothing is lost.
CREATE TABLE {schema}.lanes (
    lane_id integer NOT NULL,
    queue text NOT NULL,
    priority smallint NOT NULL,
    shard smallint NOT NULL DEFAULT 0 CHECK (shard BETWEEN 0 AND 3)
);
CREATE INDEX lanes_queue ON {schema}.lanes (queue, priority);
CREATE INDEX lanes_id ON {schema}.lanes (lane_id);

-- 0 and -1 are the promotion's and the rotation's lock keys (and 0 the
-- promotion's cursor): no lane takes them.
CREATE FUNCTION {schema}.lane_of(p_queue text, p_priority smallint) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN hashtext(p_priority::text || ':' || p_queue) BETWEEN -1 AND 0 THEN 1
                ELSE hashtext(p_priority::text || ':' || p_queue) END
$$;

-- The ring's turn: the current slot of ready and cursors is last_value % 4.
CREATE SEQUENCE {schema}.ready_turn MINVALUE 0 START 0;
SELECT setval('{schema}.ready_turn', 0, true);
-- Orders cursor rows (a lane's latest is its highest step).
CREATE SEQUENCE {schema}.cursor_step;

CREATE TABLE {schema}.ready (
    slot smallint NOT NULL,
    lane_id integer NOT NULL,
    xid xid8 NOT NULL,
    job_id bigint NOT NULL
) PARTITION BY LIST (slot);
CREATE TABLE {schema}.ready_0 PARTITION OF {schema}.ready FOR VALUES IN (0) WITH (autovacuum_enabled = off);
CREATE TABLE {schema}.ready_1 PARTITION OF {schema}.ready FOR VALUES IN (1) WITH (autovacuum_enabled = off);
CREATE TABLE {schema}.ready_2 PARTITION OF {schema}.ready FOR VALUES IN (2) WITH (autovacuum_enabled = off);
CREATE TABLE {schema}.ready_3 PARTITION OF {schema}.ready FOR VALUES IN (3) WITH (autovacuum_enabled = off);
CREATE INDEX ready_lane ON {schema}.ready (lane_id, xid, job_id);

CREATE TABLE {schema}.cursors (
    slot smallint NOT NULL,
    lane_id integer NOT NULL,
    step bigint NOT NULL,
    lo pg_snapshot NOT NULL,
    hi pg_snapshot NOT NULL,
    last_xid xid8 NOT NULL,
    last_job bigint NOT NULL,
    exhausted boolean NOT NULL,
    at timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (slot);
CREATE TABLE {schema}.cursors_0 PARTITION OF {schema}.cursors FOR VALUES IN (0) WITH (autovacuum_enabled = off);
CREATE TABLE {schema}.cursors_1 PARTITION OF {schema}.cursors FOR VALUES IN (1) WITH (autovacuum_enabled = off);
CREATE TABLE {schema}.cursors_2 PARTITION OF {schema}.cursors FOR VALUES IN (2) WITH (autovacuum_enabled = off);
CREATE TABLE {schema}.cursors_3 PARTITION OF {schema}.cursors FOR VALUES IN (3) WITH (autovacuum_enabled = off);
CREATE INDEX cursors_lane ON {schema}.cursors (lane_id, step);

-- One row per turn of the ring: the slot it left and left_xid, an xid the
-- turning transaction took after the turn. A writer reads the slot after it
-- has its own xid, so every writer into the slot left has an xid below
-- left_xid: the slot may go once no such transaction runs and every lane's
-- cursor has a lo taken after they all ended. (A snapshot's xmax would not
-- do: since PostgreSQL 14 it is one past the latest completed xid, and a
-- transaction running with a higher xid is neither below it nor in xip.)
-- cleared_at is set when the slot was emptied.
CREATE TABLE {schema}.ready_turns (
    turn bigint PRIMARY KEY,
    left_slot smallint NOT NULL,
    left_at timestamptz NOT NULL DEFAULT now(),
    left_xid xid8 NOT NULL,
    cleared_at timestamptz
);

-- Pending jobs not due yet: promoted into ready by the claims once due.
CREATE TABLE {schema}.deferred (
    due_at timestamptz NOT NULL,
    xid xid8 NOT NULL,
    job_id bigint NOT NULL
);
CREATE INDEX deferred_due ON {schema}.deferred (due_at);
CREATE INDEX deferred_xid ON {schema}.deferred (xid);

-- Append the entries of jobs that became pending: ready when due, deferred
-- when not. The triggers call it in the transaction of whoever wrote the job,
-- as the schema's owner (SECURITY DEFINER): the app role, which may insert
-- jobs, needs no grant on these tables. The claim calls it as the worker.
CREATE FUNCTION {schema}.queue_entries(p_ids bigint[], p_queues text[], p_priorities smallint[],
                                       p_run_after timestamptz[])
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_xid xid8 := pg_current_xact_id();  -- first: the slot is read after this transaction has its xid
    v_slot smallint;
    v_now timestamptz := clock_timestamp();
    v_due int;
BEGIN
    SELECT (last_value % 4)::smallint INTO v_slot FROM {schema}.ready_turn;
    INSERT INTO {schema}.ready (slot, lane_id, xid, job_id)
    SELECT v_slot, {schema}.lane_of(t.queue, t.priority), v_xid, t.id
      FROM unnest(p_ids, p_queues, p_priorities, p_run_after) AS t(id, queue, priority, run_after)
     WHERE t.run_after <= v_now;
    GET DIAGNOSTICS v_due = ROW_COUNT;
    -- a lane not listed yet (its first job): listed for the claimers
    INSERT INTO {schema}.lanes (lane_id, queue, priority)
    SELECT {schema}.lane_of(t.queue, t.priority), t.queue, t.priority
      FROM (SELECT DISTINCT u.queue, u.priority FROM unnest(p_queues, p_priorities) AS u(queue, priority)) AS t
     WHERE NOT EXISTS (SELECT 1 FROM {schema}.lanes AS l WHERE l.lane_id = {schema}.lane_of(t.queue, t.priority)
                                                           AND l.queue = t.queue AND l.priority = t.priority);
    IF v_due < cardinality(p_ids) THEN
        INSERT INTO {schema}.deferred (due_at, xid, job_id)
        SELECT t.run_after, v_xid, t.id
          FROM unnest(p_ids, p_run_after) AS t(id, run_after)
         WHERE t.run_after > v_now;
    END IF;
END
$$;

-- The entries of jobs already in the table, found pending by primary key.
CREATE FUNCTION {schema}.requeue_jobs(p_ids bigint[])
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v record;
BEGIN
    SELECT array_agg(j.id) AS ids, array_agg(j.queue) AS queues, array_agg(j.priority) AS priorities,
           array_agg(j.run_after) AS run_after
      INTO v
      FROM {schema}.jobs AS j
     WHERE j.id = ANY(p_ids) AND (j.state = 'pending') IS TRUE;  -- by primary key, not jobs_ready
    IF v.ids IS NOT NULL THEN
        PERFORM {schema}.queue_entries(v.ids, v.queues, v.priorities, v.run_after);
    END IF;
END
$$;

-- The enqueue path: one statement per INSERT on jobs, however many jobs
-- (queue_entries' three steps in one, without a call of its own: this runs
-- once per enqueue). The insert into jobs gave the transaction its xid, so
-- the slot is read after it (rotate_ready).
CREATE FUNCTION {schema}.jobs_added() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    WITH a AS MATERIALIZED (
        SELECT n.id, n.queue, n.priority, n.run_after, n.run_after <= clock_timestamp() AS due
          FROM added AS n
         WHERE n.state = 'pending'
    ), listed AS (
        INSERT INTO {schema}.lanes (lane_id, queue, priority)
        SELECT {schema}.lane_of(t.queue, t.priority), t.queue, t.priority
          FROM (SELECT DISTINCT a.queue, a.priority FROM a) AS t
         WHERE NOT EXISTS (SELECT 1 FROM {schema}.lanes AS l
                            WHERE l.lane_id = {schema}.lane_of(t.queue, t.priority)
                              AND l.queue = t.queue AND l.priority = t.priority)
    ), later AS (
        INSERT INTO {schema}.deferred (due_at, xid, job_id)
        SELECT a.run_after, pg_current_xact_id(), a.id FROM a WHERE NOT a.due
    )
    INSERT INTO {schema}.ready (slot, lane_id, xid, job_id)
    SELECT (SELECT (t.last_value % 4)::smallint FROM {schema}.ready_turn AS t),
           {schema}.lane_of(a.queue, a.priority), pg_current_xact_id(), a.id
      FROM a
     WHERE a.due;
    RETURN NULL;
END
$$;

CREATE FUNCTION {schema}.job_became_pending() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM {schema}.queue_entries(ARRAY[NEW.id], ARRAY[NEW.queue], ARRAY[NEW.priority], ARRAY[NEW.run_after]);
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_added AFTER INSERT ON {schema}.jobs
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.jobs_added();
CREATE TRIGGER jobs_pending AFTER UPDATE ON {schema}.jobs
    FOR EACH ROW
    WHEN (NEW.state = 'pending' AND (OLD.state <> 'pending' OR OLD.run_after IS DISTINCT FROM NEW.run_after
                                     OR OLD.queue <> NEW.queue OR OLD.priority <> NEW.priority))
    EXECUTE FUNCTION {schema}.job_became_pending();

-- Promote deferred jobs that came due into ready: one claimer at a time (the
-- others go on), under lane 0's cursor, whose `at` is the due time promoted up
-- to and whose `lo` the snapshot of that promotion. Each round takes the rows
-- due since `at` that its snapshot sees, and the rows due before `at` whose
-- transaction the last snapshot did not see (committed late).
CREATE FUNCTION {schema}.promote_due_jobs()
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    c record;
    v_now timestamptz := clock_timestamp();
    v_snap pg_snapshot;
    v_ids bigint[];
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext('{schema}.lanes'), 0) THEN
        RETURN 0;
    END IF;
    SELECT cu.lo, cu.at INTO c FROM {schema}.cursors AS cu WHERE cu.lane_id = 0 ORDER BY cu.step DESC LIMIT 1;
    v_snap := pg_current_snapshot();
    v_ids := ARRAY(
        SELECT d.job_id FROM {schema}.deferred AS d
         WHERE d.due_at > c.at AND d.due_at <= v_now AND pg_visible_in_snapshot(d.xid, v_snap)
        UNION
        SELECT d.job_id FROM {schema}.deferred AS d
         WHERE d.xid >= pg_snapshot_xmax(c.lo) AND d.due_at <= c.at AND pg_visible_in_snapshot(d.xid, v_snap)
        UNION
        SELECT d.job_id FROM pg_snapshot_xip(c.lo) AS x(xid)
          JOIN {schema}.deferred AS d ON d.xid = x.xid
         WHERE d.due_at <= c.at AND pg_visible_in_snapshot(x.xid, v_snap));
    IF cardinality(v_ids) > 0 THEN
        PERFORM {schema}.requeue_jobs(v_ids);
    END IF;
    IF cardinality(v_ids) > 0 OR c.at < v_now - interval '1 second' THEN
        PERFORM pg_current_xact_id();  -- before the slot is read (rotate_ready)
        INSERT INTO {schema}.cursors (slot, lane_id, step, lo, hi, last_xid, last_job, exhausted, at)
        SELECT (t.last_value % 4)::smallint, 0, nextval('{schema}.cursor_step'), v_snap, v_snap, '0', 0, true, v_now
          FROM {schema}.ready_turn AS t;
    END IF;
    RETURN cardinality(v_ids);
END
$$;

-- Claim up to p_limit ready jobs of p_queues for p_worker, leased for
-- p_lease_seconds. One statement reads every lane of the queues this claim
-- can lock (the others are busy with another claim and passed over): each
-- lane's latest cursor row, its range (a lane whose range is used up opens the
-- next one, whose hi is the statement's own snapshot, so the scan sees exactly
-- what hi sees), and up to p_limit entries after its position. The first
-- p_limit of them by priority, then commit order, are taken, and each lane
-- that moved gets a new cursor row. The jobs taken are marked running by
-- primary key while still pending, due and in one of p_queues; a row another
-- transaction holds is skipped and appended again. When a lane was busy, or
-- deferred jobs were promoted (a later claim takes them), and fewer jobs than
-- asked were found, a last row of NULLs says so: the worker claims again at
-- once.
CREATE OR REPLACE FUNCTION {schema}.claim_jobs(p_queues text[], p_limit integer, p_worker text,
                                               p_lease_seconds double precision)
RETURNS TABLE (id bigint, queue text, kind text, payload text, attempts integer, max_attempts integer,
               priority smallint, created_at timestamptz, replay_of bigint, headers text)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_space int := hashtext('{schema}.lanes');
    v_need int := p_limit;
    v_busy boolean;
    v_more boolean;
    v_again bigint[];
    v_take bigint[];
    v_n int;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'claim_jobs runs in READ COMMITTED transactions only, not %',
            current_setting('transaction_isolation') USING ERRCODE = '0A000';
    END IF;
    IF p_limit < 1 THEN
        RETURN;
    END IF;
    -- jobs it promotes carry this transaction's xid, so a later claim takes them: say so (below)
    v_busy := {schema}.promote_due_jobs() > 0;
    LOOP
        WITH tried AS MATERIALIZED (
            SELECT l.lane_id, l.priority, pg_try_advisory_xact_lock(v_space, l.lane_id) AS got
              FROM (SELECT DISTINCT l.lane_id, l.priority FROM {schema}.lanes AS l
                     WHERE l.queue = ANY(p_queues)
                       AND NOT EXISTS (SELECT 1 FROM {schema}.queue_pauses AS p
                                        WHERE p.queue = l.queue AND p.until > now())) AS l
        ), ranges AS MATERIALIZED (
            SELECT t.lane_id, t.priority,
                   CASE WHEN c.exhausted THEN c.hi ELSE c.lo END AS lo,
                   CASE WHEN c.exhausted THEN pg_current_snapshot() ELSE c.hi END AS hi,
                   CASE WHEN c.exhausted THEN '0'::xid8 ELSE c.last_xid END AS last_xid,
                   CASE WHEN c.exhausted THEN 0 ELSE c.last_job END AS last_job,
                   c.exhausted AS was_exhausted, c.at
              FROM tried AS t
              LEFT JOIN LATERAL (
                    SELECT cu.lo, cu.hi, cu.last_xid, cu.last_job, cu.exhausted, cu.at
                      FROM {schema}.cursors AS cu WHERE cu.lane_id = t.lane_id
                     ORDER BY cu.step DESC LIMIT 1) AS c0 ON true
             CROSS JOIN LATERAL (  -- a lane with no cursor yet: its first range holds all its hi sees
                    SELECT coalesce(c0.lo, '1:1:') AS lo, coalesce(c0.hi, '1:1:') AS hi,
                           coalesce(c0.last_xid, '0') AS last_xid, coalesce(c0.last_job, 0) AS last_job,
                           coalesce(c0.exhausted, true) AS exhausted, coalesce(c0.at, '-infinity') AS at) AS c
             WHERE t.got
        ), found AS MATERIALIZED (
            SELECT g.lane_id, g.priority, e.xid, e.job_id
              FROM ranges AS g
             CROSS JOIN LATERAL (
                    SELECT e.xid, e.job_id FROM (
                        -- transactions running when lo was taken that hi sees committed
                        SELECT r.xid, r.job_id
                          FROM pg_snapshot_xip(g.lo) AS x(xid)
                         CROSS JOIN LATERAL (
                                SELECT r.xid, r.job_id FROM {schema}.ready AS r
                                 WHERE r.lane_id = g.lane_id AND r.xid = x.xid
                                   AND (r.xid, r.job_id) > (g.last_xid, g.last_job)
                                 ORDER BY r.job_id
                                 LIMIT v_need) AS r
                         WHERE x.xid >= g.last_xid AND pg_visible_in_snapshot(x.xid, g.hi)
                        UNION ALL
                        -- transactions from lo's xmax on that hi sees committed
                        (SELECT r.xid, r.job_id FROM {schema}.ready AS r
                          WHERE r.lane_id = g.lane_id
                            AND (r.xid, r.job_id) > (greatest(g.last_xid, pg_snapshot_xmax(g.lo)),
                                                     CASE WHEN g.last_xid < pg_snapshot_xmax(g.lo)
                                                          THEN -1 ELSE g.last_job END)
                            AND r.xid < pg_snapshot_xmax(g.hi)
                            AND pg_visible_in_snapshot(r.xid, g.hi)
                          ORDER BY r.xid, r.job_id
                          LIMIT v_need)
                    ) AS e
                    ORDER BY e.xid, e.job_id
                    LIMIT v_need) AS e
        ), taken AS MATERIALIZED (
            SELECT f.lane_id, f.xid, f.job_id FROM found AS f ORDER BY f.priority, f.xid, f.job_id LIMIT v_need
        ), moved AS (
            -- each lane's new position: its last entry taken; a range left empty is closed, and a
            -- fresh empty one is written once a second at most (until then the next claim opens from
            -- the same lo, which is as good)
            INSERT INTO {schema}.cursors (slot, lane_id, step, lo, hi, last_xid, last_job, exhausted)
            SELECT (SELECT (t.last_value % 4)::smallint FROM {schema}.ready_turn AS t), g.lane_id,
                   nextval('{schema}.cursor_step'), g.lo, g.hi,
                   coalesce(k.last_xid, g.last_xid), coalesce(k.last_job, g.last_job),
                   coalesce(k.n, 0) = coalesce(n.n, 0) AND coalesce(n.n, 0) < v_need
              FROM ranges AS g
              LEFT JOIN (SELECT f.lane_id, count(*) AS n FROM found AS f GROUP BY f.lane_id) AS n
                ON n.lane_id = g.lane_id
              LEFT JOIN (SELECT DISTINCT ON (t.lane_id) t.lane_id, t.xid AS last_xid, t.job_id AS last_job,
                                count(*) OVER (PARTITION BY t.lane_id) AS n
                           FROM taken AS t ORDER BY t.lane_id, t.xid DESC, t.job_id DESC) AS k
                ON k.lane_id = g.lane_id
             WHERE k.n > 0
                OR (n.n IS NULL AND (NOT g.was_exhausted OR g.at < now() - interval '1 second'))
        )
        SELECT ARRAY(SELECT t.job_id FROM taken AS t), v_busy OR EXISTS (SELECT 1 FROM tried AS t WHERE NOT t.got),
               -- a lane whose range ran out before the claim was full: the next round opens its next range
               EXISTS (SELECT 1 FROM ranges AS g
                        WHERE NOT g.was_exhausted
                          AND (SELECT count(*) FROM found AS f WHERE f.lane_id = g.lane_id) < v_need)
          INTO v_take, v_busy, v_more;
        IF cardinality(v_take) = 0 THEN
            EXIT WHEN NOT v_more;
            CONTINUE;
        END IF;
        RETURN QUERY
        WITH taken AS (
            -- "IS TRUE": a plain state = 'pending' would let the planner walk jobs_ready (partial on it)
            -- for these ids instead of the primary key
            SELECT j.id FROM {schema}.jobs AS j
             WHERE j.id = ANY(v_take) AND (j.state = 'pending') IS TRUE AND j.run_after <= clock_timestamp()
               AND j.queue = ANY(p_queues)
               FOR UPDATE SKIP LOCKED
        )
        UPDATE {schema}.jobs AS j
           SET state = 'running',
               attempts = j.attempts + 1,
               worker = p_worker,
               lease_until = now() + make_interval(secs => p_lease_seconds),
               started_at = now()
         WHERE j.id IN (SELECT id FROM taken)
        RETURNING j.id, j.queue, j.kind, j.payload::text, j.attempts, j.max_attempts,
                  j.priority, j.created_at, j.replay_of, j.headers::text;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_need := v_need - v_n;
        EXIT WHEN v_need <= 0;
        IF v_n = cardinality(v_take) THEN
            EXIT WHEN NOT v_more;
            CONTINUE;
        END IF;
        -- Entries that gave no job: stale ones (the job ran, was cancelled or deleted) are dropped; a
        -- job still pending (a row another transaction holds, or not due) is appended again, since its
        -- entry here is consumed.
        v_again := ARRAY(SELECT j.id FROM {schema}.jobs AS j
                          WHERE j.id = ANY(v_take) AND (j.state = 'pending') IS TRUE);
        PERFORM {schema}.requeue_jobs(v_again);
        -- go round while stale entries were dropped (each round moves past them, so this ends); a
        -- round that only gave back rows others hold stops here, or it would read them again
        EXIT WHEN cardinality(v_take) - v_n - cardinality(v_again) = 0;
    END LOOP;
    IF v_busy AND v_need > 0 THEN
        RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::integer, NULL::integer,
                            NULL::smallint, NULL::timestamptz, NULL::bigint, NULL::text;
    END IF;
END
$$;

-- Turn the ring and empty the slots left behind once nothing can still need
-- them. Returns what it did: 'turned', 'cleared <slot>', or why it waits.
CREATE FUNCTION {schema}.rotate_ready(p_every double precision)
RETURNS text[]
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '100ms'
AS $$
DECLARE
    v_turn bigint;
    t record;
    v_lane int;
    v_out text[] := '{}';
    v_last timestamptz;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext('{schema}.lanes'), -1) THEN
        RETURN ARRAY['busy'];
    END IF;
    SELECT last_value INTO v_turn FROM {schema}.ready_turn;
    FOR t IN SELECT * FROM {schema}.ready_turns WHERE cleared_at IS NULL ORDER BY turn LOOP
        IF pg_snapshot_xmin(pg_current_snapshot()) <= t.left_xid THEN
            v_out := v_out || format('slot %s waits for a transaction that wrote into it', t.left_slot);
            EXIT;
        END IF;
        SELECT l.lane_id INTO v_lane
          FROM (SELECT lane_id FROM {schema}.lanes UNION SELECT 0) AS l
         WHERE EXISTS (SELECT 1 FROM {schema}.ready AS r WHERE r.slot = t.left_slot AND r.lane_id = l.lane_id)
           AND NOT EXISTS (SELECT 1
                             FROM (SELECT cu.lo FROM {schema}.cursors AS cu WHERE cu.lane_id = l.lane_id
                                    ORDER BY cu.step DESC LIMIT 1) AS cu
                            WHERE pg_snapshot_xmin(cu.lo) > t.left_xid)
         LIMIT 1;
        IF FOUND THEN
            v_out := v_out || format('slot %s waits for lane %s to be claimed past it', t.left_slot, v_lane);
            EXIT;
        END IF;
        BEGIN
            -- each lane's latest cursor row, when it lies in the slot, is carried to the current one
            INSERT INTO {schema}.cursors (slot, lane_id, step, lo, hi, last_xid, last_job, exhausted, at)
            SELECT (v_turn % 4)::smallint, cu.lane_id, cu.step, cu.lo, cu.hi, cu.last_xid, cu.last_job,
                   cu.exhausted, cu.at
              FROM (SELECT lane_id FROM {schema}.lanes UNION SELECT 0) AS l
             CROSS JOIN LATERAL (SELECT * FROM {schema}.cursors AS cu WHERE cu.lane_id = l.lane_id
                                  ORDER BY cu.step DESC LIMIT 1) AS cu
             WHERE cu.slot = t.left_slot;
            EXECUTE format('TRUNCATE {schema}.%I, {schema}.%I', 'ready_' || t.left_slot, 'cursors_' || t.left_slot);
            UPDATE {schema}.ready_turns SET cleared_at = now() WHERE turn = t.turn;
            v_out := v_out || format('cleared slot %s', t.left_slot);
        EXCEPTION WHEN lock_not_available THEN
            v_out := v_out || format('slot %s is in use: left for the next round', t.left_slot);
            EXIT;
        END;
    END LOOP;
    SELECT max(left_at) INTO v_last FROM {schema}.ready_turns;
    IF (v_last IS NULL OR v_last < now() - make_interval(secs => p_every))
       AND NOT EXISTS (SELECT 1 FROM {schema}.ready_turns
                        WHERE cleared_at IS NULL AND left_slot = ((v_turn + 1) % 4)) THEN
        PERFORM nextval('{schema}.ready_turn');
        -- this transaction's xid, taken after the turn: every writer that read the old slot has a lower one
        INSERT INTO {schema}.ready_turns (turn, left_slot, left_xid)
        VALUES (v_turn, (v_turn % 4)::smallint, pg_current_xact_id());
        v_out := v_out || format('turned to slot %s', (v_turn + 1) % 4);
    END IF;
    RETURN v_out;
END
$$;

-- It runs as the owner (TRUNCATE): granted to the worker role only.
REVOKE EXECUTE ON FUNCTION {schema}.rotate_ready(double precision) FROM PUBLIC;

-- Lane 0 is the promotion's cursor: it starts now.
INSERT INTO {schema}.cursors (slot, lane_id, step, lo, hi, last_xid, last_job, exhausted, at)
VALUES (0, 0, nextval('{schema}.cursor_step'), pg_current_snapshot(), pg_current_snapshot(), '0', 0, true, now());

-- The pending jobs of an upgraded schema get their entries.
SELECT {schema}.queue_entries(coalesce(array_agg(j.id), '{}'), coalesce(array_agg(j.queue), '{}'),
                              coalesce(array_agg(j.priority), '{}'), coalesce(array_agg(j.run_after), '{}'))
  FROM {schema}.jobs AS j
 WHERE j.state = 'pending';
