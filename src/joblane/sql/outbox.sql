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
-- Lease up to $1 deliverable rows whose topic starts with a route prefix $2 (ordered when $3) to relay $4 for $5 seconds.
--
-- A row of an ordered route with a key waits while an earlier row of the
-- same (topic, key) is unsent. The claim works in two steps, both with SKIP
-- LOCKED so that relays side by side take different rows:
-- * "head" scans ready rows in (run_after, id) order, taking rows of
--   unordered routes, rows without a key, and of each ordered key only its
--   head: the row with no earlier unsent row. Taking only heads here means a
--   key whose head is backing off never fills the batch with rows that
--   would have to wait, and a retried head (whose run_after is later than
--   its followers') is not pushed out of the batch by them.
-- * "follower" adds, in id order, the ready rows that follow those heads,
--   so a busy key moves many rows per batch; the relay sends one key's rows
--   one after another, and stops at the first that fails.
-- "picked" keeps a follower only if every earlier unsent row of its key is
-- in this batch (one skipped as locked, or cut by LIMIT, holds the rest).
-- Rows locked but not picked are released when this statement commits.
-- The longest matching prefix decides whether a topic is ordered, as it
-- decides the sink.
WITH route AS (
    SELECT r.prefix, r.ordered
      FROM unnest($2::text[], $3::bool[]) AS r(prefix, ordered)
), head AS (
    SELECT o.id, o.topic, o.key, (m.ordered AND o.key IS NOT NULL) AS ordered
      FROM {schema}.outbox AS o
     CROSS JOIN LATERAL (
            SELECT route.ordered
              FROM route
             WHERE starts_with(o.topic, route.prefix)
             ORDER BY length(route.prefix) DESC
             LIMIT 1
         ) AS m
     WHERE o.state = 'pending'
       AND o.run_after <= now()
       AND (o.lease_until IS NULL OR o.lease_until < now())
       AND (o.key IS NULL OR NOT m.ordered OR NOT EXISTS (
             SELECT 1
               FROM {schema}.outbox AS e
              WHERE e.topic = o.topic AND e.key = o.key AND e.id < o.id AND e.state <> 'sent'))
     ORDER BY o.run_after, o.id
     LIMIT $1
       FOR UPDATE OF o SKIP LOCKED
), follower AS (
    -- One probe per ordered head key, walking outbox_key_unsent in id order.
    SELECT f.id, f.topic, f.key
      FROM (SELECT DISTINCT topic, key FROM head WHERE ordered) AS h
     CROSS JOIN LATERAL (
            SELECT o.id, o.topic, o.key
              FROM {schema}.outbox AS o
             WHERE o.topic = h.topic AND o.key = h.key AND o.state = 'pending'
               AND o.run_after <= now()
               AND (o.lease_until IS NULL OR o.lease_until < now())
               AND o.id NOT IN (SELECT id FROM head)
             ORDER BY o.id
             LIMIT greatest($1 - (SELECT count(*) FROM head), 0)
               FOR UPDATE OF o SKIP LOCKED
         ) AS f
     ORDER BY f.id
     LIMIT greatest($1 - (SELECT count(*) FROM head), 0)
), picked AS (
    SELECT id FROM head
    UNION ALL
    SELECT f.id
      FROM follower AS f
     WHERE NOT EXISTS (
             SELECT 1
               FROM {schema}.outbox AS e
              WHERE e.topic = f.topic AND e.key = f.key AND e.id < f.id AND e.state <> 'sent'
                AND e.id NOT IN (SELECT id FROM head)
                AND e.id NOT IN (SELECT id FROM follower))
)
UPDATE {schema}.outbox AS o
   SET attempts = o.attempts + 1,
       lease_until = now() + make_interval(secs => $5::float8),
       relay = $4
 -- through the primary key: joining "picked" instead let the planner hash the
 -- whole table, sent rows included (a sequential scan per claim)
 WHERE o.id = ANY(ARRAY(SELECT id FROM picked))
RETURNING o.id, o.topic, o.key, coalesce(o.idempotency_key, 'outbox:' || o.id) AS idempotency_key,
          o.payload::text AS payload, o.headers::text AS headers, o.attempts, o.max_attempts, o.created_at;

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
