-- Named queries of the AI-workflow features: the review queue (held jobs,
-- release, reject), replays, and the attempt audit trail.
-- {schema} is the validated, quoted schema name; every value is a $n parameter.

-- name: held_jobs
-- The review queue: held jobs of queue $1 and kind $2 (NULL = any), longest held first, at most $3.
--
-- jobs_held holds only held rows, so this never reads the finished history;
-- "held since" is the end of the try that raised Hold, or the job's creation
-- when it was enqueued held.
SELECT j.id, j.queue, j.kind, j.attempts, coalesce(h.finished_at, j.created_at) AS held_since,
       j.last_error, j.result::text AS data, j.payload::text AS payload
  FROM {schema}.jobs AS j
  LEFT JOIN LATERAL (
        SELECT a.finished_at
          FROM {schema}.attempts AS a
         WHERE a.job_id = j.id AND a.outcome = 'held'
         ORDER BY a.attempt DESC, a.id DESC
         LIMIT 1
       ) AS h ON true
 WHERE j.state = 'held'
   AND ($1::text IS NULL OR j.queue = $1)
   AND ($2::text IS NULL OR j.kind = $2)
 ORDER BY held_since, j.id
 LIMIT $3;

-- name: release_jobs
-- Put held jobs back to pending with payload || $6, recorded as 'released' by actor $7 with note $8: ids $1, or, when $1 is NULL, every held job of kind $2, queue $3, created in [$4, $5); notify when $9.
--
-- Guarded by state = 'held': a job released, rejected or cancelled meanwhile
-- is left alone and no row comes back. A patch applies to object payloads
-- only ("[1] || {...}" would append, not merge), so a non-object payload with
-- a patch is left held and reported by the caller. The try that was held
-- already spent its attempt; the budget grows by one if it was the last.
WITH target AS (
    SELECT id, payload AS before
      FROM {schema}.jobs
     WHERE state = 'held'
       AND (($1::bigint[] IS NOT NULL AND id = ANY($1))
            OR ($1::bigint[] IS NULL
                AND ($2::text IS NULL OR kind = $2)
                AND ($3::text IS NULL OR queue = $3)
                AND ($4::timestamptz IS NULL OR created_at >= $4)
                AND ($5::timestamptz IS NULL OR created_at < $5)))
       AND ($6::text::jsonb = '{}'::jsonb OR jsonb_typeof(payload) = 'object')
       FOR UPDATE
), released AS (
    UPDATE {schema}.jobs AS j
       SET state = 'pending',
           payload = CASE WHEN $6::text::jsonb = '{}'::jsonb THEN j.payload ELSE j.payload || $6::text::jsonb END,
           run_after = now(),
           result = NULL,
           finished_at = NULL,
           max_attempts = greatest(j.max_attempts, j.attempts + 1)
      FROM target
     WHERE j.id = ANY(ARRAY(SELECT id FROM target)) AND j.id = target.id
 RETURNING j.id, j.queue, j.attempts
), audit AS (
    -- the review label: approve, or approve_edited with the edit (the patch and the values it replaced)
    INSERT INTO {schema}.attempts (job_id, attempt, worker, started_at, outcome, error, meta)
    SELECT r.id, r.attempts, $7, now(), 'released', $8,
           CASE WHEN $6::text::jsonb = '{}'::jsonb THEN jsonb_build_object('label', 'approve')
                ELSE jsonb_build_object('label', 'approve_edited', 'payload_patch', $6::text::jsonb,
                                        'payload_before', (SELECT coalesce(jsonb_object_agg(k, t.before -> k), '{}')
                                                             FROM jsonb_object_keys($6::text::jsonb) AS k
                                                            WHERE t.before ? k)) END
      FROM released AS r
      JOIN target AS t ON t.id = r.id
), notified AS (
    SELECT pg_notify($10, queue) FROM (SELECT DISTINCT queue FROM released) AS q WHERE $9::bool
)
SELECT id, (SELECT count(*) FROM notified) AS notified FROM released;

-- name: reject_jobs
-- Cancel held jobs for reason $6, recorded as 'rejected' by actor $7: ids $1, or, when $1 is NULL, every held job of kind $2, queue $3, created in [$4, $5).
WITH target AS (
    SELECT id
      FROM {schema}.jobs
     WHERE state = 'held'
       AND (($1::bigint[] IS NOT NULL AND id = ANY($1))
            OR ($1::bigint[] IS NULL
                AND ($2::text IS NULL OR kind = $2)
                AND ($3::text IS NULL OR queue = $3)
                AND ($4::timestamptz IS NULL OR created_at >= $4)
                AND ($5::timestamptz IS NULL OR created_at < $5)))
       FOR UPDATE
), rejected AS (
    UPDATE {schema}.jobs AS j
       SET state = 'cancelled', finished_at = now(), last_error = $6
      FROM target
     WHERE j.id = ANY(ARRAY(SELECT id FROM target)) AND j.id = target.id
 RETURNING j.id, j.attempts
), audit AS (
    INSERT INTO {schema}.attempts (job_id, attempt, worker, started_at, outcome, error, meta)
    SELECT id, attempts, $7, now(), 'rejected', $6, jsonb_build_object('label', 'reject') FROM rejected
)
SELECT id FROM rejected;

-- name: job_replays
-- The jobs that re-run job $1 (their replay_of), oldest first.
SELECT id, state FROM {schema}.jobs WHERE replay_of = $1 ORDER BY id;

-- name: replay_jobs
-- Insert copies of the jobs matching ids $1, kind $2, queue $3, states $4, finished (or created) in [$5, $6), with payload || $9, replay_of set and tagged $13; nothing is inserted when $10 (dry run).
--
-- Replays are inserts: the matched rows are read, never updated. $4 NULL
-- means finished jobs only (done, failed, cancelled); $7 skips jobs that
-- already have a replay; $8 caps the match (NULL = no cap). The copies drop
-- unique_key (the original may still hold it) and start from a fresh
-- attempt budget. With a non-empty patch every matched payload must be an
-- object, else nothing is inserted and the caller reports which job is not.
-- Each matched row comes back with the id of its copy (NULL on a dry run).
WITH matched AS (
    SELECT j.id, j.queue, j.kind, j.state, j.priority, j.max_attempts,
           CASE WHEN $9::text::jsonb = '{}'::jsonb THEN j.payload ELSE j.payload || $9::text::jsonb END AS payload,
           jsonb_typeof(j.payload) AS payload_type
      FROM {schema}.jobs AS j
     WHERE ($1::bigint[] IS NULL OR j.id = ANY($1))
       AND ($2::text IS NULL OR j.kind = $2)
       AND ($3::text IS NULL OR j.queue = $3)
       AND (CASE WHEN $4::text[] IS NULL THEN j.state IN ('done', 'failed', 'cancelled')
                 ELSE j.state = ANY($4) END)
       AND ($5::timestamptz IS NULL OR coalesce(j.finished_at, j.created_at) >= $5)
       AND ($6::timestamptz IS NULL OR coalesce(j.finished_at, j.created_at) < $6)
       AND (NOT $7::bool OR NOT EXISTS (SELECT 1 FROM {schema}.jobs AS r WHERE r.replay_of = j.id))
     ORDER BY j.id
     LIMIT $8
), inserted AS (
    INSERT INTO {schema}.jobs (queue, kind, payload, priority, max_attempts, replay_of, replay_tag)
    SELECT m.queue, m.kind, m.payload, m.priority, m.max_attempts, m.id, $13::text
      FROM matched AS m
     WHERE NOT $10::bool
       AND ($9::text::jsonb = '{}'::jsonb
            OR NOT EXISTS (SELECT 1 FROM matched AS x WHERE x.payload_type <> 'object'))
     ORDER BY m.id
    RETURNING id, replay_of, queue
), notified AS (
    SELECT pg_notify($12, queue)
      FROM (SELECT DISTINCT queue FROM inserted) AS q
     WHERE $11::bool
)
SELECT m.id, i.id AS new_id, m.kind, m.queue, m.state, m.payload::text AS payload, m.payload_type,
       (SELECT count(*) FROM notified) AS notified
  FROM matched AS m
  LEFT JOIN inserted AS i ON i.replay_of = m.id
 ORDER BY m.id;

-- name: list_attempts
-- Attempts newest first, filtered by kind $1, queue $2, outcome $3, model $4, finished in [$5, $6), job $7, below attempt id $8; at most $9.
SELECT a.id, a.job_id, j.kind, j.queue, a.attempt, a.outcome, a.worker, a.started_at, a.finished_at,
       a.error, (a.meta - 'traceback')::text AS meta, j.state
  FROM {schema}.attempts AS a
  LEFT JOIN {schema}.jobs AS j ON j.id = a.job_id
 WHERE ($1::text IS NULL OR j.kind = $1)
   AND ($2::text IS NULL OR j.queue = $2)
   AND ($3::text IS NULL OR a.outcome = $3)
   AND ($4::text IS NULL OR a.meta->>'model' = $4)
   AND ($5::timestamptz IS NULL OR a.finished_at >= $5)
   AND ($6::timestamptz IS NULL OR a.finished_at < $6)
   AND ($7::bigint IS NULL OR a.job_id = $7)
   AND ($8::bigint IS NULL OR a.id < $8)
 ORDER BY a.id DESC
 LIMIT $9;

-- name: export_attempts
-- Every attempt of kind $1, queue $2, outcome $3, model $4, finished in [$5, $6), oldest first, with its job's current state.
--
-- Read through a server-side cursor, so a million rows stream in pages. The
-- time range walks attempts_finished (or attempts_model / attempts_outcome
-- when those filters are given) in finished_at order, so no sort holds the
-- whole result, and each row finds its job through the primary key. The
-- filters fold away when their parameter is NULL (custom plans).
SELECT a.id, a.job_id, j.kind, j.queue, a.attempt, a.outcome, a.worker, a.started_at, a.finished_at,
       round((extract(epoch FROM a.finished_at - a.started_at) * 1000)::numeric, 1)::float8 AS latency_ms,
       a.error, (a.meta - 'traceback')::text AS meta, j.state AS job_state, j.replay_of
  FROM {schema}.attempts AS a
  LEFT JOIN {schema}.jobs AS j ON j.id = a.job_id
 WHERE ($1::text IS NULL OR j.kind = $1)
   AND ($2::text IS NULL OR j.queue = $2)
   AND ($3::text IS NULL OR a.outcome = $3)
   AND ($4::text IS NULL OR a.meta->>'model' = $4)
   AND ($5::timestamptz IS NULL OR a.finished_at >= $5)
   AND ($6::timestamptz IS NULL OR a.finished_at < $6)
 ORDER BY a.finished_at, a.id;
