-- Named queries of spend caps (budgets), cached steps, the dataset export and replay comparisons (ai.py).
-- {schema} is the validated, quoted schema name; every value is a $n parameter.
--
-- A budget's window is fixed: window_seconds long from the epoch, or the
-- calendar month in UTC when window_seconds is NULL. Each query computes the
-- current window's start (ws) and end (we) from the same expression.
--
-- A queue with budgets is claimed like a queue with limits, by the one
-- limited claim (sql/limits.sql): lock_queue_claims, fold_budget_holds, then
-- claim_jobs_limited, which enforces the queue's limits and its budgets' caps
-- together.

-- name: declare_budget
-- Write budget $1 as an app declares it (a worker at start): queue $2, cap $3 per window of $4 seconds (NULL: calendar month), key $5, estimate $6 (default $7), settled cost field $8; an operator's cap stands. Returns the cap in force, its source and when an operator set it.
--
-- The declared cap is the default: it is the cap in force unless an
-- operator set one (`joblane budgets set NAME --cap N`), which stands across
-- restarts until `joblane budgets reset NAME`.
INSERT INTO {schema}.budgets AS b
       (name, queue, cap, window_seconds, key_path, estimate_path, default_estimate, cost_field, updated_at,
        declared_cap, cap_source)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now(), $3, 'code')
ON CONFLICT (name) DO UPDATE
   SET queue = EXCLUDED.queue, window_seconds = EXCLUDED.window_seconds,
       key_path = EXCLUDED.key_path, estimate_path = EXCLUDED.estimate_path,
       default_estimate = EXCLUDED.default_estimate, cost_field = EXCLUDED.cost_field,
       declared_cap = EXCLUDED.declared_cap,
       cap = CASE WHEN b.cap_source = 'operator' THEN b.cap ELSE EXCLUDED.cap END,
       updated_at = now()
RETURNING b.name, b.cap, b.cap_source, b.cap_set_at;

-- name: upsert_budget
-- Create or replace budget $1 from the command line: queue $2, cap $3 per window of $4 seconds (NULL: calendar month), key $5, estimate $6 (default $7), settled cost field $8; the cap is an operator's.
INSERT INTO {schema}.budgets AS b
       (name, queue, cap, window_seconds, key_path, estimate_path, default_estimate, cost_field, updated_at,
        cap_source, cap_set_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now(), 'operator', now())
ON CONFLICT (name) DO UPDATE
   SET queue = EXCLUDED.queue, cap = EXCLUDED.cap, window_seconds = EXCLUDED.window_seconds,
       key_path = EXCLUDED.key_path, estimate_path = EXCLUDED.estimate_path,
       default_estimate = EXCLUDED.default_estimate, cost_field = EXCLUDED.cost_field,
       cap_source = 'operator', cap_set_at = now(), updated_at = now()
RETURNING b.name;

-- name: set_budget_cap
-- An operator sets the cap of budget $1 to $2 (raising it lets its waiting jobs start at the next claim); it stands over the declared cap until reset.
UPDATE {schema}.budgets
   SET cap = $2, cap_source = 'operator', cap_set_at = now(), updated_at = now()
 WHERE name = $1
RETURNING name;

-- name: reset_budget_cap
-- Drop the cap an operator set on budget $1: the cap its app declares is in force again; returns it (nothing when the budget has no declared cap).
UPDATE {schema}.budgets
   SET cap = declared_cap, cap_source = 'code', cap_set_at = NULL, updated_at = now()
 WHERE name = $1 AND declared_cap IS NOT NULL
RETURNING name, cap;

-- name: delete_budget
-- Remove budget $1 with its spend and holds; its queue goes back to the plain claim when it has no other budget.
WITH gone AS (
    DELETE FROM {schema}.budgets WHERE name = $1 RETURNING name
), usage AS (
    DELETE FROM {schema}.budget_usage WHERE budget = $1
), holds AS (
    DELETE FROM {schema}.budget_holds WHERE budget = $1
)
SELECT name FROM gone;

-- name: fold_budget_holds
-- Move the holds of queue $1's finished tries into budget_usage, each at the cost its try recorded (the budget's cost field, else job.settle's amount; a lean success's, noted on the hold; else its estimate); after lock_queue_claims.
--
-- A hold is in flight while its job is running the try that the claim
-- started (same started_at). Once it is not, the try's attempts row is the
-- latest worker row of that attempt number (a try given back or snoozed
-- keeps its number, but its next claim comes after this fold).
WITH b AS (
    SELECT name, cost_field FROM {schema}.budgets WHERE queue = $1
), finished AS (
    SELECT h.budget, h.key, h.window_start, h.job_id, h.started_at,
           coalesce((SELECT CASE WHEN jsonb_typeof(a.meta -> b.cost_field) = 'number'
                                 THEN greatest(0, (a.meta ->> b.cost_field)::float8)
                                 WHEN jsonb_typeof(a.meta -> 'settled_cost') = 'number'
                                 THEN greatest(0, (a.meta ->> 'settled_cost')::float8) END
                       FROM {schema}.attempts AS a
                      WHERE a.job_id = h.job_id AND a.attempt = h.attempt
                        AND a.outcome IN ('done', 'retry', 'snoozed', 'failed', 'held', 'lost')
                      ORDER BY a.id DESC
                      LIMIT 1), h.cost, h.estimate) AS spent
      FROM b
      JOIN {schema}.budget_holds AS h ON h.budget = b.name
     WHERE NOT EXISTS (SELECT 1 FROM {schema}.jobs AS j
                        WHERE j.id = h.job_id AND j.state = 'running' AND j.started_at = h.started_at)
), gone AS (
    DELETE FROM {schema}.budget_holds AS h
     USING finished AS f
     WHERE h.budget = f.budget AND h.job_id = f.job_id AND h.started_at = f.started_at
)
INSERT INTO {schema}.budget_usage AS u (budget, key, window_start, spent, tries)
SELECT budget, key, window_start, sum(spent), count(*) FROM finished GROUP BY 1, 2, 3
ON CONFLICT (budget, window_start, key) DO UPDATE
   SET spent = u.spent + EXCLUDED.spent, tries = u.tries + EXCLUDED.tries
RETURNING u.budget;

-- name: budget_spend
-- Every budget (or only those of pending job $1's queue, with that job's key) with each key's spend in its current window: settled, in flight, and the pending jobs it holds back at its cap.
WITH job AS (
    SELECT j.queue, j.payload FROM {schema}.jobs AS j WHERE j.id = $1
), b AS (
    SELECT bu.*,
           CASE WHEN bu.window_seconds IS NULL THEN date_trunc('month', now(), 'UTC')
                ELSE to_timestamp(floor(extract(epoch FROM now()) / bu.window_seconds) * bu.window_seconds)
           END AS ws,
           CASE WHEN bu.window_seconds IS NULL
                THEN (date_trunc('month', now(), 'UTC') AT TIME ZONE 'UTC' + interval '1 month') AT TIME ZONE 'UTC'
                ELSE to_timestamp((floor(extract(epoch FROM now()) / bu.window_seconds) + 1) * bu.window_seconds)
           END AS we
      FROM {schema}.budgets AS bu
     WHERE $1::bigint IS NULL OR bu.queue = (SELECT queue FROM job)
), k AS (
    SELECT u.budget, u.key, u.spent, 0::float8 AS in_flight
      FROM b JOIN {schema}.budget_usage AS u ON u.budget = b.name AND u.window_start = b.ws
    UNION ALL
    -- a hold whose try has finished but is not folded yet counts what the try cost, as the fold will
    SELECT h.budget, h.key,
           CASE WHEN r.running THEN 0 ELSE coalesce(settled.cost, h.cost, h.estimate) END,
           CASE WHEN r.running THEN h.estimate ELSE 0 END
      FROM b
      JOIN {schema}.budget_holds AS h ON h.budget = b.name AND h.window_start = b.ws
     CROSS JOIN LATERAL (
            SELECT EXISTS (SELECT 1 FROM {schema}.jobs AS j
                            WHERE j.id = h.job_id AND j.state = 'running' AND j.started_at = h.started_at) AS running
           ) AS r
      LEFT JOIN LATERAL (
            SELECT CASE WHEN jsonb_typeof(a.meta -> b.cost_field) = 'number'
                        THEN greatest(0, (a.meta ->> b.cost_field)::float8)
                        WHEN jsonb_typeof(a.meta -> 'settled_cost') = 'number'
                        THEN greatest(0, (a.meta ->> 'settled_cost')::float8) END AS cost
              FROM {schema}.attempts AS a
             WHERE NOT r.running AND a.job_id = h.job_id AND a.attempt = h.attempt
               AND a.outcome IN ('done', 'retry', 'snoozed', 'failed', 'held', 'lost')
             ORDER BY a.id DESC
             LIMIT 1
           ) AS settled ON true
), per_key AS (
    SELECT budget, key, sum(spent) AS spent, sum(in_flight) AS in_flight FROM k GROUP BY 1, 2
)
SELECT b.name, b.queue, b.cap, b.window_seconds, array_to_string(b.key_path, '.') AS key_field,
       array_to_string(b.estimate_path, '.') AS estimate_field, b.default_estimate, b.cost_field, b.ws, b.we,
       b.cap_source, b.declared_cap, b.cap_set_at, p.key, coalesce(p.spent, 0) AS spent, coalesce(p.in_flight, 0) AS in_flight,
       CASE WHEN coalesce(p.spent, 0) + coalesce(p.in_flight, 0) >= b.cap
            THEN (SELECT count(*) FROM {schema}.jobs AS j
                   WHERE j.state = 'pending' AND hashtext(j.queue) = hashtext(b.queue) AND j.queue = b.queue
                     AND coalesce(j.payload #>> b.key_path, '') = p.key)
            ELSE 0 END AS waiting
  FROM b
  LEFT JOIN per_key AS p ON p.budget = b.name
 WHERE $1::bigint IS NULL OR p.key = coalesce((SELECT payload FROM job) #>> b.key_path, '')
 ORDER BY b.name, p.key;

-- name: settle_lean_costs
-- Note what the lean successes $1 (a JSON array of {id, attempt, meta}) cost on their budget holds (each budget's cost field, else job.settle's amount) and their queue_starts rows (job.settle's amount); before delete_done.
--
-- A lean success writes no attempts row, where the fold and the limited
-- claim read a try's cost; without this note both would count its estimate.
-- queue_starts holds the starts of one window per limited queue.
WITH o AS (
    SELECT * FROM jsonb_to_recordset($1::text::jsonb) AS o(id bigint, attempt int, meta jsonb)
), starts AS (
    UPDATE {schema}.queue_starts AS s
       SET cost = greatest(0, (o.meta ->> 'settled_cost')::float8)
      FROM o
     WHERE s.job_id = o.id AND s.attempt = o.attempt AND jsonb_typeof(o.meta -> 'settled_cost') = 'number'
)
UPDATE {schema}.budget_holds AS h
   SET cost = CASE WHEN jsonb_typeof(o.meta -> b.cost_field) = 'number'
                   THEN greatest(0, (o.meta ->> b.cost_field)::float8)
                   ELSE greatest(0, (o.meta ->> 'settled_cost')::float8) END
  FROM o, {schema}.budgets AS b
 WHERE h.job_id = o.id AND h.attempt = o.attempt AND b.name = h.budget
   AND (jsonb_typeof(o.meta -> b.cost_field) = 'number' OR jsonb_typeof(o.meta -> 'settled_cost') = 'number')
RETURNING h.job_id;

-- name: prune_budget_usage
-- Delete up to $1 rows of budget_usage whose window ended longer ago than the longest window in use (a month counts 31 days); returns how many.
--
-- The claim and `joblane budgets` read only each budget's current window;
-- ended windows are kept as long as the longest window in use, so that
-- yesterday's spend of a daily cap can still be read beside today's. A row
-- whose budget is gone is kept the longest window from its start. Each budget's old
-- windows are a range of the primary key (budget, window_start, key).
WITH longest AS (
    SELECT coalesce(max(coalesce(window_seconds, 31 * 86400.0)), 0) AS seconds FROM {schema}.budgets
), doomed AS (
    SELECT u.budget, u.window_start, u.key
      FROM {schema}.budget_usage AS u
     CROSS JOIN longest
      LEFT JOIN {schema}.budgets AS b ON b.name = u.budget
     WHERE u.window_start < now() - make_interval(secs => longest.seconds + CASE
                                                          WHEN b.name IS NULL THEN 0  -- its window is unknown
                                                          ELSE coalesce(b.window_seconds, 31 * 86400.0) END)
     LIMIT $1
), gone AS (
    DELETE FROM {schema}.budget_usage AS u
     USING doomed AS d
     WHERE u.budget = d.budget AND u.window_start = d.window_start AND u.key = d.key
    RETURNING 1
)
SELECT count(*) FROM gone;

-- name: prune_step_cache
-- Delete up to $1 cached results past their expiry and claims on a key that ran out an hour ago or more (their job died); returns how many.
--
-- A claim that ran out may still be filled by its job (a call slower than
-- the claim), unless another job took the key over: it is left an hour.
WITH doomed AS (
    (SELECT key FROM {schema}.step_cache
      WHERE state = 'done' AND expires_at <= now()
      ORDER BY expires_at
      LIMIT $1)
    UNION ALL
    (SELECT key FROM {schema}.step_cache
      WHERE state = 'running' AND claimed_until <= now() - interval '1 hour'
      ORDER BY claimed_until
      LIMIT $1)
), gone AS (
    -- the conditions again: a key claimed or filled anew meanwhile stays
    DELETE FROM {schema}.step_cache AS c
     WHERE c.key = ANY(ARRAY(SELECT key FROM doomed))
       AND ((c.state = 'done' AND c.expires_at <= now())
            OR (c.state = 'running' AND c.claimed_until <= now() - interval '1 hour'))
    RETURNING 1
)
SELECT count(*) FROM gone;

-- name: ai_table_health
-- What the pruner has left in the AI tables: cached results (expired among them) and claims, budget windows (those due among them).
SELECT (SELECT count(*) FROM {schema}.step_cache WHERE state = 'done') AS cache_results,
       (SELECT count(*) FROM {schema}.step_cache WHERE state = 'done' AND expires_at <= now()) AS cache_expired,
       (SELECT count(*) FROM {schema}.step_cache
         WHERE state = 'running' AND claimed_until <= now() - interval '1 hour') AS cache_lost_claims,
       (SELECT min(expires_at) FROM {schema}.step_cache WHERE state = 'done') AS cache_oldest_expiry,
       (SELECT count(*) FROM {schema}.budget_usage) AS budget_windows,
       (SELECT count(*)
          FROM {schema}.budget_usage AS u
         CROSS JOIN (SELECT coalesce(max(coalesce(window_seconds, 31 * 86400.0)), 0) AS seconds
                       FROM {schema}.budgets) AS longest
          LEFT JOIN {schema}.budgets AS b ON b.name = u.budget
         WHERE u.window_start < now() - make_interval(secs => longest.seconds + CASE
                                                              WHEN b.name IS NULL THEN 0
                                                              ELSE coalesce(b.window_seconds, 31 * 86400.0) END)
       ) AS budget_windows_due;

-- name: cache_claim
-- Claim cache key $1 (step $2) for job $3's attempt $4 for $5 seconds: a new key, an expired result, a claim that ran out or one of an earlier try of this job; returns the key when this job is to make the call.
--
-- The primary key makes two racing jobs agree: one inserts the claim, the
-- other finds the row and waits for its result (cache_hit) or for the claim
-- to run out.
INSERT INTO {schema}.step_cache AS c (key, step, state, job_id, attempt, claimed_until)
VALUES ($1, $2, 'running', $3, $4, now() + make_interval(secs => $5::float8))
ON CONFLICT (key) DO UPDATE
   SET step = EXCLUDED.step, state = 'running', result = NULL, meta = NULL, job_id = EXCLUDED.job_id,
       attempt = EXCLUDED.attempt, claimed_until = EXCLUDED.claimed_until, created_at = now(),
       expires_at = NULL, hits = 0, last_hit_at = NULL
 WHERE (c.state = 'done' AND c.expires_at <= now())
    OR (c.state = 'running' AND (c.claimed_until <= now()
                                 -- an earlier try of the same job (its worker was lost): this try takes over
                                 OR (c.job_id = EXCLUDED.job_id AND c.attempt < EXCLUDED.attempt)))
RETURNING c.key;

-- name: cache_hit
-- The stored result of cache key $1 (result and meta as JSON text), counted as a hit; nothing while it is claimed or expired.
UPDATE {schema}.step_cache
   SET hits = hits + 1, last_hit_at = now()
 WHERE key = $1 AND state = 'done' AND expires_at > now()
RETURNING result::text, meta::text;

-- name: cache_fill
-- Store result $4 and meta $5 under cache key $1 claimed by job $2's attempt $3, kept for $6 seconds (NULL: until cleared).
UPDATE {schema}.step_cache
   SET state = 'done', result = $4::text::jsonb, meta = $5::text::jsonb, claimed_until = NULL,
       expires_at = CASE WHEN $6::float8 IS NULL THEN 'infinity'::timestamptz
                         ELSE now() + make_interval(secs => $6::float8) END
 WHERE key = $1 AND state = 'running' AND job_id = $2 AND attempt = $3
RETURNING key;

-- name: cache_release
-- Give up the claim of job $2's attempt $3 on cache key $1 (its call failed), so a waiting job can make it.
DELETE FROM {schema}.step_cache WHERE key = $1 AND state = 'running' AND job_id = $2 AND attempt = $3 RETURNING key;

-- name: cache_stats
-- Per step: stored results, claims in progress, hits, and the tokens and cost the hits saved (each hit saves what the call cost).
SELECT step,
       count(*) FILTER (WHERE state = 'done' AND expires_at > now()) AS entries,
       count(*) FILTER (WHERE state = 'done' AND expires_at <= now()) AS expired,
       count(*) FILTER (WHERE state = 'running') AS calls_in_progress,
       coalesce(sum(hits), 0)::bigint AS hits,
       coalesce(sum(hits * CASE WHEN jsonb_typeof(meta -> 'tokens') = 'number'
                                THEN (meta ->> 'tokens')::float8 ELSE 0 END), 0) AS tokens_saved,
       coalesce(sum(hits * CASE WHEN jsonb_typeof(meta -> 'cost') = 'number'
                                THEN (meta ->> 'cost')::float8 ELSE 0 END), 0) AS cost_saved,
       min(created_at) AS oldest, max(last_hit_at) AS last_hit
  FROM {schema}.step_cache
 GROUP BY step
 ORDER BY step;

-- name: cache_clear
-- Delete the cached results of step $2 (NULL: every step) stored before $1 (NULL: all), and expired ones; claims in progress stay. Returns how many.
WITH gone AS (
    DELETE FROM {schema}.step_cache
     WHERE state = 'done'
       AND ($2::text IS NULL OR step = $2)
       AND ($1::timestamptz IS NULL OR created_at < $1 OR expires_at <= now())
    RETURNING key
)
SELECT count(*) FROM gone;

-- name: dataset_rows
-- One record per finished try of kind $1, queue $2, finished in [$3, $4), oldest first: input, output, steps, model, prompt version, tokens, cost, latency, outcome, and the review label.
--
-- Read through a server-side cursor (store.stream), so any number of rows
-- stream in pages; like export_attempts, the time range walks
-- attempts_finished in order and each row finds its job by primary key. A
-- try's review label is the person's decision on it (released or rejected
-- with the same attempt number); admin rows (released, rejected, cancelled)
-- are not tries.
--
-- The job's payload is what its latest try saw: a reviewer's edit
-- (release with a patch) changes it in place. "edits" lists the edits made
-- at or after this try, newest first, each with the values it replaced, so
-- the caller (admin.dataset) undoes them and the record holds the input this
-- try ran on.
SELECT a.id AS attempt_id, a.job_id, j.kind, j.queue, a.attempt, a.outcome, a.started_at, a.finished_at,
       round((extract(epoch FROM a.finished_at - a.started_at) * 1000)::numeric, 1)::float8 AS latency_ms,
       a.meta ->> 'model' AS model, a.meta ->> 'prompt_version' AS prompt_version,
       CASE WHEN jsonb_typeof(a.meta -> 'tokens') = 'number' THEN (a.meta ->> 'tokens')::float8
            WHEN jsonb_typeof(a.meta -> 'input_tokens') = 'number' OR jsonb_typeof(a.meta -> 'output_tokens') = 'number'
                 THEN coalesce((a.meta ->> 'input_tokens')::float8, 0) + coalesce((a.meta ->> 'output_tokens')::float8, 0)
       END AS tokens,
       CASE WHEN jsonb_typeof(a.meta -> 'cost') = 'number' THEN (a.meta ->> 'cost')::float8 END AS cost,
       a.error, j.payload::text AS input,
       (CASE WHEN a.outcome = 'done' THEN j.result WHEN a.outcome = 'held' THEN a.meta -> 'hold_data' END)::text AS output,
       (SELECT jsonb_object_agg(s.name, s.result)
          FROM {schema}.job_steps AS s
         WHERE s.job_id = a.job_id AND s.attempt <= a.attempt)::text AS steps,
       r.label, r.worker AS reviewer, r.started_at AS reviewed_at, r.error AS review_note,
       (r.meta -> 'payload_patch')::text AS review_edit,
       j.replay_of, j.replay_tag,
       (SELECT jsonb_agg(jsonb_build_object('patch', e.meta -> 'payload_patch', 'before', e.meta -> 'payload_before')
                         ORDER BY e.id DESC)
          FROM {schema}.attempts AS e
         WHERE e.job_id = a.job_id AND e.attempt >= a.attempt AND e.outcome = 'released'
           AND e.meta ? 'payload_patch')::text AS edits
  FROM {schema}.attempts AS a
  JOIN {schema}.jobs AS j ON j.id = a.job_id
  LEFT JOIN LATERAL (
        SELECT coalesce(x.meta ->> 'label',
                        CASE WHEN x.outcome = 'rejected' THEN 'reject'
                             WHEN x.meta ? 'payload_patch' THEN 'approve_edited' ELSE 'approve' END) AS label,
               x.worker, x.started_at, x.error, x.meta
          FROM {schema}.attempts AS x
         WHERE x.job_id = a.job_id AND x.attempt = a.attempt AND x.outcome IN ('released', 'rejected')
         ORDER BY x.id
         LIMIT 1
       ) AS r ON a.outcome = 'held'
 WHERE a.outcome IN ('done', 'retry', 'snoozed', 'failed', 'held', 'lost')
   AND ($1::text IS NULL OR j.kind = $1)
   AND ($2::text IS NULL OR j.queue = $2)
   AND ($3::timestamptz IS NULL OR a.finished_at >= $3)
   AND ($4::timestamptz IS NULL OR a.finished_at < $4)
 ORDER BY a.finished_at, a.id;

-- name: compare_replay
-- The replays tagged $1, oldest first, each beside its original: states, results, tries, whether a try was held, and the cost and time their tries recorded.
WITH pairs AS (
    SELECT r.id AS replay_id, r.replay_of AS original_id
      FROM {schema}.jobs AS r
     WHERE r.replay_tag = $1
), tries AS (
    SELECT a.job_id,
           count(*) AS tries,
           bool_or(a.outcome = 'held') AS held,
           sum(CASE WHEN jsonb_typeof(a.meta -> 'cost') = 'number' THEN (a.meta ->> 'cost')::float8 END) AS cost,
           sum(extract(epoch FROM a.finished_at - a.started_at) * 1000)::float8 AS latency_ms
      FROM {schema}.attempts AS a
     WHERE a.job_id = ANY(ARRAY(SELECT replay_id FROM pairs UNION ALL SELECT original_id FROM pairs))
       AND a.outcome IN ('done', 'retry', 'snoozed', 'failed', 'held', 'lost')
     GROUP BY a.job_id
)
SELECT p.original_id, o.kind, o.state AS original_state, o.result::text AS original_result,
       coalesce(ot.tries, 0) AS original_tries, coalesce(ot.held, false) AS original_held,
       ot.cost AS original_cost, ot.latency_ms AS original_latency_ms,
       p.replay_id, r.state AS replay_state, r.result::text AS replay_result,
       coalesce(rt.tries, 0) AS replay_tries, coalesce(rt.held, false) AS replay_held,
       rt.cost AS replay_cost, rt.latency_ms AS replay_latency_ms,
       (o.state = 'done' AND r.state = 'done' AND o.result IS DISTINCT FROM r.result) AS changed
  FROM pairs AS p
  JOIN {schema}.jobs AS r ON r.id = p.replay_id
  LEFT JOIN {schema}.jobs AS o ON o.id = p.original_id
  LEFT JOIN tries AS ot ON ot.job_id = p.original_id
  LEFT JOIN tries AS rt ON rt.job_id = p.replay_id
 ORDER BY p.replay_id;

-- name: replay_tags
-- The replay tags in use, newest first (at most $1): how many jobs each tagged and when.
SELECT replay_tag AS tag, count(*) AS jobs, min(created_at) AS first_at, max(created_at) AS last_at
  FROM {schema}.jobs
 WHERE replay_tag IS NOT NULL
 GROUP BY replay_tag
 ORDER BY last_at DESC
 LIMIT $1;
