-- Named queries of queue rate limits and pauses (ratelimit.py).
-- {schema} is the validated, quoted schema name; every value is a $n parameter.
--
-- A queue with limits, budgets (sql/ai.sql) or both is claimed in one short
-- transaction per claim: lock_queue_claims, fold_budget_holds when it has
-- budgets, then claim_jobs_limited. The lock serialises these claims of one
-- queue across every worker and host, and the claim runs as a later
-- statement so that its snapshot sees every start the previous lock holder
-- committed (one statement keeps the snapshot it began with, even after
-- waiting for a lock). Queues with neither never come here: they keep
-- claim_jobs.

-- name: upsert_queue_limit
-- Create or replace the limits of queue $1.
INSERT INTO {schema}.queue_limits AS l
       (queue, max_starts, starts_interval, concurrency, max_cost, cost_interval,
        cost_path, default_cost, key_path, per_key, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, now())
ON CONFLICT (queue) DO UPDATE
   SET max_starts = EXCLUDED.max_starts, starts_interval = EXCLUDED.starts_interval,
       concurrency = EXCLUDED.concurrency, max_cost = EXCLUDED.max_cost,
       cost_interval = EXCLUDED.cost_interval, cost_path = EXCLUDED.cost_path,
       default_cost = EXCLUDED.default_cost, key_path = EXCLUDED.key_path,
       per_key = EXCLUDED.per_key, updated_at = now()
RETURNING l.queue;

-- name: delete_queue_limit
-- Remove the limits of queue $1 and its start log; its jobs go back to the plain claim.
WITH gone AS (
    DELETE FROM {schema}.queue_limits WHERE queue = $1 RETURNING queue
), log AS (
    DELETE FROM {schema}.queue_starts WHERE queue = $1
)
SELECT queue FROM gone;

-- name: pause_queue
-- Pause queue $1 for $2 seconds with reason $3, never shortening a longer pause; returns the end of the pause.
INSERT INTO {schema}.queue_pauses AS p (queue, until, reason)
VALUES ($1, now() + make_interval(secs => $2::float8), $3)
ON CONFLICT (queue) DO UPDATE
   SET until = greatest(p.until, EXCLUDED.until),
       reason = CASE WHEN EXCLUDED.until >= p.until THEN EXCLUDED.reason ELSE p.reason END
RETURNING p.until;

-- name: resume_queue
-- End the pause of queue $1 now.
DELETE FROM {schema}.queue_pauses WHERE queue = $1 RETURNING queue;

-- name: queue_controls
-- Which of the queues $1 have limits, which have budgets, and for how many more seconds each paused one stays paused.
SELECT queue, 'limit' AS control, NULL::float8 AS paused_for
  FROM {schema}.queue_limits
 WHERE queue = ANY($1::text[])
UNION ALL
SELECT DISTINCT queue, 'budget', NULL::float8
  FROM {schema}.budgets
 WHERE queue = ANY($1::text[])
UNION ALL
SELECT queue, 'pause', extract(epoch FROM until - now())::float8
  FROM {schema}.queue_pauses
 WHERE queue = ANY($1::text[]) AND until > now();

-- name: lock_queue_claims
-- Serialise the limited and budgeted claims of one queue (advisory key $1, from the schema and the queue) until the end of the transaction.
--
-- An advisory lock rather than the rows of queue_limits or budgets: a queue
-- may have either or both, and every claim of it must take the same lock.
-- Changing a cap or a limit does not wait for claims.
SELECT pg_advisory_xact_lock($1::bigint);

-- name: claim_jobs_limited
-- Claim up to $2 ready jobs of queue $1 for worker $3 (lease $4 s) within its limits and its budgets' caps; after lock_queue_claims (and fold_budget_holds).
--
-- Its rows start with the columns of claim_jobs, in the same order.
--
-- Limits (queue_limits, none when the queue has no row): starts and costs
-- are counted in a sliding window from queue_starts, so no window of
-- starts_interval seconds ever holds more than max_starts starts. A start
-- reserves the job's estimate; once its try has finished, a cost the task
-- settled (job.settle, kept in attempts.meta) replaces the estimate.
-- Concurrency and per-key counts read the running jobs themselves, so a
-- finished, rescued or cancelled job frees its slot with no bookkeeping.
--
-- Budgets (budgets, none or several): a key's spend is its settled spend in
-- the budget's current window (budget_usage) plus the estimates of its tries
-- in flight (budget_holds); a job starts while its key's spend, with the
-- estimates of the jobs admitted before it in this claim, is below the cap,
-- so a cap is exceeded by at most the estimates in flight (and by what a try
-- costs beyond its estimate). Keys at their cap are left out of the walk of
-- jobs_ready, so they do not hide the jobs of other keys.
--
-- Candidates are read in claim order without locks (the queue's lock keeps
-- other limited claims out) and only the chosen rows are locked. A job must
-- pass per-key fairness, then every budget, then the room left by the start
-- rate and concurrency; a weighted limit takes the longest prefix that fits,
-- so a large job is not starved by small ones behind it, and a job larger
-- than the whole weighted limit may start alone in an empty window. The last
-- column says in how many seconds a window, a budget's window or the pause
-- frees up (NULL: when a running job finishes); with nothing claimed, one
-- row of NULL jobs carries it.
WITH lim AS MATERIALIZED (
    -- one row whether or not the queue has limits: NULL limits bound nothing (least() skips NULLs)
    SELECT l.max_starts, l.concurrency, l.max_cost, l.cost_path, l.default_cost,
           l.key_path, l.per_key, t.t,
           make_interval(secs => l.starts_interval) AS starts_window,
           make_interval(secs => l.cost_interval) AS cost_window
      FROM (SELECT clock_timestamp() AS t) AS t
      LEFT JOIN {schema}.queue_limits AS l ON l.queue = $1
), bud AS MATERIALIZED (
    SELECT bu.name, bu.cap, bu.key_path, bu.estimate_path, bu.default_estimate,
           CASE WHEN bu.window_seconds IS NULL THEN date_trunc('month', lim.t, 'UTC')
                ELSE to_timestamp(floor(extract(epoch FROM lim.t) / bu.window_seconds) * bu.window_seconds)
           END AS ws,
           CASE WHEN bu.window_seconds IS NULL
                THEN (date_trunc('month', lim.t, 'UTC') AT TIME ZONE 'UTC' + interval '1 month') AT TIME ZONE 'UTC'
                ELSE to_timestamp((floor(extract(epoch FROM lim.t) / bu.window_seconds) + 1) * bu.window_seconds)
           END AS we
      FROM {schema}.budgets AS bu, lim
     WHERE bu.queue = $1
), spent AS MATERIALIZED (
    SELECT k.budget AS name, k.key, sum(k.amount) AS used
      FROM (SELECT u.budget, u.key, u.spent AS amount
              FROM bud JOIN {schema}.budget_usage AS u ON u.budget = bud.name AND u.window_start = bud.ws
            UNION ALL
            SELECT h.budget, h.key, h.estimate
              FROM bud JOIN {schema}.budget_holds AS h ON h.budget = bud.name AND h.window_start = bud.ws) AS k
     GROUP BY 1, 2
), blocked AS MATERIALIZED (
    SELECT b.name, b.key_path, s.key, b.we
      FROM bud AS b JOIN spent AS s ON s.name = b.name
     WHERE s.used >= b.cap
), paused AS MATERIALIZED (
    SELECT max(p.until) AS until
      FROM {schema}.queue_pauses AS p, lim
     WHERE p.queue = $1 AND p.until > lim.t
), recent AS MATERIALIZED (
    SELECT s.started_at,
           s.started_at > lim.t - lim.starts_window AS in_starts,
           s.started_at > lim.t - lim.cost_window AS in_cost,
           coalesce(settled.cost, s.cost) AS cost
      FROM lim
      JOIN {schema}.queue_starts AS s
        ON s.queue = $1 AND s.started_at > lim.t - greatest(lim.starts_window, lim.cost_window)
      LEFT JOIN LATERAL (
            SELECT greatest(0, (a.meta->>'settled_cost')::float8) AS cost
              FROM {schema}.attempts AS a
             WHERE lim.max_cost IS NOT NULL
               AND a.job_id = s.job_id AND a.attempt = s.attempt
               AND jsonb_typeof(a.meta->'settled_cost') = 'number'
             LIMIT 1
           ) AS settled ON true
), room AS MATERIALIZED (
    SELECT lim.*, used.*, paused.until AS paused_until,
           CASE WHEN paused.until IS NOT NULL THEN 0
                ELSE greatest(0, least($2::int,
                                       lim.max_starts - used.used_starts,
                                       CASE WHEN lim.concurrency IS NOT NULL
                                            THEN lim.concurrency - (SELECT count(*)
                                                                      FROM {schema}.jobs AS r
                                                                     WHERE r.state = 'running' AND r.queue = $1)
                                       END))
           END AS room,
           lim.max_cost - used.used_cost AS cost_room,
           EXISTS (SELECT 1 FROM bud) AS budgeted
      FROM lim, paused,
           (SELECT count(*) FILTER (WHERE in_starts) AS used_starts,
                   min(started_at) FILTER (WHERE in_starts) AS oldest_start,
                   coalesce(sum(cost) FILTER (WHERE in_cost), 0) AS used_cost,
                   min(started_at) FILTER (WHERE in_cost AND cost > 0) AS oldest_cost
              FROM recent) AS used
), key_running AS (
    SELECT r.payload #>> b.key_path AS key, count(*) AS n
      FROM room AS b
      JOIN {schema}.jobs AS r ON r.state = 'running' AND r.queue = $1
     WHERE b.per_key IS NOT NULL AND b.room > 0
     GROUP BY 1
), candidates AS (
    -- walks jobs_ready like claim_jobs, passing over the keys at a budget's cap; deeper when per-key
    -- fairness may pass over the jobs of keys at their limit (a key that reaches its cap within this
    -- claim leaves the claim short: the next one passes over it from the start)
    SELECT j.id, j.priority, j.run_after,
           CASE WHEN b.budgeted THEN j.payload END AS payload,  -- carried on only for the caps
           CASE WHEN b.key_path IS NOT NULL THEN j.payload #>> b.key_path END AS key,
           CASE WHEN b.max_cost IS NULL THEN 0
                WHEN jsonb_typeof(j.payload #> b.cost_path) = 'number'
                     THEN greatest(0, (j.payload #>> b.cost_path)::float8)
                ELSE b.default_cost END AS cost
      FROM room AS b
     CROSS JOIN LATERAL (
            SELECT c.id, c.priority, c.run_after, c.payload
              FROM {schema}.jobs AS c
             WHERE c.state = 'pending' AND hashtext(c.queue) = hashtext($1) AND c.queue = $1
               AND c.run_after <= now()
               AND (NOT b.budgeted
                    OR NOT EXISTS (SELECT 1 FROM blocked AS x WHERE coalesce(c.payload #>> x.key_path, '') = x.key))
             ORDER BY c.priority, c.run_after, c.id
             LIMIT CASE WHEN b.per_key IS NULL THEN b.room ELSE greatest(b.room * 20, 500) END
           ) AS j
     WHERE b.room > 0
), keyed AS MATERIALIZED (
    -- per-key fairness: at most per_key running per key, with the ones chosen before in this claim
    SELECT e.*
      FROM (SELECT c.*, row_number() OVER (PARTITION BY c.key ORDER BY c.priority, c.run_after, c.id) AS key_rank
              FROM candidates AS c) AS e
     CROSS JOIN room AS b
      LEFT JOIN key_running AS k ON k.key = e.key
     WHERE b.per_key IS NULL OR e.key IS NULL OR e.key_rank + coalesce(k.n, 0) <= b.per_key
), per_budget AS MATERIALIZED (
    -- each admitted candidate under each budget of the queue: its key and the estimate it reserves
    SELECT e.id, e.priority, e.run_after, x.name, x.cap, x.ws, x.we,
           coalesce(e.payload #>> x.key_path, '') AS key,
           CASE WHEN jsonb_typeof(e.payload #> x.estimate_path) = 'number'
                THEN greatest(0, (e.payload #>> x.estimate_path)::float8)
                ELSE x.default_estimate END AS estimate
      FROM keyed AS e CROSS JOIN bud AS x
), over_cap AS MATERIALIZED (
    -- jobs whose key, with the estimates of the jobs before it in this claim, has reached a cap
    SELECT p.id, p.we
      FROM (SELECT p.id, p.we, p.cap,
                   coalesce(s.used, 0) + coalesce(sum(p.estimate) OVER (
                       PARTITION BY p.name, p.key ORDER BY p.priority, p.run_after, p.id
                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before
              FROM per_budget AS p
              LEFT JOIN spent AS s ON s.name = p.name AND s.key = p.key) AS p
     WHERE p.before >= p.cap
), fitted AS (
    SELECT e.id, e.cost,
           row_number() OVER w AS rank,
           sum(e.cost) OVER w AS cum_cost
      FROM keyed AS e
     WHERE NOT EXISTS (SELECT 1 FROM over_cap AS o WHERE o.id = e.id)
    WINDOW w AS (ORDER BY e.priority, e.run_after, e.id ROWS UNBOUNDED PRECEDING)
), chosen AS (
    SELECT f.id, f.cost
      FROM fitted AS f, room AS b
     WHERE f.rank <= b.room
       AND (b.max_cost IS NULL OR f.cum_cost <= b.cost_room OR (f.rank = 1 AND b.used_cost = 0))
), locked AS (
    SELECT j.id
      FROM {schema}.jobs AS j
     WHERE j.id = ANY(ARRAY(SELECT id FROM chosen)) AND j.state = 'pending'
       FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE {schema}.jobs AS j
       SET state = 'running',
           attempts = j.attempts + 1,
           worker = $3,
           lease_until = now() + make_interval(secs => $4::float8),
           started_at = now()
     WHERE j.id = ANY(ARRAY(SELECT id FROM locked))
 RETURNING j.id, j.queue, j.kind, j.payload::text AS payload, j.attempts, j.max_attempts,
           j.priority, j.created_at, j.replay_of, j.headers::text AS headers
), logged AS (
    -- the start log only when the queue has limits (starts_window is NULL without a queue_limits row)
    INSERT INTO {schema}.queue_starts (queue, started_at, job_id, attempt, cost)
    SELECT $1, b.t, c.id, c.attempts, ch.cost
      FROM claimed AS c
      JOIN chosen AS ch ON ch.id = c.id
     CROSS JOIN room AS b
     WHERE b.starts_window IS NOT NULL
), held AS (
    INSERT INTO {schema}.budget_holds (budget, key, window_start, job_id, attempt, started_at, estimate)
    SELECT p.name, p.key, p.ws, c.id, c.attempts, now(), p.estimate
      FROM claimed AS c
      JOIN per_budget AS p ON p.id = c.id
    ON CONFLICT DO NOTHING
), pruned AS (
    DELETE FROM {schema}.queue_starts AS s
     USING lim
     WHERE s.queue = $1 AND s.started_at <= lim.t - greatest(lim.starts_window, lim.cost_window)
)
SELECT c.id, c.queue, c.kind, c.payload, c.attempts, c.max_attempts, c.priority, c.created_at, c.replay_of,
       c.headers,
       extract(epoch FROM least(
           CASE WHEN b.max_starts IS NOT NULL THEN coalesce(b.oldest_start, b.t) + b.starts_window END,
           CASE WHEN b.max_cost IS NOT NULL THEN coalesce(b.oldest_cost, b.t) + b.cost_window END,
           b.paused_until,
           (SELECT min(we) FROM blocked),
           (SELECT min(we) FROM over_cap)) - b.t)::float8 AS retry_in
  FROM room AS b
  LEFT JOIN claimed AS c ON true;

-- name: queue_limits_status
-- Every queue with limits or a pause: its limits, the pause, running jobs, and the starts and cost in its current windows.
SELECT q.queue, l.max_starts, l.starts_interval, l.concurrency, l.max_cost, l.cost_interval,
       array_to_string(l.cost_path, '.') AS cost_field, l.default_cost,
       array_to_string(l.key_path, '.') AS key_field, l.per_key,
       p.until AS paused_until, p.reason AS pause_reason,
       (SELECT count(*) FROM {schema}.jobs AS r WHERE r.state = 'running' AND r.queue = q.queue) AS running,
       (SELECT count(*) FROM {schema}.queue_starts AS s
         WHERE s.queue = q.queue AND s.started_at > now() - make_interval(secs => l.starts_interval)) AS starts,
       (SELECT coalesce(sum(coalesce(
                   (SELECT greatest(0, (a.meta->>'settled_cost')::float8)
                      FROM {schema}.attempts AS a
                     WHERE a.job_id = s.job_id AND a.attempt = s.attempt
                       AND jsonb_typeof(a.meta->'settled_cost') = 'number'
                     LIMIT 1), s.cost)), 0)
          FROM {schema}.queue_starts AS s
         WHERE s.queue = q.queue AND s.started_at > now() - make_interval(secs => l.cost_interval)) AS cost
  FROM (SELECT queue FROM {schema}.queue_limits
        UNION
        SELECT queue FROM {schema}.queue_pauses WHERE until > now()) AS q
  LEFT JOIN {schema}.queue_limits AS l ON l.queue = q.queue
  LEFT JOIN {schema}.queue_pauses AS p ON p.queue = q.queue AND p.until > now()
 ORDER BY q.queue;

-- name: job_queue_holds
-- What of pending job $1's queue may hold it back: the pause (until, reason) and each limit beside what is in use now (starts and cost in their windows, running, running of the job's key, the job's estimate).
WITH job AS (
    SELECT j.queue, j.payload FROM {schema}.jobs AS j WHERE j.id = $1 AND j.state = 'pending'
)
SELECT p.until AS paused_until, p.reason AS pause_reason,
       l.max_starts, l.starts_interval, l.concurrency, l.max_cost, l.cost_interval, l.per_key,
       array_to_string(l.key_path, '.') AS key_field, job.payload #>> l.key_path AS key,
       CASE WHEN l.max_starts IS NOT NULL THEN
           (SELECT count(*) FROM {schema}.queue_starts AS s
             WHERE s.queue = job.queue AND s.started_at > now() - make_interval(secs => l.starts_interval)) END AS starts,
       CASE WHEN l.concurrency IS NOT NULL THEN
           (SELECT count(*) FROM {schema}.jobs AS r WHERE r.state = 'running' AND r.queue = job.queue) END AS running,
       CASE WHEN l.per_key IS NOT NULL THEN
           (SELECT count(*) FROM {schema}.jobs AS r
             WHERE r.state = 'running' AND r.queue = job.queue
               AND r.payload #>> l.key_path = job.payload #>> l.key_path) END AS key_running,
       CASE WHEN l.max_cost IS NOT NULL THEN
           (SELECT coalesce(sum(coalesce(
                       (SELECT greatest(0, (a.meta->>'settled_cost')::float8)
                          FROM {schema}.attempts AS a
                         WHERE a.job_id = s.job_id AND a.attempt = s.attempt
                           AND jsonb_typeof(a.meta->'settled_cost') = 'number'
                         LIMIT 1), s.cost)), 0)
              FROM {schema}.queue_starts AS s
             WHERE s.queue = job.queue AND s.started_at > now() - make_interval(secs => l.cost_interval)) END AS cost,
       CASE WHEN jsonb_typeof(job.payload #> l.cost_path) = 'number'
            THEN greatest(0, (job.payload #>> l.cost_path)::float8) ELSE l.default_cost END AS estimate
  FROM job
  LEFT JOIN {schema}.queue_limits AS l ON l.queue = job.queue
  LEFT JOIN {schema}.queue_pauses AS p ON p.queue = job.queue AND p.until > now();
