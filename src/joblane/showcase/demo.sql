-- Named queries of `joblane demo` (showcase/demo.py, which loads this file itself: they are not part of
-- joblane's catalogue): its live progress and its closing summary.
-- They read the demo's own schema, which it drops and creates again on every run.

-- name: demo_schema_note
-- The comment on schema $1 (the demo marks the schemas it made, and drops only those).
SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = $1;

-- name: demo_job_counts
-- Jobs per kind and state.
SELECT kind, state, count(*) FROM {schema}.jobs GROUP BY kind, state;

-- name: demo_running_jobs
-- Running jobs and the worker holding each (the demo picks the worker it kills by them).
SELECT id, kind, worker FROM {schema}.jobs WHERE state = 'running';

-- name: demo_attempt_counts
-- Tries per kind, outcome and the HTTP status the task recorded, with the tokens and latency it recorded.
SELECT j.kind, a.outcome, a.meta->>'status' AS status, count(*) AS tries,
       sum(CASE WHEN jsonb_typeof(a.meta->'tokens_in') = 'number' THEN (a.meta->>'tokens_in')::numeric END)::bigint,
       sum(CASE WHEN jsonb_typeof(a.meta->'tokens_out') = 'number' THEN (a.meta->>'tokens_out')::numeric END)::bigint,
       sum(CASE WHEN jsonb_typeof(a.meta->'latency_ms') = 'number' THEN (a.meta->>'latency_ms')::numeric END)::bigint,
       count(*) FILTER (WHERE jsonb_typeof(a.meta->'latency_ms') = 'number') AS timed
  FROM {schema}.attempts AS a
  JOIN {schema}.jobs AS j ON j.id = a.job_id
 GROUP BY 1, 2, 3;

-- name: demo_job_outcomes
-- For each of the jobs $1: its state and the outcomes of its tries in order.
SELECT j.id, j.state, array_agg(a.outcome ORDER BY a.id) FILTER (WHERE a.id IS NOT NULL)
  FROM {schema}.jobs AS j
  LEFT JOIN {schema}.attempts AS a ON a.job_id = j.id
 WHERE j.id = ANY($1::bigint[])
 GROUP BY j.id, j.state;

-- name: demo_outbox_counts
-- Outbox rows per state, and how many of them took more than one try.
SELECT state, count(*), count(*) FILTER (WHERE attempts > 1) FROM {schema}.outbox GROUP BY state;

-- name: demo_outbox_leased
-- Unsent outbox rows a relay holds a lease on right now: their idempotency keys (what is in flight).
SELECT coalesce(idempotency_key, 'outbox:' || id)
  FROM {schema}.outbox
 WHERE state = 'pending' AND lease_until > now();

-- name: demo_tour_unfinished
-- Score jobs still pending or running, and of those how many are running.
SELECT count(*), count(*) FILTER (WHERE state = 'running') FROM {schema}.jobs
 WHERE kind = 'score' AND state IN ('pending', 'running');
