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
-- The statement lives in the function claim_outbox (migration 0017): it reads
-- each routed topic's entries from its cursor, never the rows sent before
-- (sql/migrations/0017_outbox_cursor.sql says how, and how a row of an
-- ordered route waits for the earlier rows of its key). The last row of the
-- result has a NULL id; its attempts column is 1 when the relay should claim
-- again at once (a topic was busy with another relay's claim, or deferred rows
-- were promoted that only a later claim can take).
SELECT * FROM {schema}.claim_outbox($1::int, $2::text[], $3::bool[], $4::text, $5::float8);

-- name: requeue_lost_outbox
-- Give pending rows whose lease expired (their relay died) new entries, so a claim takes them again; returns how many.
--
-- The claim that leased them consumed their entries. Walks outbox_leased (pending
-- leased rows by lease end), so relays run it every half lease, not per claim.
SELECT {schema}.requeue_lost_outbox();

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
-- second per batch of 500. The state test is "(o.state = 'pending') IS TRUE":
-- a plain o.state = 'pending' lets the planner walk outbox_ready (partial on
-- it) for the batch's ids, and once statistics say few rows are pending it
-- does; behind a held snapshot that walk reads every version of every row
-- sent since (114 ms and 38,821 buffers for a batch of 4, ten minutes into a
-- hold at 200 messages/s).
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
 WHERE o.id = r.id AND o.id = ANY($1::bigint[]) AND (o.state = 'pending') IS TRUE AND o.relay = $6
   AND o.attempts = r.attempt
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
--
-- By primary key: "IS TRUE" keeps the planner off outbox_ready (finish_outbox).
UPDATE {schema}.outbox
   SET lease_until = now() + make_interval(secs => $3::float8)
 WHERE id = ANY($1::bigint[]) AND (state = 'pending') IS TRUE AND relay = $2
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
