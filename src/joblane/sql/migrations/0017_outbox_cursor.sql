-- joblane schema, version 17: the relay's claim reads pending messages from a
-- cursor, never past what it already handed out (docs/architecture.md, "Step 7
-- as built: the relay's claim").
--
-- Until now claim_outbox walked outbox_ready_unkeyed and outbox_key_unsent
-- from their start. While any session held an old snapshot, every message sent
-- since left a dead version on that walk, and each claim read them all. Now the
-- outbox gets what migration 13 gave jobs:
--
-- * Every time a message becomes claimable, one narrow row is appended: to
--   `outbox_entries` (a ring sharing the jobs ring's turn) when it is due, to
--   `outbox_deferred` when it is not. Triggers on outbox write them: a publish
--   (any INSERT), a retry's backoff, a row given back ('released'), a failed row
--   retried, and a row that unblocks its key's next unsent row (sent or deleted).
-- * A lane is one topic (outbox_lane_of); its cursor rows go in
--   `outbox_cursors`, a ring of its own, and its lock in a lock space of its
--   own, so a lane id that meets a job lane's shares nothing with it.
-- * claim_outbox reads each routed lane's latest cursor and the entries after
--   it in commit order (the ranges of claim_jobs), then the rows it took by
--   primary key. A row of an ordered route waits while an earlier row of its
--   (topic, key) is unsent: one lookup of that key in outbox_key_unsent. A row
--   found blocked by a row still unsent gets no entry (parked); the blocker's
--   'sent' or its deletion appends the key's next unsent row.
-- * A relay that died leaves leased rows whose entries are consumed:
--   requeue_lost_outbox (run by relays every half lease) appends the pending
--   rows whose lease expired, through outbox_leased.
-- * rotate_ready empties an outbox slot with the jobs slot of the same turn,
--   once every outbox lane's cursor is past it too.
--
-- Upgrade: every pending row gets its entry (or its deferred row) here.

-- A lane's id is a hash of its topic, so a producer writes its entries without
-- a lookup. As for `lanes`, no unique key: the first producers of a new topic
-- may each list it (harmless duplicates) instead of waiting for each other.
-- Two topics whose hashes meet share a lane: a relay routing one of them
-- passes over the other's rows and appends them again, so nothing is lost.
CREATE TABLE {schema}.outbox_lanes (
    lane_id integer NOT NULL,
    topic text NOT NULL
);
CREATE INDEX outbox_lanes_id ON {schema}.outbox_lanes (lane_id);

-- 0 is the promotion's lock key and cursor, -1 kept free as for job lanes.
CREATE FUNCTION {schema}.outbox_lane_of(p_topic text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN hashtext('outbox:' || p_topic) BETWEEN -1 AND 0 THEN 1
                ELSE hashtext('outbox:' || p_topic) END
$$;

CREATE TABLE {schema}.outbox_entries (
    slot smallint NOT NULL,
    lane_id integer NOT NULL,
    xid xid8 NOT NULL,
    outbox_id bigint NOT NULL
) PARTITION BY LIST (slot);
CREATE TABLE {schema}.outbox_entries_0 PARTITION OF {schema}.outbox_entries FOR VALUES IN (0) WITH (autovacuum_enabled = off);
CREATE TABLE {schema}.outbox_entries_1 PARTITION OF {schema}.outbox_entries FOR VALUES IN (1) WITH (autovacuum_enabled = off);
CREATE TABLE {schema}.outbox_entries_2 PARTITION OF {schema}.outbox_entries FOR VALUES IN (2) WITH (autovacuum_enabled = off);
CREATE TABLE {schema}.outbox_entries_3 PARTITION OF {schema}.outbox_entries FOR VALUES IN (3) WITH (autovacuum_enabled = off);
CREATE INDEX outbox_entries_lane ON {schema}.outbox_entries (lane_id, xid, outbox_id);

-- The relay's cursor rows (the columns of `cursors`, last_id for last_job).
CREATE TABLE {schema}.outbox_cursors (
    slot smallint NOT NULL,
    lane_id integer NOT NULL,
    step bigint NOT NULL,
    lo pg_snapshot NOT NULL,
    hi pg_snapshot NOT NULL,
    last_xid xid8 NOT NULL,
    last_id bigint NOT NULL,
    exhausted boolean NOT NULL,
    at timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (slot);
CREATE TABLE {schema}.outbox_cursors_0 PARTITION OF {schema}.outbox_cursors FOR VALUES IN (0) WITH (autovacuum_enabled = off);
CREATE TABLE {schema}.outbox_cursors_1 PARTITION OF {schema}.outbox_cursors FOR VALUES IN (1) WITH (autovacuum_enabled = off);
CREATE TABLE {schema}.outbox_cursors_2 PARTITION OF {schema}.outbox_cursors FOR VALUES IN (2) WITH (autovacuum_enabled = off);
CREATE TABLE {schema}.outbox_cursors_3 PARTITION OF {schema}.outbox_cursors FOR VALUES IN (3) WITH (autovacuum_enabled = off);
CREATE INDEX outbox_cursors_lane ON {schema}.outbox_cursors (lane_id, step);

-- Pending messages not due yet (a retry's backoff): promoted by the claims once due.
CREATE TABLE {schema}.outbox_deferred (
    due_at timestamptz NOT NULL,
    xid xid8 NOT NULL,
    outbox_id bigint NOT NULL
);
CREATE INDEX outbox_deferred_due ON {schema}.outbox_deferred (due_at);
CREATE INDEX outbox_deferred_xid ON {schema}.outbox_deferred (xid);

-- Pending rows a relay leased, by lease end: requeue_lost_outbox finds the
-- expired ones here. It is walked rarely (every half lease), not by the claim.
CREATE INDEX outbox_leased ON {schema}.outbox (lease_until) WHERE state = 'pending' AND lease_until IS NOT NULL;

-- Append the entries of messages that became claimable: outbox_entries when
-- due, outbox_deferred when not, and list a topic not listed yet. The slot is
-- read after this transaction has its xid (rotate_ready).
CREATE FUNCTION {schema}.outbox_entries_for(p_ids bigint[], p_topics text[], p_run_after timestamptz[])
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_xid xid8 := pg_current_xact_id();
    v_now timestamptz := clock_timestamp();
BEGIN
    WITH a AS MATERIALIZED (
        SELECT t.id, t.topic, t.run_after, t.run_after <= v_now AS due
          FROM unnest(p_ids, p_topics, p_run_after) AS t(id, topic, run_after)
    ), listed AS (
        INSERT INTO {schema}.outbox_lanes (lane_id, topic)
        SELECT {schema}.outbox_lane_of(t.topic), t.topic
          FROM (SELECT DISTINCT a.topic FROM a) AS t
         WHERE NOT EXISTS (SELECT 1 FROM {schema}.outbox_lanes AS l
                            WHERE l.lane_id = {schema}.outbox_lane_of(t.topic) AND l.topic = t.topic)
    ), later AS (
        INSERT INTO {schema}.outbox_deferred (due_at, xid, outbox_id)
        SELECT a.run_after, v_xid, a.id FROM a WHERE NOT a.due
    )
    INSERT INTO {schema}.outbox_entries (slot, lane_id, xid, outbox_id)
    SELECT (SELECT (t.last_value % 4)::smallint FROM {schema}.ready_turn AS t),
           {schema}.outbox_lane_of(a.topic), v_xid, a.id
      FROM a
     WHERE a.due;
END
$$;

-- The entries of rows already in the table, found by primary key: those still
-- pending and not leased to a relay (a lease that expired counts as none).
CREATE FUNCTION {schema}.outbox_requeue(p_ids bigint[])
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    v record;
BEGIN
    SELECT array_agg(o.id) AS ids, array_agg(o.topic) AS topics, array_agg(o.run_after) AS run_after
      INTO v
      FROM {schema}.outbox AS o
     WHERE o.id = ANY(p_ids) AND (o.state = 'pending') IS TRUE  -- by primary key, not outbox_ready
       AND (o.lease_until IS NULL OR o.lease_until < now());
    IF v.ids IS NOT NULL THEN
        PERFORM {schema}.outbox_entries_for(v.ids, v.topics, v.run_after);
    END IF;
    RETURN coalesce(cardinality(v.ids), 0);
END
$$;

-- A publish (any INSERT on outbox): one statement for all its rows.
CREATE FUNCTION {schema}.outbox_added() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v record;
BEGIN
    SELECT array_agg(n.id) AS ids, array_agg(n.topic) AS topics, array_agg(n.run_after) AS run_after
      INTO v
      FROM added AS n
     WHERE n.state = 'pending';
    IF v.ids IS NOT NULL THEN
        PERFORM {schema}.outbox_entries_for(v.ids, v.topics, v.run_after);
    END IF;
    RETURN NULL;
END
$$;

-- A row that became claimable again: pending from another state, its run_after
-- moved (a retry's backoff), or its lease cleared while pending (a 'released'
-- or 'retry' outcome).
CREATE FUNCTION {schema}.outbox_became_ready() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM {schema}.outbox_entries_for(ARRAY[NEW.id], ARRAY[NEW.topic], ARRAY[NEW.run_after]);
    RETURN NULL;
END
$$;

-- A row with a key left the unsent (sent, or deleted unsent): the key's next
-- unsent row, which an ordered route's claim may have parked behind it, gets an
-- entry when it is pending and not leased (a leased one is its relay's; a
-- failed one holds the key until retried). By key: outbox_key_unsent.
CREATE FUNCTION {schema}.outbox_unblocked() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v record;
BEGIN
    SELECT o.id, o.topic, o.run_after, o.state, o.lease_until INTO v
      FROM {schema}.outbox AS o
     WHERE (o.topic, o.key, o.id) > (OLD.topic, OLD.key, OLD.id)
       AND (o.topic, o.key, o.id) <= (OLD.topic, OLD.key, 9223372036854775807)
       AND o.key IS NOT NULL AND o.state <> 'sent'
     ORDER BY o.topic, o.key, o.id
     LIMIT 1;
    IF FOUND AND v.state = 'pending' AND (v.lease_until IS NULL OR v.lease_until < now()) THEN
        PERFORM {schema}.outbox_entries_for(ARRAY[v.id], ARRAY[v.topic], ARRAY[v.run_after]);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER outbox_added AFTER INSERT ON {schema}.outbox
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.outbox_added();
CREATE TRIGGER outbox_pending AFTER UPDATE ON {schema}.outbox
    FOR EACH ROW
    WHEN (NEW.state = 'pending' AND (OLD.state <> 'pending' OR OLD.run_after IS DISTINCT FROM NEW.run_after
                                     OR OLD.topic <> NEW.topic
                                     OR (OLD.lease_until IS NOT NULL AND NEW.lease_until IS NULL)))
    EXECUTE FUNCTION {schema}.outbox_became_ready();
CREATE TRIGGER outbox_sent AFTER UPDATE ON {schema}.outbox
    FOR EACH ROW
    WHEN (OLD.state <> 'sent' AND NEW.state = 'sent' AND NEW.key IS NOT NULL)
    EXECUTE FUNCTION {schema}.outbox_unblocked();
CREATE TRIGGER outbox_dropped AFTER DELETE ON {schema}.outbox
    FOR EACH ROW
    WHEN (OLD.state <> 'sent' AND OLD.key IS NOT NULL)
    EXECUTE FUNCTION {schema}.outbox_unblocked();

-- Promote deferred messages that came due, as promote_due_jobs does for jobs:
-- one relay at a time (the others go on), under lane 0 of outbox_cursors, whose
-- `at` is the due time promoted up to and whose `lo` that promotion's snapshot.
CREATE FUNCTION {schema}.promote_due_outbox()
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    c record;
    v_now timestamptz := clock_timestamp();
    v_snap pg_snapshot;
    v_ids bigint[];
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext('{schema}.outbox_lanes'), 0) THEN
        RETURN 0;
    END IF;
    SELECT cu.lo, cu.at INTO c FROM {schema}.outbox_cursors AS cu WHERE cu.lane_id = 0 ORDER BY cu.step DESC LIMIT 1;
    v_snap := pg_current_snapshot();
    v_ids := ARRAY(
        SELECT d.outbox_id FROM {schema}.outbox_deferred AS d
         WHERE d.due_at > c.at AND d.due_at <= v_now AND pg_visible_in_snapshot(d.xid, v_snap)
        UNION
        SELECT d.outbox_id FROM {schema}.outbox_deferred AS d
         WHERE d.xid >= pg_snapshot_xmax(c.lo) AND d.due_at <= c.at AND pg_visible_in_snapshot(d.xid, v_snap)
        UNION
        SELECT d.outbox_id FROM pg_snapshot_xip(c.lo) AS x(xid)
          JOIN {schema}.outbox_deferred AS d ON d.xid = x.xid
         WHERE d.due_at <= c.at AND pg_visible_in_snapshot(x.xid, v_snap));
    IF cardinality(v_ids) > 0 THEN
        PERFORM {schema}.outbox_requeue(v_ids);
    END IF;
    IF cardinality(v_ids) > 0 OR c.at < v_now - interval '1 second' THEN
        PERFORM pg_current_xact_id();  -- before the slot is read (rotate_ready)
        INSERT INTO {schema}.outbox_cursors (slot, lane_id, step, lo, hi, last_xid, last_id, exhausted, at)
        SELECT (t.last_value % 4)::smallint, 0, nextval('{schema}.cursor_step'), v_snap, v_snap, '0', 0, true, v_now
          FROM {schema}.ready_turn AS t;
    END IF;
    RETURN cardinality(v_ids);
END
$$;

-- Lease up to p_limit deliverable messages whose topic starts with a route
-- prefix (p_ordered: is that route ordered) to relay p_relay for
-- p_lease_seconds.
--
-- Each round reads every routed lane this claim can lock (a lane busy with
-- another relay's claim is passed over): its latest cursor row, its range and
-- the entries after its position, as claim_jobs does; the first p_limit in
-- commit order are taken. Their rows are locked by primary key while still
-- pending, due, not leased (or the lease expired) and routed (SKIP LOCKED: a
-- row another transaction holds is appended again). A row of an ordered route
-- with a key goes only when no earlier row of its (topic, key) outside this
-- claim is unsent, as this statement's snapshot has them; the first such row
-- of a key is then locked FOR SHARE SKIP LOCKED, which reads its latest
-- committed version: still unsent, it is a true blocker and the rows behind it
-- are parked (no entry: the blocker's sent or deletion appends the key's next
-- row, and the lock held here makes that wait for this claim's commit); locked
-- by another transaction now, sent or gone meanwhile, the rows behind it are
-- appended again and decided by a later claim.
--
-- The result ends with a row whose id is NULL; its attempts column is 1 when
-- fewer rows than asked were found while a lane was busy or deferred rows were
-- promoted (a later claim takes them): the relay claims again at once.
CREATE FUNCTION {schema}.claim_outbox(p_limit integer, p_prefixes text[], p_ordered boolean[], p_relay text,
                                      p_lease_seconds double precision)
RETURNS TABLE (id bigint, topic text, key text, idempotency_key text, payload text, headers text,
               attempts integer, max_attempts integer, created_at timestamptz)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_space int := hashtext('{schema}.outbox_lanes');
    v_need int := p_limit;
    v_busy boolean := false;
    v_more boolean;
    v_take bigint[];
    v_locked bigint[];
    v_go bigint[];
    v_run bigint[];
    v_blocked bigint[];
    v_blockers bigint[];
    v_true bigint[];
    v_parked bigint[];
    v_again bigint[];
    v_n int;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'claim_outbox runs in READ COMMITTED transactions only, not %',
            current_setting('transaction_isolation') USING ERRCODE = '0A000';
    END IF;
    IF p_limit >= 1 THEN
        -- rows it promotes carry this transaction's xid, so a later claim takes them: say so (below)
        v_busy := {schema}.promote_due_outbox() > 0;
    END IF;
    WHILE v_need > 0 LOOP
        WITH tried AS MATERIALIZED (
            SELECT l.lane_id, pg_try_advisory_xact_lock(v_space, l.lane_id) AS got
              FROM (SELECT DISTINCT l.lane_id FROM {schema}.outbox_lanes AS l
                     WHERE EXISTS (SELECT 1 FROM unnest(p_prefixes) AS r(prefix)
                                    WHERE starts_with(l.topic, r.prefix))) AS l
        ), ranges AS MATERIALIZED (
            SELECT t.lane_id,
                   CASE WHEN c.exhausted THEN c.hi ELSE c.lo END AS lo,
                   CASE WHEN c.exhausted THEN pg_current_snapshot() ELSE c.hi END AS hi,
                   CASE WHEN c.exhausted THEN '0'::xid8 ELSE c.last_xid END AS last_xid,
                   CASE WHEN c.exhausted THEN 0 ELSE c.last_id END AS last_id,
                   c.exhausted AS was_exhausted, c.at
              FROM tried AS t
              LEFT JOIN LATERAL (
                    SELECT cu.lo, cu.hi, cu.last_xid, cu.last_id, cu.exhausted, cu.at
                      FROM {schema}.outbox_cursors AS cu WHERE cu.lane_id = t.lane_id
                     ORDER BY cu.step DESC LIMIT 1) AS c0 ON true
             CROSS JOIN LATERAL (  -- a lane with no cursor yet: its first range holds all its hi sees
                    SELECT coalesce(c0.lo, '1:1:') AS lo, coalesce(c0.hi, '1:1:') AS hi,
                           coalesce(c0.last_xid, '0') AS last_xid, coalesce(c0.last_id, 0) AS last_id,
                           coalesce(c0.exhausted, true) AS exhausted, coalesce(c0.at, '-infinity') AS at) AS c
             WHERE t.got
        ), found AS MATERIALIZED (
            SELECT g.lane_id, e.xid, e.outbox_id
              FROM ranges AS g
             CROSS JOIN LATERAL (
                    SELECT e.xid, e.outbox_id FROM (
                        -- transactions running when lo was taken that hi sees committed
                        SELECT r.xid, r.outbox_id
                          FROM pg_snapshot_xip(g.lo) AS x(xid)
                         CROSS JOIN LATERAL (
                                SELECT r.xid, r.outbox_id FROM {schema}.outbox_entries AS r
                                 WHERE r.lane_id = g.lane_id AND r.xid = x.xid
                                   AND (r.xid, r.outbox_id) > (g.last_xid, g.last_id)
                                 ORDER BY r.outbox_id
                                 LIMIT v_need) AS r
                         WHERE x.xid >= g.last_xid AND pg_visible_in_snapshot(x.xid, g.hi)
                        UNION ALL
                        -- transactions from lo's xmax on that hi sees committed
                        (SELECT r.xid, r.outbox_id FROM {schema}.outbox_entries AS r
                          WHERE r.lane_id = g.lane_id
                            AND (r.xid, r.outbox_id) > (greatest(g.last_xid, pg_snapshot_xmax(g.lo)),
                                                        CASE WHEN g.last_xid < pg_snapshot_xmax(g.lo)
                                                             THEN -1 ELSE g.last_id END)
                            AND r.xid < pg_snapshot_xmax(g.hi)
                            AND pg_visible_in_snapshot(r.xid, g.hi)
                          ORDER BY r.xid, r.outbox_id
                          LIMIT v_need)
                    ) AS e
                    ORDER BY e.xid, e.outbox_id
                    LIMIT v_need) AS e
        ), taken AS MATERIALIZED (
            SELECT f.lane_id, f.xid, f.outbox_id FROM found AS f ORDER BY f.xid, f.outbox_id LIMIT v_need
        ), moved AS (
            -- each lane's new position, as in claim_jobs
            INSERT INTO {schema}.outbox_cursors (slot, lane_id, step, lo, hi, last_xid, last_id, exhausted)
            SELECT (SELECT (t.last_value % 4)::smallint FROM {schema}.ready_turn AS t), g.lane_id,
                   nextval('{schema}.cursor_step'), g.lo, g.hi,
                   coalesce(k.last_xid, g.last_xid), coalesce(k.last_id, g.last_id),
                   coalesce(k.n, 0) = coalesce(n.n, 0) AND coalesce(n.n, 0) < v_need
              FROM ranges AS g
              LEFT JOIN (SELECT f.lane_id, count(*) AS n FROM found AS f GROUP BY f.lane_id) AS n
                ON n.lane_id = g.lane_id
              LEFT JOIN (SELECT DISTINCT ON (t.lane_id) t.lane_id, t.xid AS last_xid, t.outbox_id AS last_id,
                                count(*) OVER (PARTITION BY t.lane_id) AS n
                           FROM taken AS t ORDER BY t.lane_id, t.xid DESC, t.outbox_id DESC) AS k
                ON k.lane_id = g.lane_id
             WHERE k.n > 0
                OR (n.n IS NULL AND (NOT g.was_exhausted OR g.at < now() - interval '1 second'))
        )
        SELECT ARRAY(SELECT DISTINCT t.outbox_id FROM taken AS t),
               v_busy OR EXISTS (SELECT 1 FROM tried AS t WHERE NOT t.got),
               -- a lane whose range ran out before the claim was full: the next round opens its next range
               EXISTS (SELECT 1 FROM ranges AS g
                        WHERE NOT g.was_exhausted
                          AND (SELECT count(*) FROM found AS f WHERE f.lane_id = g.lane_id) < v_need)
          INTO v_take, v_busy, v_more;
        IF cardinality(v_take) = 0 THEN
            EXIT WHEN NOT v_more;
            CONTINUE;
        END IF;
        -- the rows still deliverable and routed, locked; then of an ordered route's keys, the rows behind
        -- an earlier unsent row of their key that this claim did not lock ("IS TRUE": a plain state test
        -- would let the planner walk a partial index over every pending row instead of the primary key)
        WITH locked AS MATERIALIZED (
            SELECT o.id, o.topic, o.key
              FROM {schema}.outbox AS o
             WHERE o.id = ANY(v_take) AND (o.state = 'pending') IS TRUE AND o.run_after <= clock_timestamp()
               AND (o.lease_until IS NULL OR o.lease_until < now())
               AND EXISTS (SELECT 1 FROM unnest(p_prefixes) AS r(prefix) WHERE starts_with(o.topic, r.prefix))
               FOR UPDATE OF o SKIP LOCKED
        ), keys AS MATERIALIZED (
            SELECT l.topic, l.key, max(l.id) AS last
              FROM locked AS l
             CROSS JOIN LATERAL (SELECT r.ordered FROM unnest(p_prefixes, p_ordered) AS r(prefix, ordered)
                                  WHERE starts_with(l.topic, r.prefix)
                                  ORDER BY length(r.prefix) DESC LIMIT 1) AS m
             WHERE m.ordered AND l.key IS NOT NULL
             GROUP BY l.topic, l.key
        ), first AS MATERIALIZED (
            -- by key through outbox_key_unsent: the key's first unsent row not locked here. The bounds are
            -- row comparisons, not topic = and key =, which would let the planner prefer walking the
            -- primary key in id order (it expects a match soon) over this key's own entries
            SELECT k.topic, k.key, b.id AS blocker
              FROM keys AS k
             CROSS JOIN LATERAL (
                    SELECT o.id FROM {schema}.outbox AS o
                     WHERE (o.topic, o.key, o.id) > (k.topic, k.key, 0) AND (o.topic, o.key, o.id) < (k.topic, k.key, k.last)
                       AND o.key IS NOT NULL AND o.state <> 'sent'
                       AND NOT o.id = ANY(ARRAY(SELECT l.id FROM locked AS l))
                     ORDER BY o.topic, o.key, o.id
                     LIMIT 1) AS b
        )
        SELECT ARRAY(SELECT l.id FROM locked AS l),
               ARRAY(SELECT l.id FROM locked AS l
                      WHERE NOT EXISTS (SELECT 1 FROM first AS f
                                         WHERE f.topic = l.topic AND f.key = l.key AND f.blocker < l.id)),
               ARRAY(SELECT l.id FROM locked AS l JOIN first AS f ON f.topic = l.topic AND f.key = l.key
                      WHERE f.blocker < l.id),
               ARRAY(SELECT f.blocker FROM first AS f)
          INTO v_locked, v_go, v_blocked, v_blockers;
        v_parked := '{}';
        IF cardinality(v_blocked) > 0 THEN
            -- the blockers' latest committed versions: those still unsent that no one holds are true blockers
            v_true := ARRAY(SELECT o.id FROM {schema}.outbox AS o
                             WHERE o.id = ANY(v_blockers) AND (o.state <> 'sent') IS TRUE
                               FOR SHARE OF o SKIP LOCKED);
            v_parked := ARRAY(
                SELECT o.id FROM {schema}.outbox AS o
                 WHERE o.id = ANY(v_blocked)
                   AND EXISTS (SELECT 1 FROM {schema}.outbox AS b
                                WHERE b.id = ANY(v_true) AND b.topic = o.topic AND b.key = o.key AND b.id < o.id));
        END IF;
        IF cardinality(v_go) < v_need THEN
            -- a key's run: after an ordered key's last row taken, its next unsent rows while they are
            -- deliverable, locked here (a row skipped ends the run), up to the room left. Their entries, if
            -- any, are dropped later; rows parked behind a blocker that is now sent have none.
            v_run := ARRAY(
                WITH k AS (
                    SELECT o.topic, o.key, max(o.id) AS last
                      FROM {schema}.outbox AS o
                     CROSS JOIN LATERAL (SELECT r.ordered FROM unnest(p_prefixes, p_ordered) AS r(prefix, ordered)
                                          WHERE starts_with(o.topic, r.prefix)
                                          ORDER BY length(r.prefix) DESC LIMIT 1) AS m
                     WHERE o.id = ANY(v_go) AND o.key IS NOT NULL AND m.ordered
                     GROUP BY o.topic, o.key
                ), r AS (
                    SELECT k.topic, k.key, u.id, u.pos, u.ok
                      FROM k
                     CROSS JOIN LATERAL (
                            SELECT o.id, row_number() OVER (ORDER BY o.id) AS pos,
                                   (o.state = 'pending' AND o.run_after <= clock_timestamp()
                                    AND (o.lease_until IS NULL OR o.lease_until < now())) AS ok
                              FROM {schema}.outbox AS o
                             WHERE (o.topic, o.key, o.id) > (k.topic, k.key, k.last)
                               AND (o.topic, o.key, o.id) <= (k.topic, k.key, 9223372036854775807)
                               AND o.key IS NOT NULL AND o.state <> 'sent'
                             ORDER BY o.topic, o.key, o.id
                             LIMIT v_need - cardinality(v_go)) AS u
                )
                SELECT r.id FROM r
                 WHERE r.pos < coalesce((SELECT min(b.pos) FROM r AS b
                                          WHERE b.topic = r.topic AND b.key = r.key AND NOT b.ok), 2147483647)
                 ORDER BY r.pos, r.id
                 LIMIT v_need - cardinality(v_go));
            IF cardinality(v_run) > 0 THEN
                v_go := v_go || ARRAY(
                    WITH run AS (
                        SELECT x.id, x.n FROM unnest(v_run) WITH ORDINALITY AS x(id, n)
                    ), locked AS MATERIALIZED (
                        SELECT o.id, o.topic, o.key
                          FROM {schema}.outbox AS o
                         WHERE o.id = ANY(v_run) AND (o.state = 'pending') IS TRUE
                           AND o.run_after <= clock_timestamp() AND (o.lease_until IS NULL OR o.lease_until < now())
                           FOR UPDATE OF o SKIP LOCKED
                    ), cut AS (
                        -- per key, the first row of the run not locked
                        SELECT o.topic, o.key, min(o.id) AS at
                          FROM {schema}.outbox AS o
                         WHERE o.id = ANY(v_run) AND NOT o.id = ANY(ARRAY(SELECT l.id FROM locked AS l))
                         GROUP BY o.topic, o.key
                    )
                    SELECT l.id FROM locked AS l
                     WHERE NOT EXISTS (SELECT 1 FROM cut AS c WHERE c.topic = l.topic AND c.key = l.key AND c.at < l.id));
            END IF;
        END IF;
        RETURN QUERY
        UPDATE {schema}.outbox AS o
           SET attempts = o.attempts + 1,
               lease_until = now() + make_interval(secs => p_lease_seconds),
               relay = p_relay
         WHERE o.id = ANY(v_go)
        RETURNING o.id, o.topic, o.key, coalesce(o.idempotency_key, 'outbox:' || o.id),
                  o.payload::text, o.headers::text, o.attempts, o.max_attempts, o.created_at;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_need := v_need - v_n;
        v_n := cardinality(ARRAY(SELECT t FROM unnest(v_take) AS t WHERE t = ANY(v_go)));  -- of the entries taken
        IF v_n = cardinality(v_take) THEN
            EXIT WHEN NOT v_more;
            CONTINUE;
        END IF;
        -- Entries that gave no row: stale ones (sent, failed, deleted, leased to a live relay, not due:
        -- its deferred row brings it back) and parked ones are dropped; a row still pending and not
        -- leased that was not taken (another transaction holds it, its topic is not routed here, its
        -- blocker could not be decided) is appended again, since its entry here is consumed.
        v_again := ARRAY(SELECT t FROM unnest(v_take) AS t
                          WHERE NOT t = ANY(v_go) AND NOT t = ANY(v_parked));
        -- go round while entries were dropped (each round moves past them, so this ends); a round that
        -- only gave back rows others hold stops here, or it would read them again
        EXIT WHEN cardinality(v_take) - v_n - {schema}.outbox_requeue(v_again) = 0;
    END LOOP;
    RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::text, NULL::text,
                        (v_busy AND v_need > 0)::int, NULL::integer, NULL::timestamptz;
END
$$;

-- Pending rows whose lease expired (their relay died, or gave up the batch):
-- their entries were consumed by the claim that leased them, so they get new
-- ones. Walks outbox_leased from its start: run every half lease, not per claim.
CREATE FUNCTION {schema}.requeue_lost_outbox()
RETURNS integer
LANGUAGE plpgsql
AS $$
BEGIN
    RETURN {schema}.outbox_requeue(ARRAY(
        SELECT o.id FROM {schema}.outbox AS o
         WHERE o.state = 'pending' AND o.lease_until IS NOT NULL AND o.lease_until < now()));
END
$$;

-- The ring's rotation, now also over outbox_entries and outbox_cursors: a slot
-- is emptied once every job lane's and every outbox lane's cursor is past it.
CREATE OR REPLACE FUNCTION {schema}.rotate_ready(p_every double precision)
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
    v_topic text;
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
        SELECT l.lane_id, l.topic INTO v_lane, v_topic
          FROM (SELECT DISTINCT ON (lane_id) lane_id, topic FROM {schema}.outbox_lanes ORDER BY lane_id, topic) AS l
         WHERE EXISTS (SELECT 1 FROM {schema}.outbox_entries AS r
                        WHERE r.slot = t.left_slot AND r.lane_id = l.lane_id)
           AND NOT EXISTS (SELECT 1
                             FROM (SELECT cu.lo FROM {schema}.outbox_cursors AS cu WHERE cu.lane_id = l.lane_id
                                    ORDER BY cu.step DESC LIMIT 1) AS cu
                            WHERE pg_snapshot_xmin(cu.lo) > t.left_xid)
         LIMIT 1;
        IF FOUND THEN
            v_out := v_out || format('slot %s waits for outbox lane %s (topic %L) to be relayed past it',
                                     t.left_slot, v_lane, v_topic);
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
            INSERT INTO {schema}.outbox_cursors (slot, lane_id, step, lo, hi, last_xid, last_id, exhausted, at)
            SELECT (v_turn % 4)::smallint, cu.lane_id, cu.step, cu.lo, cu.hi, cu.last_xid, cu.last_id,
                   cu.exhausted, cu.at
              FROM (SELECT lane_id FROM {schema}.outbox_lanes UNION SELECT 0) AS l
             CROSS JOIN LATERAL (SELECT * FROM {schema}.outbox_cursors AS cu WHERE cu.lane_id = l.lane_id
                                  ORDER BY cu.step DESC LIMIT 1) AS cu
             WHERE cu.slot = t.left_slot;
            EXECUTE format('TRUNCATE {schema}.%I, {schema}.%I, {schema}.%I, {schema}.%I',
                           'ready_' || t.left_slot, 'cursors_' || t.left_slot,
                           'outbox_entries_' || t.left_slot, 'outbox_cursors_' || t.left_slot);
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

-- Lane 0 of outbox_cursors is the promotion's cursor: it starts now.
INSERT INTO {schema}.outbox_cursors (slot, lane_id, step, lo, hi, last_xid, last_id, exhausted, at)
SELECT (t.last_value % 4)::smallint, 0, nextval('{schema}.cursor_step'), pg_current_snapshot(), pg_current_snapshot(),
       '0', 0, true, now()
  FROM {schema}.ready_turn AS t;

-- The pending rows of an upgraded schema get their entries (due) or deferred rows (not due).
SELECT {schema}.outbox_entries_for(coalesce(array_agg(o.id ORDER BY o.id), '{}'),
                                   coalesce(array_agg(o.topic ORDER BY o.id), '{}'),
                                   coalesce(array_agg(o.run_after ORDER BY o.id), '{}'))
  FROM {schema}.outbox AS o
 WHERE o.state = 'pending';

-- prune_deferred (migration 15) takes the promoted rows of outbox_deferred
-- away too, by the same rule under the outbox promotion's cursor (lane 0 of
-- outbox_cursors): due by its latest round, transaction ended before that
-- round's snapshot. Returns the rows deleted from both tables.
CREATE OR REPLACE FUNCTION {schema}.prune_deferred(p_limit integer)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c record;
    v_n integer := 0;
    v_more integer;
BEGIN
    SELECT cu.lo, cu.at INTO c
      FROM {schema}.cursors AS cu WHERE cu.lane_id = 0 ORDER BY cu.step DESC LIMIT 1;
    IF FOUND THEN
        DELETE FROM {schema}.deferred AS d
         WHERE d.ctid = ANY(ARRAY(SELECT x.ctid FROM {schema}.deferred AS x
                                   WHERE x.due_at <= c.at AND x.xid < pg_snapshot_xmin(c.lo)
                                   ORDER BY x.due_at
                                   LIMIT p_limit));
        GET DIAGNOSTICS v_n = ROW_COUNT;
    END IF;
    SELECT cu.lo, cu.at INTO c
      FROM {schema}.outbox_cursors AS cu WHERE cu.lane_id = 0 ORDER BY cu.step DESC LIMIT 1;
    IF FOUND THEN
        DELETE FROM {schema}.outbox_deferred AS d
         WHERE d.ctid = ANY(ARRAY(SELECT x.ctid FROM {schema}.outbox_deferred AS x
                                   WHERE x.due_at <= c.at AND x.xid < pg_snapshot_xmin(c.lo)
                                   ORDER BY x.due_at
                                   LIMIT p_limit));
        GET DIAGNOSTICS v_more = ROW_COUNT;
        v_n := v_n + v_more;
    END IF;
    RETURN v_n;
END
$$;
