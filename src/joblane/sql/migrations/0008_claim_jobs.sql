-- joblane schema, version 8: claim_jobs, the claim of the worker's producer.
--
-- The claim used to be sent as a statement. On a direct connection asyncpg
-- prepares it, but PostgreSQL planned it again on every execution: its
-- generic plan, costed for a LIMIT it cannot see (it assumes a tenth of the
-- queue), never looked cheaper than a custom one, so every claim paid about
-- 0.2 ms of planning. Behind PgBouncer, with no prepared statements, it was
-- planned every time anyway. This function runs the same statement with
-- plan_cache_mode = force_generic_plan: its plan is made once per session on
-- the server and kept, on a direct connection and behind PgBouncer alike.
-- Measured alone on a claim of 20 jobs: 1.09 -> 0.88 ms; of 1 job: 0.53 ->
-- 0.39 ms; of 200: 2.55 -> 2.38 ms. The generic plan is the one the custom
-- plans chose (tests/test_schema.py checks it with a million jobs waiting).
--
-- The statement: one LATERAL probe per queue walks jobs_ready (queue,
-- priority, run_after, id) in order and stops after p_limit rows, so the cost
-- does not grow with the number of waiting jobs; a single "queue = ANY(...)"
-- scan would have to sort them all. The CTE is evaluated exactly once, so the
-- rows locked are the rows updated. Rows locked by the probes but cut by the
-- outer LIMIT are released at commit. The update finds its rows through
-- "id = ANY(ARRAY(...))", an index scan on the primary key; joining the CTE
-- instead lets the planner hash the whole table (a sequential scan per claim
-- once the table is large).
--
-- It runs with the caller's privileges (no SECURITY DEFINER): it claims only
-- what the caller could claim with its own statement (`joblane grants --role
-- worker`), so EXECUTE stays granted to PUBLIC, and a worker role granted
-- before this version keeps claiming after the upgrade.
CREATE FUNCTION {schema}.claim_jobs(p_queues text[], p_limit integer, p_worker text, p_lease_seconds double precision)
RETURNS TABLE (id bigint, queue text, kind text, payload text, attempts integer, max_attempts integer,
               priority smallint, created_at timestamptz, replay_of bigint, headers text)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH picked AS (
        SELECT ready.id
          FROM unnest(p_queues) AS q(name)
         CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_after
                  FROM {schema}.jobs AS j
                 WHERE j.state = 'pending' AND j.queue = q.name AND j.run_after <= now()
                 ORDER BY j.priority, j.run_after, j.id
                 LIMIT p_limit
                   FOR UPDATE SKIP LOCKED
             ) AS ready
         -- a paused queue (App.pause_queue, RetryAfter(pause_queue=True), `joblane limits pause`) gives
         -- no job to any worker from the moment the pause commits: one primary-key probe per queue
         WHERE NOT EXISTS (SELECT 1 FROM {schema}.queue_pauses AS p WHERE p.queue = q.name AND p.until > now())
         ORDER BY ready.priority, ready.run_after, ready.id
         LIMIT p_limit
    )
    UPDATE {schema}.jobs AS j
       SET state = 'running',
           attempts = j.attempts + 1,
           worker = p_worker,
           lease_until = now() + make_interval(secs => p_lease_seconds),
           started_at = now()
     WHERE j.id = ANY(ARRAY(SELECT id FROM picked))
    RETURNING j.id, j.queue, j.kind, j.payload::text, j.attempts, j.max_attempts,
              j.priority, j.created_at, j.replay_of, j.headers::text;
END
$$;
