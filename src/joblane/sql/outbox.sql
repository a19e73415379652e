-- Named queries of the outbox (publish, relay, admin) and the inbox.
-- Each block starts with "-- name: <name>" and a one-line description.
-- {schema} is the validated, quoted schema name; every value is a $n parameter.

-- name: publish
-- Insert one outbox row in the caller's transaction (key defaults to outbox:<id>); notify relays in the same round trip when $6.
--
-- The id is drawn first so that the default idempotency key can be stored
-- with the row: what the table shows is exactly what the destination gets.
-- The notification payload is empty, so PostgreSQL folds every publish of a
-- transaction into one notification at commit.
WITH new AS (
    SELECT nextval('{schema}.outbox_id_seq'::regclass) AS id
), inserted AS (
    INSERT INTO {schema}.outbox (id, topic, key, idempotency_key, payload, headers)
    OVERRIDING SYSTEM VALUE
    SELECT new.id, $1, $2, coalesce($3, 'outbox:' || new.id), $4::text::jsonb, $5::text::jsonb
      FROM new
    RETURNING id
)
SELECT id, CASE WHEN $6::bool THEN pg_notify($7, '')::text END AS notified
  FROM inserted;

-- name: inbox_record
-- Record key $1 as received, in the receiver's transaction; returns a row only the first time.
--
-- ON CONFLICT DO NOTHING never raises, so a repeat leaves the caller's
-- transaction usable. A concurrent insert of the same key waits for the other
-- transaction: after its commit this one returns nothing, after its rollback
-- this one inserts.
INSERT INTO {schema}.inbox (key) VALUES ($1)
ON CONFLICT (key) DO NOTHING
RETURNING key;

-- name: claim_outbox
-- Lease up to $1 deliverable rows whose topic starts with a route prefix $2 (ordered when $3) to relay $4 for $5 seconds, keys from after ($6, $7).
--
-- A row of an ordered route with a key waits while an earlier row of the
-- same (topic, key) is unsent. Rows without a key and rows with one are
-- found apart, each at a cost that follows the batch, not the backlog:
-- * "unkeyed": rows without a key, oldest first (run_after, id), through
--   outbox_ready_unkeyed;
-- * "walk": keys with unsent rows, one after another in (topic, key) order
--   from after ($6, $7), one probe of outbox_key_unsent per key, until the
--   keys seen can fill the batch or $1 keys were seen. An ordered key gives
--   the run of ready rows that starts at its first unsent row (none when
--   that one is not ready: failed, backing off, leased); a key of another
--   route gives its ready rows; either gives at most a hundredth of the
--   batch (at least a row), and when the walk meets the last key with room
--   left, the keys that had more share it ("share"). The last row of the
--   result (id NULL) names the last key seen: the relay passes it to its
--   next claim, and a walk that finds no key after it starts again from the
--   first, so every key gets its turn however many wait before it.
--   ($6, $7) = ('', '') starts from the first key: publish refuses an empty
--   topic or key.
-- * "keyed" locks the rows the keys give (SKIP LOCKED, so relays side by
--   side take different rows); an ordered key keeps its locked rows up to
--   the first that is not its next unsent row as this statement's snapshot
--   has them (that one is locked by another relay now, or was leased since).
-- "picked" takes $1 of both in the turn of each key's first row, a key's
-- rows one after another, so a cut keeps the start of a key's run (rows
-- locked but not picked are released when this statement commits). The
-- longest matching prefix decides whether a topic is ordered, as it decides
-- the sink.
WITH RECURSIVE route AS (
    SELECT r.prefix, r.ordered
      FROM unnest($2::text[], $3::bool[]) AS r(prefix, ordered)
), unkeyed AS (
    SELECT o.id, o.run_after
      FROM {schema}.outbox AS o
     CROSS JOIN LATERAL (SELECT 1 FROM route WHERE starts_with(o.topic, route.prefix) LIMIT 1) AS m
     WHERE o.state = 'pending' AND o.key IS NULL
       AND o.run_after <= now()
       AND (o.lease_until IS NULL OR o.lease_until < now())
     ORDER BY o.run_after, o.id
     LIMIT $1
       FOR UPDATE OF o SKIP LOCKED
), walk AS (
    -- row 0 is where the last claim stopped; each next row is the next key with unsent rows.
    -- "most" is what one key gives at most: a hundredth of the batch, at least a row
    SELECT 0 AS n, $6::text AS topic, $7::text AS key, NULL::bool AS ordered, 0::bigint AS gives, 0::bigint AS taken,
           greatest($1 / 100, 1)::bigint AS most
    UNION ALL
    SELECT w.n + 1, k.topic, k.key, g.ordered, coalesce(g.gives, 0), w.taken + coalesce(g.gives, 0), w.most
      FROM walk AS w
     CROSS JOIN LATERAL (
            SELECT *
              FROM ((SELECT o.topic, o.key
                       FROM {schema}.outbox AS o
                      WHERE o.state <> 'sent' AND o.key IS NOT NULL AND (o.topic, o.key) > (w.topic, w.key)
                      ORDER BY o.topic, o.key
                      LIMIT 1)
                    UNION ALL
                    (SELECT o.topic, o.key  -- no key after the last claim's: from the first
                       FROM {schema}.outbox AS o
                      WHERE o.state <> 'sent' AND o.key IS NOT NULL AND w.n = 0
                      ORDER BY o.topic, o.key
                      LIMIT 1)) AS next
             LIMIT 1
         ) AS k
      LEFT JOIN LATERAL (
            SELECT m.ordered,
                   CASE WHEN m.ordered THEN (
                        -- the run of ready rows from the key's first unsent row
                        SELECT coalesce(min(u.pos) FILTER (WHERE NOT u.ready) - 1, count(*))
                          FROM (SELECT row_number() OVER (ORDER BY o.id) AS pos,
                                       (o.state = 'pending' AND o.run_after <= now()
                                        AND (o.lease_until IS NULL OR o.lease_until < now())) AS ready
                                  FROM {schema}.outbox AS o
                                 WHERE o.topic = k.topic AND o.key = k.key AND o.state <> 'sent'
                                 ORDER BY o.id
                                 LIMIT least(w.most, $1 - w.taken)) AS u)
                   ELSE (
                        SELECT count(*)
                          FROM (SELECT 1
                                  FROM {schema}.outbox AS o
                                 WHERE o.topic = k.topic AND o.key = k.key AND o.state = 'pending'
                                   AND o.run_after <= now() AND (o.lease_until IS NULL OR o.lease_until < now())
                                 LIMIT least(w.most, $1 - w.taken)) AS u)
                   END AS gives
              FROM (SELECT route.ordered FROM route WHERE starts_with(k.topic, route.prefix)
                     ORDER BY length(route.prefix) DESC LIMIT 1) AS m
         ) AS g ON true
     WHERE w.n < $1 AND w.taken < $1
), ends AS (
    -- a walk that met the last key with room left gives the room to the keys that had more rows
    SELECT CASE WHEN max(n) < $1 THEN $1 - max(taken) ELSE 0 END AS room,
           count(*) FILTER (WHERE n > 0 AND gives = most) AS more
      FROM walk
), share AS (
    SELECT w.topic, w.key, w.ordered,
           w.gives + CASE WHEN w.gives = w.most AND e.room > 0
                          THEN ceil(e.room::numeric / e.more)::bigint ELSE 0 END AS gives
      FROM walk AS w, ends AS e
     WHERE w.n > 0 AND w.gives > 0
), keyed AS (
    -- a key's rows go in its first row's turn, one after another, so the cut below keeps a run's start
    SELECT l.ids[i] AS id, l.afters[1] AS run_after, l.ids[1] AS first, i AS pos
      FROM share AS w
     CROSS JOIN LATERAL (
            SELECT array_agg(o.id ORDER BY o.id) AS ids, array_agg(o.run_after ORDER BY o.id) AS afters
              FROM (SELECT o.id, o.run_after
                      FROM {schema}.outbox AS o
                     WHERE o.topic = w.topic AND o.key = w.key AND o.state = 'pending'
                       AND o.run_after <= now() AND (o.lease_until IS NULL OR o.lease_until < now())
                     ORDER BY o.id
                     LIMIT w.gives
                       FOR UPDATE OF o SKIP LOCKED) AS o
         ) AS l
     CROSS JOIN LATERAL (
            -- an ordered key's next unsent rows as this statement's snapshot has them
            SELECT array_agg(u.id ORDER BY u.id) AS ids
              FROM (SELECT o.id
                      FROM {schema}.outbox AS o
                     WHERE w.ordered AND o.topic = w.topic AND o.key = w.key AND o.state <> 'sent'
                     ORDER BY o.id
                     LIMIT w.gives) AS u
         ) AS r
     CROSS JOIN LATERAL (
            -- of an ordered key, the locked rows up to the first that is not its next unsent row (that one
            -- is locked by another relay now, or was leased since this statement's snapshot)
            SELECT coalesce(min(j) - 1, cardinality(l.ids)) AS keep
              FROM generate_subscripts(l.ids, 1) AS j
             WHERE w.ordered AND l.ids[j] IS DISTINCT FROM r.ids[j]
         ) AS c
     CROSS JOIN generate_series(1, c.keep) AS i
), picked AS (
    SELECT id, run_after, id AS first, 1 AS pos FROM unkeyed
    UNION ALL
    SELECT id, run_after, first, pos FROM keyed
     ORDER BY run_after, first, pos
     LIMIT $1
), claimed AS (
    UPDATE {schema}.outbox AS o
       SET attempts = o.attempts + 1,
           lease_until = now() + make_interval(secs => $5::float8),
           relay = $4
     -- through the primary key: joining "picked" instead let the planner hash the
     -- whole table, sent rows included (a sequential scan per claim)
     WHERE o.id = ANY(ARRAY(SELECT id FROM picked))
    RETURNING o.id, o.topic, o.key, coalesce(o.idempotency_key, 'outbox:' || o.id) AS idempotency_key,
              o.payload::text AS payload, o.headers::text AS headers, o.attempts, o.max_attempts, o.created_at
)
SELECT * FROM claimed
UNION ALL
SELECT NULL, w.topic, w.key, NULL, NULL, NULL, NULL, NULL, NULL
  FROM (SELECT topic, key FROM walk ORDER BY n DESC LIMIT 1) AS w;

-- name: finish_outbox
-- Record a batch's outcomes ($2: sent, retry after $4 seconds, failed, released) for relay $6 in one statement.
--
-- Guarded like job completions: a row changes only while relay $6 still holds
-- the attempt it claimed, so a relay whose lease ran out cannot overwrite what
-- the relay that took the row over decided. 'released' gives a claimed row back
-- untried (an earlier row of its key failed in the same batch): the attempt is
-- refunded. Returns the rows that applied.
--
-- The rows are found through the primary key (id = ANY($1)) and the outcomes
-- are read once (MATERIALIZED): the planner misjudges how many rows relay $6
-- holds, and with batches in flight side by side a plan that scanned the
-- table and unnested the arrays again for each row it found cost up to a
-- second per batch of 500.
WITH result AS MATERIALIZED (
    SELECT *
      FROM unnest($1::bigint[], $2::text[], $3::int[], $4::float8[], $5::text[])
           AS r(id, outcome, attempt, delay, error)
)
UPDATE {schema}.outbox AS o
   SET state = CASE r.outcome WHEN 'sent' THEN 'sent' WHEN 'failed' THEN 'failed' ELSE 'pending' END,
       sent_at = CASE WHEN r.outcome = 'sent' THEN now() END,
       attempts = o.attempts - (r.outcome = 'released')::int,
       run_after = CASE WHEN r.outcome = 'retry' THEN now() + make_interval(secs => r.delay)
                        ELSE o.run_after END,
       last_error = coalesce(r.error, o.last_error),
       lease_until = NULL,
       relay = NULL
  FROM result AS r
 WHERE o.id = r.id AND o.id = ANY($1::bigint[]) AND o.state = 'pending' AND o.relay = $6 AND o.attempts = r.attempt
RETURNING o.id;

-- name: plan_for_arguments
-- Plan every statement of this session for its arguments (a relay's pooled connection, when it connects).
--
-- asyncpg prepares each statement once, and after five runs PostgreSQL may
-- keep a generic plan, made without the batch's arrays: for finish_outbox that
-- plan is a nested loop comparing every row of a batch with every outcome
-- (about 150 ms for 1,000 rows, against 7 ms planned for the arrays). A relay
-- runs a few statements per batch of hundreds of rows, so planning each one
-- costs well under a millisecond a batch. Set with set_config rather than as
-- a startup parameter, which PgBouncer refuses.
SELECT set_config('plan_cache_mode', 'force_custom_plan', false);

-- name: hash_joins_only
-- Plan this transaction's statements without nested loops (before finish_outbox, in the same transaction).
--
-- finish_outbox joins a batch's rows to its outcomes. The planner judges
-- from the table's statistics how many rows relay $6 holds, and when they
-- say none (most rows sent, relay empty: what they say nearly always) it
-- expects one row and may pick a nested loop that compares every row of the
-- batch with every outcome: 250-340 ms for 1,000 rows in a relay of four
-- batches in flight, against 30 ms hashed. Set for the transaction only.
SELECT set_config('enable_nestloop', 'off', true);

-- name: extend_outbox_leases
-- Heartbeat of a slow batch: extend the leases relay $2 still holds on rows $1 by $3 seconds.
UPDATE {schema}.outbox
   SET lease_until = now() + make_interval(secs => $3::float8)
 WHERE id = ANY($1::bigint[]) AND state = 'pending' AND relay = $2
RETURNING id;

-- name: list_outbox
-- Outbox rows in state $1, topic starting with $2 (NULL = any), below id $3, newest first, at most $4.
SELECT id, topic, key, idempotency_key, state, attempts, max_attempts, run_after, last_error,
       created_at, sent_at, relay, lease_until
  FROM {schema}.outbox
 WHERE ($1::text IS NULL OR state = $1)
   AND ($2::text IS NULL OR starts_with(topic, $2))
   AND ($3::bigint IS NULL OR id < $3)
 ORDER BY id DESC
 LIMIT $4;

-- name: get_outbox
-- One outbox row with its payload and headers.
SELECT id, topic, key, idempotency_key, state, attempts, max_attempts, run_after, last_error,
       created_at, sent_at, relay, lease_until, payload::text AS payload, headers::text AS headers
  FROM {schema}.outbox
 WHERE id = $1;

-- name: outbox_counts
-- Outbox rows per topic and state, with the age in seconds of the oldest pending row.
SELECT topic, state, count(*) AS messages,
       extract(epoch FROM now() - min(created_at) FILTER (WHERE state = 'pending'))::float8 AS oldest_pending_seconds
  FROM {schema}.outbox
 GROUP BY topic, state
 ORDER BY topic, state;

-- name: unrouted_outbox
-- Pending outbox rows whose topic starts with none of the prefixes $1 ('' matches every topic), per topic: how many and the oldest's age, most first, at most $2 topics.
--
-- The claim takes only routed topics, so these rows wait until a route
-- matches them; pending rows are found through outbox_ready.
SELECT topic, count(*) AS messages, extract(epoch FROM now() - min(created_at))::float8 AS oldest_seconds
  FROM {schema}.outbox
 WHERE state = 'pending'
   AND NOT EXISTS (SELECT 1 FROM unnest($1::text[]) AS p(prefix) WHERE starts_with(topic, p.prefix))
 GROUP BY topic
 ORDER BY count(*) DESC, topic
 LIMIT $2;

-- name: retry_outbox
-- Failed rows back to pending with $4 more attempts: ids $1, or every failed row whose topic starts with $2 when $1 is NULL and $3.
UPDATE {schema}.outbox
   SET state = 'pending',
       run_after = now(),
       max_attempts = attempts + $4::int
 WHERE state = 'failed'
   AND (($1::bigint[] IS NOT NULL AND id = ANY($1))
        OR ($1::bigint[] IS NULL AND $3::bool AND ($2::text IS NULL OR starts_with(topic, $2))))
RETURNING id;

-- name: discard_outbox
-- Delete unsent outbox rows $1 (pending or failed; a sent row stays): the message is dropped, never delivered.
DELETE FROM {schema}.outbox
 WHERE id = ANY($1::bigint[]) AND state <> 'sent'
RETURNING id;

-- name: prune_outbox
-- Delete up to $2 rows sent more than $1 seconds ago, the oldest first (through outbox_sent, by primary key).
DELETE FROM {schema}.outbox
 WHERE id = ANY(ARRAY(SELECT id
                        FROM {schema}.outbox
                       WHERE state = 'sent' AND sent_at < now() - make_interval(secs => $1::float8)
                       ORDER BY sent_at
                       LIMIT $2))
   AND state = 'sent'
RETURNING id;

-- name: complete_job_in_transaction
-- Mark job $1 done for its running attempt $2 inside the task's own transaction (result $3, attempt meta $4); returns the id when it applied.
--
-- The job finishes in the same transaction as the task's writes and the
-- outbox rows they publish: a crash after the commit never runs the writes
-- again, a crash before it leaves nothing. The guard (running, this attempt)
-- refuses a try whose job was rescued or cancelled meanwhile; the worker's
-- own completion, arriving later, finds the job no longer running and
-- changes nothing.
WITH current AS (
    SELECT id, worker
      FROM {schema}.jobs
     WHERE id = $1 AND state = 'running' AND attempts = $2
       FOR UPDATE
), done AS (
    UPDATE {schema}.jobs AS j
       SET state = 'done',
           result = coalesce($3::text::jsonb, j.result),
           lease_until = NULL,
           worker = NULL,
           finished_at = now()
      FROM current
     WHERE j.id = current.id
 RETURNING j.id, current.worker
), audit AS (
    INSERT INTO {schema}.attempts (job_id, attempt, worker, outcome, meta)
    SELECT id, $2, worker, 'done', $4::text::jsonb FROM done
)
SELECT id FROM done;
