-- Named queries of workflows: dependencies, batches, durable waits (the plpgsql they call is in migration 0004).

-- name: link_jobs
-- Make waiting jobs $1 depend on jobs $2 (one element per edge) with parent failure policies $3; each child's state after.
SELECT child_id, state FROM {schema}.link_jobs($1::bigint[], $2::bigint[], $3::text[]);

-- name: create_batch
-- A new batch named $1 whose callback is kind $2 in queue $3 with payload $4 (JSON text), priority $5, max_attempts $6.
INSERT INTO {schema}.batches (name, on_complete_kind, on_complete_queue, on_complete_payload, on_complete_priority,
                              on_complete_max_attempts)
VALUES ($1, $2, $3, $4::text::jsonb, $5, $6)
RETURNING id;

-- name: add_to_batch
-- Add jobs $2 to batch $1 (refused once it is sealed); how many joined.
SELECT {schema}.add_to_batch($1::bigint, $2::bigint[]);

-- name: seal_batch
-- Seal batch $1; finishes it (and enqueues its callback) now when nothing of it is unfinished. True when finished.
SELECT {schema}.seal_batch($1::bigint);

-- name: batch_progress
-- Batch $1 with its jobs counted by state (one index scan of jobs_batch).
SELECT b.id, b.name, b.on_complete_kind, b.created_at, b.sealed_at, b.finished_at, b.callback_job_id,
       coalesce((SELECT jsonb_object_agg(s.state, s.n)::text
                   FROM (SELECT j.state, count(*) AS n FROM {schema}.jobs AS j
                          WHERE j.batch_id = b.id GROUP BY j.state) AS s), '{}')
  FROM {schema}.batches AS b
 WHERE b.id = $1;

-- name: list_batches
-- Batches newest first, below id $1 (NULL: from the newest), at most $2, unfinished only when $3, each with its jobs counted by state.
SELECT b.id, b.name, b.on_complete_kind, b.created_at, b.sealed_at, b.finished_at, b.callback_job_id,
       coalesce((SELECT jsonb_object_agg(s.state, s.n)::text
                   FROM (SELECT j.state, count(*) AS n FROM {schema}.jobs AS j
                          WHERE j.batch_id = b.id GROUP BY j.state) AS s), '{}')
  FROM {schema}.batches AS b
 WHERE ($1::bigint IS NULL OR b.id < $1) AND (NOT $3::bool OR b.finished_at IS NULL)
 ORDER BY b.id DESC
 LIMIT $2;

-- name: batch_jobs
-- Jobs of batch $1 (state $2, NULL = any), by id, above id $4 (NULL: from the first; the next page), at most $3, with what each waits on.
SELECT j.id, j.kind, j.queue, j.state, j.attempts, j.max_attempts, j.last_error, j.wait_key, j.parents_left,
       j.created_at, j.finished_at
  FROM {schema}.jobs AS j
 WHERE j.batch_id = $1 AND ($2::text IS NULL OR j.state = $2)
   AND ($4::bigint IS NULL OR j.id > $4)
 ORDER BY j.id
 LIMIT $3;

-- name: job_flow
-- What job $1 waits on and belongs to: its wait key and deadline, parents left, batch, parents and children.
SELECT j.wait_key, CASE WHEN j.state = 'waiting' AND j.wait_timeout IS NOT NULL THEN j.run_after END,
       j.wait_timeout, j.parents_left, j.on_parent_failure, j.batch_id,
       ARRAY(SELECT d.parent_id FROM {schema}.job_deps AS d WHERE d.child_id = j.id ORDER BY d.parent_id),
       ARRAY(SELECT d.child_id FROM {schema}.job_deps AS d WHERE d.parent_id = j.id ORDER BY d.child_id LIMIT 100)
  FROM {schema}.jobs AS j
 WHERE j.id = $1;

-- name: signal
-- Wake the jobs waiting for key $1 with data $2 (JSON text), or keep it for the first job that waits for it; how many woke.
SELECT {schema}.signal($1::text, $2::text::jsonb);

-- name: park_jobs
-- Park running jobs whose try raised WaitFor (a JSON array), guarded by state, attempt and worker $2; the ids that applied.
SELECT {schema}.park_jobs($1::text::jsonb, $2::text);

-- name: expire_waits
-- Up to $1 waiting jobs past their wait's deadline: failed, or pending again without a signal, by their wait_timeout.
--
-- It reads the waiting jobs through jobs_wait_key (the jobs that wait for a signal, however many).
WITH late AS (
    SELECT id, wait_key
      FROM {schema}.jobs
     WHERE state = 'waiting' AND wait_key IS NOT NULL AND wait_timeout IS NOT NULL AND run_after < now()
     ORDER BY run_after
     LIMIT $1
       FOR UPDATE SKIP LOCKED
), expired AS (
    UPDATE {schema}.jobs AS j
       SET state = CASE WHEN j.wait_timeout = 'fail' THEN 'failed' ELSE 'pending' END,
           finished_at = CASE WHEN j.wait_timeout = 'fail' THEN now() END,
           last_error = 'the wait for ' || late.wait_key || ' timed out',
           run_after = now(), wait_key = NULL, wait_timeout = NULL
      FROM late
     WHERE j.id = ANY(ARRAY(SELECT id FROM late)) AND j.id = late.id
 RETURNING j.id, j.state, j.queue, j.attempts, j.last_error
), audit AS (
    INSERT INTO {schema}.attempts (job_id, attempt, started_at, outcome, error)
    SELECT id, attempts, now(), 'timeout', last_error FROM expired
)
SELECT id, state, CASE WHEN state = 'pending' THEN pg_notify($2, queue)::text END FROM expired;

-- name: prune_flows
-- Delete up to $2 batches finished more than $1 seconds ago none of whose jobs are left, and signals kept that long.
WITH gone_batches AS (
    DELETE FROM {schema}.batches AS b
     WHERE b.id = ANY(ARRAY(
               SELECT c.id FROM {schema}.batches AS c
                WHERE c.finished_at < now() - make_interval(secs => $1::float8)
                  AND NOT EXISTS (SELECT 1 FROM {schema}.jobs AS j WHERE j.batch_id = c.id)
                LIMIT $2))
    RETURNING b.id
), gone_signals AS (
    DELETE FROM {schema}.signals
     WHERE key = ANY(ARRAY(SELECT s.key FROM {schema}.signals AS s
                            WHERE s.created_at < now() - make_interval(secs => $1::float8) LIMIT $2))
    RETURNING key
)
SELECT (SELECT count(*) FROM gone_batches), (SELECT count(*) FROM gone_signals);

-- name: waiting_jobs
-- Waiting jobs (for a signal or for parents), oldest first, at most $1, of queue $2 (NULL = any).
SELECT id, queue, kind, wait_key, parents_left, CASE WHEN wait_timeout IS NOT NULL THEN run_after END,
       created_at, last_error
  FROM {schema}.jobs
 WHERE state = 'waiting' AND ($2::text IS NULL OR queue = $2)
 ORDER BY id
 LIMIT $1;
