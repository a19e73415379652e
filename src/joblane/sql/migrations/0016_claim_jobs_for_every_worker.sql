-- joblane schema, version 16: claim_jobs returns only jobs unless asked to
-- say "claim again".
--
-- Version 13's claim_jobs ends with a row of NULLs when it found fewer jobs
-- than asked while a lane was busy with another claim, or after it promoted
-- deferred jobs that only a later claim can take: today's worker claims again
-- at once on that row. A worker of version 10 to 12 left running across the
-- upgrade took that row for a job and exited (json.loads(None) in its claim
-- loop). The statement's body moves, unchanged, to claim_ready_jobs, and
-- claim_jobs calls it: with the four arguments every earlier worker passes
-- it returns jobs only (a busy lane then costs such a worker a poll
-- interval), and with p_say_again (today's worker) it keeps the row of NULLs.
-- claim_jobs is a plain SQL function over claim_ready_jobs, which the
-- planner inlines into the caller's statement.
ALTER FUNCTION {schema}.claim_jobs(text[], integer, text, double precision) RENAME TO claim_ready_jobs;

CREATE FUNCTION {schema}.claim_jobs(p_queues text[], p_limit integer, p_worker text,
                                    p_lease_seconds double precision, p_say_again boolean DEFAULT false)
RETURNS TABLE (id bigint, queue text, kind text, payload text, attempts integer, max_attempts integer,
               priority smallint, created_at timestamptz, replay_of bigint, headers text)
LANGUAGE sql
AS $$
    SELECT c.id, c.queue, c.kind, c.payload, c.attempts, c.max_attempts, c.priority, c.created_at,
           c.replay_of, c.headers
      FROM {schema}.claim_ready_jobs(p_queues, p_limit, p_worker, p_lease_seconds) AS c
     WHERE p_say_again OR c.id IS NOT NULL
$$;
