-- Named queries of the command line and the admin calls on App.

-- name: status_counts
-- Jobs per queue and state, with the age of the oldest ready job.
SELECT queue, state, count(*) AS jobs,
       extract(epoch FROM now() - min(run_after) FILTER (WHERE state = 'pending' AND run_after <= now()))
           AS oldest_ready_seconds
  FROM {schema}.jobs
 GROUP BY queue, state
 ORDER BY queue, state;

-- name: list_jobs
-- Jobs filtered by state $1, kind $2, queue $3, created in [$6, $7) (NULL = any), newest first, below id $4, at most $5.
SELECT id, queue, kind, state, priority, attempts, max_attempts, run_after, last_error,
       created_at, finished_at, worker, unique_key, replay_of
  FROM {schema}.jobs
 WHERE ($1::text IS NULL OR state = $1)
   AND ($2::text IS NULL OR kind = $2)
   AND ($3::text IS NULL OR queue = $3)
   AND ($4::bigint IS NULL OR id < $4)
   AND ($6::timestamptz IS NULL OR created_at >= $6)
   AND ($7::timestamptz IS NULL OR created_at < $7)
 ORDER BY id DESC
 LIMIT $5;

-- name: get_job
-- One job with every column.
SELECT id, queue, kind, payload::text AS payload, state, priority, attempts, max_attempts,
       run_after, last_error, lease_until, worker, unique_key, replay_of, result::text AS result,
       created_at, finished_at
  FROM {schema}.jobs
 WHERE id = $1;

-- name: job_attempts
-- Every attempt of job $1 in order.
SELECT attempt, worker, started_at, finished_at, outcome, error, meta::text AS meta
  FROM {schema}.attempts
 WHERE job_id = $1
 ORDER BY id;

-- name: retry_jobs
-- Put failed or cancelled jobs back to pending with $7 more tries (max_attempts at least attempts + $7): ids $1, or, when $1 is NULL, every job in states $4 of kind $2, queue $3, created in [$5, $6).
WITH target AS (
    SELECT j.id, j.unique_key
      FROM {schema}.jobs AS j
     WHERE j.state IN ('failed', 'cancelled')
       AND (($1::bigint[] IS NOT NULL AND j.id = ANY($1))
            OR ($1::bigint[] IS NULL
                AND ($2::text IS NULL OR j.kind = $2)
                AND ($3::text IS NULL OR j.queue = $3)
                AND j.state = ANY($4::text[])
                AND ($5::timestamptz IS NULL OR j.created_at >= $5)
                AND ($6::timestamptz IS NULL OR j.created_at < $6)))
       -- never revive a job whose unique_key another unfinished job now holds
       AND (j.unique_key IS NULL OR NOT EXISTS (
             SELECT 1 FROM {schema}.jobs AS o
              WHERE o.unique_key = j.unique_key AND o.state IN ('pending', 'running', 'held', 'waiting')))
     FOR UPDATE SKIP LOCKED
), chosen AS (
    -- at most one job per unique_key (the newest): reviving two would break jobs_unique_key
    SELECT DISTINCT ON (unique_key, CASE WHEN unique_key IS NULL THEN id END) id
      FROM target
     ORDER BY unique_key, CASE WHEN unique_key IS NULL THEN id END, id DESC
)
UPDATE {schema}.jobs AS j
   SET state = 'pending', run_after = now(), finished_at = NULL,
       max_attempts = greatest(j.max_attempts, j.attempts + $7::int)
  FROM chosen
 WHERE j.id = ANY(ARRAY(SELECT id FROM chosen)) AND j.id = chosen.id
RETURNING j.id;

-- name: cancel_jobs
-- Cancel pending, held, waiting or running jobs: ids $1, or, when $1 is NULL, every job in states $4 of kind $5, queue $6, created in [$7, $8); a running task is stopped at its next heartbeat.
WITH target AS (
    SELECT id, state AS was, attempts, worker, started_at
      FROM {schema}.jobs
     WHERE state IN ('pending', 'held', 'running', 'waiting')
       AND (($1::bigint[] IS NOT NULL AND id = ANY($1))
            OR ($1::bigint[] IS NULL
                AND state = ANY($4::text[])
                AND ($5::text IS NULL OR kind = $5)
                AND ($6::text IS NULL OR queue = $6)
                AND ($7::timestamptz IS NULL OR created_at >= $7)
                AND ($8::timestamptz IS NULL OR created_at < $8)))
       FOR UPDATE
), cancelled AS (
    UPDATE {schema}.jobs AS j
       SET state = 'cancelled', finished_at = now(), lease_until = NULL, worker = NULL,
           last_error = coalesce($2, 'cancelled')
      FROM target
     WHERE j.id = ANY(ARRAY(SELECT id FROM target)) AND j.id = target.id
 RETURNING j.id, target.was, j.attempts, target.worker, target.started_at
), audit AS (
    -- a running try keeps its worker and start on its row; the operator is in meta
    INSERT INTO {schema}.attempts (job_id, attempt, worker, started_at, outcome, error, meta)
    SELECT id, attempts, CASE WHEN was = 'running' THEN worker ELSE $3 END,
           CASE WHEN was = 'running' THEN started_at ELSE now() END,
           'cancelled', coalesce($2, 'cancelled from ' || was), jsonb_build_object('cancelled_by', $3::text)
      FROM cancelled
)
SELECT id, was FROM cancelled;

-- name: count_jobs
-- How many jobs a bulk admin call would touch: ids $1 (NULL = any) in states $2, of kind $3, queue $4, created in [$5, $6); with the first $7 ids.
WITH matched AS (
    SELECT id
      FROM {schema}.jobs
     WHERE ($1::bigint[] IS NULL OR id = ANY($1))
       AND state = ANY($2::text[])
       AND ($3::text IS NULL OR kind = $3)
       AND ($4::text IS NULL OR queue = $4)
       AND ($5::timestamptz IS NULL OR created_at >= $5)
       AND ($6::timestamptz IS NULL OR created_at < $6)
)
SELECT (SELECT count(*) FROM matched), ARRAY(SELECT id FROM matched ORDER BY id LIMIT $7);

-- name: job_states
-- The state of each of the jobs $1 (to explain why an admin call skipped some).
SELECT id, state FROM {schema}.jobs WHERE id = ANY($1::bigint[]);

-- name: unfinished_count
-- How many jobs of queues $1 are ready now or running (joblane.testing.drain waits for none).
--
-- "Ready now" is clock_timestamp(), read after the statement's snapshot, not
-- now(): a retry written with no delay by a transaction that began after
-- this statement's transaction (but committed before its snapshot) has a
-- run_after later than now(); against now() it would count as neither ready
-- nor running, and drain would return before running it.
SELECT count(*) FROM {schema}.jobs
 WHERE (state = 'pending' AND run_after <= clock_timestamp() AND queue = ANY($1::text[])
        AND hashtext(queue) = ANY(ARRAY(SELECT hashtext(q) FROM unnest($1::text[]) AS q)))
    OR state = 'running';

-- name: jobs_of_kind
-- Ids and payloads of the jobs of kind $1 in state $2, oldest first (joblane.testing.assert_enqueued).
SELECT id, payload::text FROM {schema}.jobs WHERE kind = $1 AND state = $2 ORDER BY id;

-- name: list_processes
-- Live workers and relays (registration not expired), oldest first.
SELECT name, role, host, pid, version, queues, kinds, concurrency, running, started_at, last_seen, lease_until,
       stopping::text
  FROM {schema}.processes
 WHERE lease_until > now()
 ORDER BY started_at, name;

-- name: table_health
-- joblane's tables in schema $1: size on disk, live and dead row versions, and when (auto)vacuum last ran; a partitioned table (attempts) as the sum of its partitions.
SELECT c.relname::text, sum(pg_total_relation_size(t.relid))::bigint AS bytes,
       sum(coalesce(s.n_live_tup, 0))::bigint, sum(coalesce(s.n_dead_tup, 0))::bigint,
       max(greatest(s.last_autovacuum, s.last_vacuum)),
       sum(coalesce(s.autovacuum_count, 0) + coalesce(s.vacuum_count, 0))::bigint
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
 CROSS JOIN LATERAL (SELECT c.oid AS relid WHERE c.relkind = 'r'
                     UNION ALL
                     SELECT p.relid FROM pg_partition_tree(c.oid) AS p WHERE c.relkind = 'p' AND p.isleaf) AS t
  LEFT JOIN pg_stat_all_tables s ON s.relid = t.relid
 WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND NOT c.relispartition
 GROUP BY c.relname
 ORDER BY bytes DESC;

-- name: database_health
-- Whether autovacuum is on, the age in seconds of the oldest open transaction (it holds back every vacuum), and how often autovacuum looks for work (seconds).
SELECT current_setting('autovacuum')::bool,
       (SELECT extract(epoch FROM max(now() - xact_start))::float8
          FROM pg_stat_activity WHERE xact_start IS NOT NULL AND pid <> pg_backend_pid()),
       (SELECT setting::float8 FROM pg_settings WHERE name = 'autovacuum_naptime');
