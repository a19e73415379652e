-- Named queries of the web dashboard (`joblane dashboard`).
--
-- The pages that load on every refresh (overview, review queue, metrics) read
-- only the partial indexes of unfinished and failed jobs, whose size follows
-- the work in flight rather than the history. Finished rows (done, cancelled)
-- are counted exactly only while the table is small; past that the overview
-- shows the planner's estimate, which costs no read of the table at all.

-- name: dashboard_queue_counts
-- Pending, running, held, failed and waiting jobs per queue, exact, each read from an index; with the oldest ready job's age.
--
-- One branch per state so that each can use its own partial index: pending
-- from jobs_ready (index-only: queue and run_after are in it), running from
-- jobs_lease, held from jobs_held, failed from jobs_failed. A single
-- "GROUP BY queue, state" would have to read every row of the table.
-- Waiting has no index of its own: a job waiting for a signal is found
-- through jobs_wait_key, one waiting for its parents through job_deps (its
-- edges leave with the child), so neither branch reads the finished history.
SELECT queue, 'pending' AS state, count(*) AS jobs,
       extract(epoch FROM now() - min(run_after) FILTER (WHERE run_after <= now()))::float8 AS oldest_ready_seconds
  FROM {schema}.jobs
 WHERE state = 'pending'
 GROUP BY queue
UNION ALL
SELECT queue, 'running', count(*), NULL
  FROM {schema}.jobs
 WHERE state = 'running'
 GROUP BY queue
UNION ALL
SELECT queue, 'held', count(*), NULL
  FROM {schema}.jobs
 WHERE state = 'held'
 GROUP BY queue
UNION ALL
SELECT queue, 'failed', count(*), NULL
  FROM {schema}.jobs
 WHERE state = 'failed'
 GROUP BY queue
UNION ALL
SELECT queue, 'waiting', count(*), NULL
  FROM (SELECT queue FROM {schema}.jobs
         WHERE state = 'waiting' AND wait_key IS NOT NULL
        UNION ALL
        SELECT j.queue FROM {schema}.jobs AS j
         WHERE j.id = ANY(ARRAY(SELECT DISTINCT d.child_id FROM {schema}.job_deps AS d))
           AND j.state = 'waiting' AND j.wait_key IS NULL) AS w
 GROUP BY queue;

-- name: dashboard_table_estimate
-- The jobs table's size on disk and the planner's row estimate per state (no read of the table); $1 is the schema name.
SELECT pg_relation_size(c.oid) AS bytes,
       c.reltuples::float8 AS estimated_rows,
       s.most_common_vals::text::text[] AS states,
       s.most_common_freqs::float8[] AS frequencies
  FROM pg_class AS c
  LEFT JOIN pg_stats AS s
         ON s.schemaname = $1 AND s.tablename = 'jobs' AND s.attname = 'state'
 WHERE c.oid = '{schema}.jobs'::regclass;

-- name: dashboard_finished_counts
-- Done and cancelled jobs per queue, exact: reads the whole table, so it runs only while the table is small.
SELECT queue, state, count(*) AS jobs
  FROM {schema}.jobs
 WHERE state IN ('done', 'cancelled')
 GROUP BY queue, state;

-- name: dashboard_throughput
-- Jobs finished and jobs failed per minute over the last $1 minutes (ago = 0 is the current minute), from the finished and failed partial indexes.
WITH finished AS (
    SELECT floor(extract(epoch FROM now() - finished_at) / 60)::int AS ago, count(*) AS jobs
      FROM {schema}.jobs
     WHERE state IN ('done', 'failed', 'cancelled')
       AND finished_at > now() - make_interval(mins => $1::int)
     GROUP BY 1
), failed AS (
    SELECT floor(extract(epoch FROM now() - finished_at) / 60)::int AS ago, count(*) AS jobs
      FROM {schema}.jobs
     WHERE state = 'failed'
       AND finished_at > now() - make_interval(mins => $1::int)
     GROUP BY 1
)
SELECT m.ago, coalesce(f.jobs, 0) AS finished, coalesce(x.jobs, 0) AS failed
  FROM generate_series(0, $1::int - 1) AS m(ago)
  LEFT JOIN finished AS f USING (ago)
  LEFT JOIN failed AS x USING (ago)
 ORDER BY m.ago DESC;

-- name: dashboard_workers
-- Workers holding running jobs (from the running partial index): job count, queues, lease expiry, and up to $1 of their job ids.
SELECT worker,
       count(*) AS jobs,
       array_agg(DISTINCT queue ORDER BY queue) AS queues,
       extract(epoch FROM min(lease_until) - now())::float8 AS first_lease_left,
       extract(epoch FROM max(lease_until) - now())::float8 AS last_lease_left,
       (array_agg(id ORDER BY id))[1:$1::int] AS job_ids,
       (array_agg(kind ORDER BY id))[1:$1::int] AS job_kinds
  FROM {schema}.jobs
 WHERE state = 'running'
 GROUP BY worker
 ORDER BY worker;

-- name: dashboard_job_steps
-- The checkpointed steps job $1 has finished, in the order they finished, with the try that ran each and its stored result.
SELECT name, attempt, finished_at, result::text AS result
  FROM {schema}.job_steps
 WHERE job_id = $1
 ORDER BY finished_at, name;

-- name: dashboard_held_jobs
-- Held jobs, longest held first (after held time $1 and id $2 for the next page; queue $3 or any; at most $4), with the reason, payload, hold data and the held try's metadata.
--
-- jobs_held holds only held rows, so this never reads the finished history.
-- A job is held since the end of the try that raised Hold, or since its
-- creation when it was enqueued held.
SELECT j.id, j.queue, j.kind, j.payload::text AS payload, j.last_error, j.attempts, j.created_at,
       h.held_since, h.meta::text AS meta, j.result::text AS result
  FROM {schema}.jobs AS j
 CROSS JOIN LATERAL (
        SELECT coalesce(max(a.finished_at), j.created_at) AS held_since,
               (array_agg(a.meta - 'traceback' - 'hold_data' ORDER BY a.attempt DESC, a.id DESC))[1] AS meta
          FROM {schema}.attempts AS a
         WHERE a.job_id = j.id AND a.outcome = 'held'
       ) AS h
 WHERE j.state = 'held'
   AND ($1::timestamptz IS NULL OR (h.held_since, j.id) > ($1, $2::bigint))
   AND ($3::text IS NULL OR j.queue = $3)
 ORDER BY h.held_since, j.id
 LIMIT $4;

-- name: dashboard_attempt_outcomes
-- Attempts finished in the last $1 seconds, by outcome (the attempts_finished index bounds the read).
SELECT outcome, count(*) AS attempts
  FROM {schema}.attempts
 WHERE finished_at > now() - make_interval(secs => $1::float8)
 GROUP BY outcome
 ORDER BY outcome;

-- name: dashboard_outbox_topics
-- Outbox rows per topic: pending (with the age of the oldest), retrying (pending after a failed try) and failed (with the age of the oldest), exact; sent within the last $1 seconds.
SELECT topic, 'pending' AS state, count(*) AS messages,
       extract(epoch FROM now() - min(created_at))::float8 AS oldest_seconds
  FROM {schema}.outbox
 WHERE state = 'pending'
 GROUP BY topic
UNION ALL
SELECT topic, 'retrying', count(*), NULL
  FROM {schema}.outbox
 WHERE state = 'pending' AND attempts > 0
 GROUP BY topic
UNION ALL
SELECT topic, 'failed', count(*), extract(epoch FROM now() - min(created_at))::float8
  FROM {schema}.outbox
 WHERE state = 'failed'
 GROUP BY topic
UNION ALL
SELECT topic, 'sent', count(*), NULL
  FROM {schema}.outbox
 WHERE state = 'sent' AND sent_at > now() - make_interval(secs => $1::float8)
 GROUP BY topic;

-- name: dashboard_outbox_retrying
-- Pending outbox rows that have failed at least one try (topic $1 or any), most tries first, at most $2, with the last error.
SELECT id, topic, key, attempts, max_attempts, run_after, last_error, created_at
  FROM {schema}.outbox
 WHERE state = 'pending' AND attempts > 0
   AND ($1::text IS NULL OR topic = $1)
 ORDER BY attempts DESC, id
 LIMIT $2;

-- name: dashboard_outbox_failed
-- Failed outbox rows newest first (id below $1 for the next page, topic $2 or any, at most $3), with their errors.
SELECT id, topic, key, idempotency_key, attempts, last_error, created_at, left(payload::text, 300) AS payload_preview
  FROM {schema}.outbox
 WHERE state = 'failed'
   AND ($1::bigint IS NULL OR id < $1)
   AND ($2::text IS NULL OR topic = $2)
 ORDER BY id DESC
 LIMIT $3;

-- name: dashboard_paused_queues
-- Queues paused right now (RetryAfter with pause_queue, or App.pause_queue), with how long and why.
SELECT queue, extract(epoch FROM until - now())::float8 AS seconds_left, reason
  FROM {schema}.queue_pauses
 WHERE until > now()
 ORDER BY queue;

-- name: dashboard_failed_recent
-- Jobs that failed for good within the last $1 seconds, per queue (the failed partial index).
SELECT queue, count(*) AS jobs
  FROM {schema}.jobs
 WHERE state = 'failed' AND finished_at > now() - make_interval(secs => $1::float8)
 GROUP BY queue;

-- name: dashboard_job_id_range
-- The lowest and highest job id (both ends of the primary key).
SELECT min(id), max(id) FROM {schema}.jobs;

-- name: dashboard_search_jobs
-- Jobs newest first matching states $1, kind $2, queue $3, created in [$4, $5), payload containing $6 (jsonb @>), error containing $7 (any case), id below $8 and at least $10, at most $9 (NULL = any).
--
-- The dashboard searches in slices of ids ($10 to $8), newest first, so that a
-- filter no index serves (payload, error text) reads a bounded slice of the
-- primary key per statement instead of the whole table.
SELECT id, queue, kind, state, priority, attempts, max_attempts, run_after, last_error,
       created_at, finished_at, worker, replay_of, left(payload::text, 160) AS payload_preview,
       wait_key, parents_left, batch_id
  FROM {schema}.jobs
 WHERE ($1::text[] IS NULL OR state = ANY($1))
   AND ($2::text IS NULL OR kind = $2)
   AND ($3::text IS NULL OR queue = $3)
   AND ($4::timestamptz IS NULL OR created_at >= $4)
   AND ($5::timestamptz IS NULL OR created_at < $5)
   AND ($6::jsonb IS NULL OR payload @> $6)
   AND ($7::text IS NULL OR strpos(lower(last_error), lower($7)) > 0)
   AND ($8::bigint IS NULL OR id < $8)
   AND ($10::bigint IS NULL OR id >= $10)
 ORDER BY id DESC
 LIMIT $9;

-- name: dashboard_search_ids
-- The ids of every job matching the search filters ($1..$7 as dashboard_search_jobs), oldest first, at most $8, and how many match in all.
WITH matching AS (
    SELECT id
      FROM {schema}.jobs
     WHERE ($1::text[] IS NULL OR state = ANY($1))
       AND ($2::text IS NULL OR kind = $2)
       AND ($3::text IS NULL OR queue = $3)
       AND ($4::timestamptz IS NULL OR created_at >= $4)
       AND ($5::timestamptz IS NULL OR created_at < $5)
       AND ($6::jsonb IS NULL OR payload @> $6)
       AND ($7::text IS NULL OR strpos(lower(last_error), lower($7)) > 0)
)
SELECT (SELECT count(*) FROM matching) AS total,
       coalesce((SELECT array_agg(id ORDER BY id) FROM (SELECT id FROM matching ORDER BY id LIMIT $8) AS first), '{}')
         AS ids;
