-- joblane schema, version 6: workflows. Dependencies between jobs, batches with a
-- completion callback, durable waits for an outside signal, and the SQL API
-- (enqueue, publish, signal) for producers that are not Python.
--
-- A job that cannot run yet is 'waiting': for its parents (parents_left > 0)
-- or for a signal (wait_key). The claim reads only 'pending' rows, so waiting
-- jobs cost the claim nothing and hold no worker and no lease.

ALTER TABLE {schema}.jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE {schema}.jobs ADD CONSTRAINT jobs_state_check
    CHECK (state IN ('pending', 'running', 'done', 'failed', 'held', 'cancelled', 'waiting')) NOT VALID;
ALTER TABLE {schema}.jobs VALIDATE CONSTRAINT jobs_state_check;

-- 'waiting': a try ended in WaitFor; 'timeout': a wait ran out of time.
ALTER TABLE {schema}.attempts DROP CONSTRAINT attempts_outcome_check;
ALTER TABLE {schema}.attempts ADD CONSTRAINT attempts_outcome_check
    CHECK (outcome IN ('done', 'retry', 'snoozed', 'failed', 'held', 'lost', 'released', 'rejected', 'cancelled',
                       'waiting', 'timeout')) NOT VALID;
ALTER TABLE {schema}.attempts VALIDATE CONSTRAINT attempts_outcome_check;

-- Every column is NULL on a plain job: adding them rewrites nothing, and a
-- plain job's row and its completion stay as they were. They have no CHECK
-- constraints: a CHECK costs every insert of every job (PostgreSQL prepares
-- each one per statement), and only the functions below write these columns,
-- checking what they write (link_jobs, park_jobs).
ALTER TABLE {schema}.jobs
    ADD COLUMN parents_left      integer,   -- parents not finished yet (NULL: the job has no parents)
    ADD COLUMN on_parent_failure text,      -- 'cancel' (or NULL), 'run' or 'hold'
    ADD COLUMN has_children      boolean,   -- true once a job names this one in after=
    ADD COLUMN batch_id          bigint,    -- the batch the job belongs to
    ADD COLUMN wait_key          text,      -- the event a waiting job waits for
    ADD COLUMN wait_timeout      text;      -- 'retry' or 'fail' at run_after; NULL: no timeout

-- A waiting job keeps its unique_key: the key is not free while the job can still run.
DROP INDEX {schema}.jobs_unique_key;
CREATE UNIQUE INDEX jobs_unique_key ON {schema}.jobs (unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('pending', 'running', 'held', 'waiting');

-- Jobs of a batch by state: the progress of a batch and "is anything of it unfinished".
CREATE INDEX jobs_batch ON {schema}.jobs (batch_id, state) WHERE batch_id IS NOT NULL;
-- A signal finds the jobs that wait for its key; the rescuer reads the same few rows for waits past
-- their deadline (run_after). One index for both: every index of jobs costs every plain insert a little.
CREATE INDEX jobs_wait_key ON {schema}.jobs (wait_key) WHERE state = 'waiting' AND wait_key IS NOT NULL;

-- One row per dependency: child_id runs after parent_id.
CREATE TABLE {schema}.job_deps (
    parent_id  bigint NOT NULL,
    child_id   bigint NOT NULL,
    PRIMARY KEY (parent_id, child_id)
);
CREATE INDEX job_deps_child ON {schema}.job_deps (child_id);

-- A batch: jobs are added until it is sealed; when the last one of a sealed
-- batch finishes, the callback job is inserted in that same transaction.
CREATE TABLE {schema}.batches (
    id                    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name                  text,
    on_complete_kind      text,
    on_complete_queue     text,
    on_complete_payload   jsonb,
    on_complete_priority  smallint,
    on_complete_max_attempts integer,
    created_at            timestamptz NOT NULL DEFAULT now(),
    sealed_at             timestamptz,
    finished_at           timestamptz,
    callback_job_id       bigint
);

-- Signals that arrived before any job waited for their key; the first wait consumes it.
CREATE TABLE {schema}.signals (
    key         text PRIMARY KEY,
    data        jsonb,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- The functions below run as their owner (SECURITY DEFINER, with a fixed
-- search_path; every name in them is qualified): a role that may only insert
-- jobs (joblane grants --role app) calls enqueue, signal and the workflow
-- functions it is granted, and they change jobs only in their own ways.
-- EXECUTE is revoked from PUBLIC at the end of this file.

-- The LISTEN/NOTIFY channel of jobs: '<schema>_jobs', payload the queue name.
CREATE FUNCTION {schema}.jobs_channel() RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT (parse_ident('{schema}.jobs'))[1] || '_jobs'
$$;

-- Children of a parent that finished in state p_state: one parent fewer to
-- wait for; the parent failure policy of each child decides what a failed or
-- cancelled parent does. Children are locked in id order, so two parents
-- finishing at the same instant serialise on the child row.
CREATE FUNCTION {schema}.release_children(p_parent bigint, p_state text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    c record;
    why text;
BEGIN
    FOR c IN
        SELECT j.id, j.queue, j.parents_left, coalesce(j.on_parent_failure, 'cancel') AS policy,
               j.last_error, j.attempts
          FROM {schema}.jobs AS j
         WHERE j.id IN (SELECT d.child_id FROM {schema}.job_deps AS d WHERE d.parent_id = p_parent)
           AND j.state = 'waiting' AND j.parents_left > 0
         ORDER BY j.id
           FOR UPDATE
    LOOP
        why := CASE WHEN p_state = 'done' THEN NULL ELSE 'parent job ' || p_parent || ' ' || p_state END;
        IF why IS NOT NULL AND c.policy = 'cancel' THEN
            UPDATE {schema}.jobs
               SET state = 'cancelled', finished_at = now(), parents_left = c.parents_left - 1,
                   last_error = 'cancelled: ' || why
             WHERE id = c.id;
            INSERT INTO {schema}.attempts (job_id, attempt, started_at, outcome, error, meta)
            VALUES (c.id, c.attempts, now(), 'cancelled', 'cancelled: ' || why,
                    jsonb_build_object('parent', p_parent, 'parent_state', p_state));
        ELSIF c.parents_left > 1 THEN
            UPDATE {schema}.jobs
               SET parents_left = c.parents_left - 1, last_error = coalesce(why, c.last_error)
             WHERE id = c.id;
        ELSIF coalesce(why, c.last_error) IS NOT NULL AND c.policy = 'hold' THEN
            UPDATE {schema}.jobs
               SET state = 'held', parents_left = 0,
                   last_error = 'held: ' || coalesce(why, c.last_error) || '; release to run it anyway'
             WHERE id = c.id;
            INSERT INTO {schema}.attempts (job_id, attempt, started_at, outcome, error, meta)
            VALUES (c.id, c.attempts, now(), 'held', 'held: ' || coalesce(why, c.last_error),
                    jsonb_build_object('parent', p_parent, 'parent_state', p_state));
        ELSE
            UPDATE {schema}.jobs
               SET state = 'pending', parents_left = 0, run_after = greatest(run_after, now()),
                   last_error = CASE WHEN coalesce(why, c.last_error) IS NULL THEN NULL
                                     ELSE 'ran anyway: ' || coalesce(why, c.last_error) END
             WHERE id = c.id;
            PERFORM pg_notify({schema}.jobs_channel(), c.queue);
        END IF;
    END LOOP;
END
$$;

-- The callback of batch p_batch, in the transaction of its last completion
-- (or of its sealing): the batch's counts and the ids of its failed jobs are
-- merged into the callback's payload under "batch". The caller holds the
-- batch row's lock and has checked that nothing of the batch is unfinished.
CREATE FUNCTION {schema}.finish_batch(p_batch bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    b record;
    summary jsonb;
    callback bigint;
BEGIN
    SELECT * INTO b FROM {schema}.batches WHERE id = p_batch;
    SELECT jsonb_build_object(
               'id', b.id, 'name', b.name,
               'total', count(*),
               'done', count(*) FILTER (WHERE state = 'done'),
               'failed', count(*) FILTER (WHERE state = 'failed'),
               'cancelled', count(*) FILTER (WHERE state = 'cancelled'),
               'failed_ids', coalesce(jsonb_agg(id ORDER BY id) FILTER (WHERE state = 'failed'), '[]'::jsonb),
               'cancelled_ids', coalesce(jsonb_agg(id ORDER BY id) FILTER (WHERE state = 'cancelled'), '[]'::jsonb))
      INTO summary
      FROM {schema}.jobs WHERE batch_id = p_batch;
    IF b.on_complete_kind IS NOT NULL THEN
        INSERT INTO {schema}.jobs (queue, kind, payload, priority, max_attempts)
        VALUES (b.on_complete_queue, b.on_complete_kind,
                coalesce(b.on_complete_payload, '{}'::jsonb) || jsonb_build_object('batch', summary),
                coalesce(b.on_complete_priority, 0), coalesce(b.on_complete_max_attempts, 10))
        RETURNING id INTO callback;
        PERFORM pg_notify({schema}.jobs_channel(), b.on_complete_queue);
    END IF;
    UPDATE {schema}.batches SET finished_at = now(), callback_job_id = callback WHERE id = p_batch;
    RETURN callback;
END
$$;

-- A job of batch p_batch finished: when the batch is sealed and nothing of it
-- is unfinished any more, finish it. The row lock on the batch serialises the
-- last completions; the check that follows it sees what they committed.
CREATE FUNCTION {schema}.batch_job_finished(p_batch bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    b record;
BEGIN
    SELECT sealed_at, finished_at INTO b FROM {schema}.batches WHERE id = p_batch FOR NO KEY UPDATE;
    IF NOT FOUND OR b.sealed_at IS NULL OR b.finished_at IS NOT NULL THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM {schema}.jobs
                WHERE batch_id = p_batch AND state IN ('pending', 'running', 'held', 'waiting')) THEN
        RETURN;
    END IF;
    PERFORM {schema}.finish_batch(p_batch);
END
$$;

-- After a job's state changes, for jobs that have children or a batch only
-- (the trigger's WHEN clause: a plain job never calls this function).
CREATE FUNCTION {schema}.jobs_flow() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NEW.state IN ('done', 'failed', 'cancelled') THEN
        IF NEW.has_children THEN
            PERFORM {schema}.release_children(NEW.id, NEW.state);
        END IF;
        IF NEW.batch_id IS NOT NULL THEN
            PERFORM {schema}.batch_job_finished(NEW.batch_id);
        END IF;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_flow AFTER UPDATE OF state ON {schema}.jobs
    FOR EACH ROW
    WHEN ((NEW.has_children OR NEW.batch_id IS NOT NULL)
          AND (NEW.state IN ('done', 'failed', 'cancelled')) AND NOT (OLD.state IN ('done', 'failed', 'cancelled')))
    EXECUTE FUNCTION {schema}.jobs_flow();

-- Make waiting jobs p_children depend on p_parents (parallel arrays, one
-- element per edge), with each child's parent failure policy p_policies
-- (parallel to p_children). The parents are locked (has_children is set), so
-- a parent finishing now either finished before (and is counted as such) or
-- finishes after this transaction (and releases the child itself).
CREATE FUNCTION {schema}.link_jobs(p_children bigint[], p_parents bigint[], p_policies text[])
RETURNS TABLE (child_id bigint, state text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    wanted int;
    found int;
    c record;
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(p_policies) AS x(pol) WHERE x.pol IS NULL OR x.pol NOT IN ('cancel', 'run', 'hold')) THEN
        RAISE EXCEPTION 'joblane: on_parent_failure must be cancel, run or hold'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT count(DISTINCT p) INTO wanted FROM unnest(p_parents) AS p;
    WITH locked AS (
        UPDATE {schema}.jobs SET has_children = true
         WHERE id IN (SELECT DISTINCT p FROM unnest(p_parents) AS p)
        RETURNING id
    ) SELECT count(*) INTO found FROM locked;
    IF found < wanted THEN
        RAISE EXCEPTION 'joblane: after= names % job(s) that do not exist', wanted - found
              USING ERRCODE = 'foreign_key_violation';
    END IF;
    INSERT INTO {schema}.job_deps (parent_id, child_id)
    SELECT DISTINCT e.p, e.c FROM unnest(p_parents, p_children) AS e(p, c)
    ON CONFLICT DO NOTHING;
    FOR c IN
        SELECT e.c AS id, min(e.pol) AS policy,
               count(*) FILTER (WHERE pj.state IN ('pending', 'running', 'held', 'waiting')) AS open,
               string_agg(CASE WHEN pj.state IN ('failed', 'cancelled')
                               THEN 'parent job ' || pj.id || ' ' || pj.state END, ', ') AS why
          FROM (SELECT DISTINCT x.c, x.p, x.pol
                  FROM unnest(p_children, p_parents, p_policies) AS x(c, p, pol)) AS e
          JOIN {schema}.jobs AS pj ON pj.id = e.p
         GROUP BY e.c
         ORDER BY e.c
    LOOP
        IF c.why IS NOT NULL AND c.policy = 'cancel' THEN
            UPDATE {schema}.jobs AS j
               SET state = 'cancelled', finished_at = now(), parents_left = c.open, on_parent_failure = c.policy,
                   last_error = 'cancelled: ' || c.why
             WHERE j.id = c.id AND j.state = 'waiting' AND j.parents_left IS NULL;
            INSERT INTO {schema}.attempts (job_id, attempt, started_at, outcome, error)
            SELECT c.id, 0, now(), 'cancelled', 'cancelled: ' || c.why WHERE FOUND;
        ELSIF c.open > 0 THEN
            UPDATE {schema}.jobs AS j
               SET parents_left = c.open, on_parent_failure = c.policy, last_error = c.why
             WHERE j.id = c.id AND j.state = 'waiting' AND j.parents_left IS NULL;
        ELSIF c.why IS NOT NULL AND c.policy = 'hold' THEN
            UPDATE {schema}.jobs AS j
               SET state = 'held', parents_left = 0, on_parent_failure = c.policy,
                   last_error = 'held: ' || c.why || '; release to run it anyway'
             WHERE j.id = c.id AND j.state = 'waiting' AND j.parents_left IS NULL;
        ELSE
            UPDATE {schema}.jobs AS j
               SET state = 'pending', parents_left = 0, on_parent_failure = c.policy,
                   last_error = CASE WHEN c.why IS NULL THEN NULL ELSE 'ran anyway: ' || c.why END
             WHERE j.id = c.id AND j.state = 'waiting' AND j.parents_left IS NULL;
            IF FOUND THEN
                PERFORM pg_notify({schema}.jobs_channel(), (SELECT queue FROM {schema}.jobs AS q WHERE q.id = c.id));
            END IF;
        END IF;
        child_id := c.id;
        SELECT j.state INTO state FROM {schema}.jobs AS j WHERE j.id = c.id;
        RETURN NEXT;
    END LOOP;
END
$$;

-- Add jobs p_ids to batch p_batch (not sealed). KEY SHARE on the batch row:
-- completions of the batch's jobs go on meanwhile, and sealing waits for
-- this transaction, so no job joins a batch after its callback fired.
CREATE FUNCTION {schema}.add_to_batch(p_batch bigint, p_ids bigint[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    sealed timestamptz;
    n integer;
BEGIN
    SELECT sealed_at INTO sealed FROM {schema}.batches WHERE id = p_batch FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'joblane: batch % does not exist', p_batch USING ERRCODE = 'foreign_key_violation';
    END IF;
    IF sealed IS NOT NULL THEN
        RAISE EXCEPTION 'joblane: batch % is sealed; no job can join it', p_batch
              USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    UPDATE {schema}.jobs SET batch_id = p_batch WHERE id = ANY(p_ids) AND batch_id IS NULL;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- Seal batch p_batch: no more jobs join it. When nothing of it is unfinished
-- (also when it is empty), it finishes now, in this transaction.
CREATE FUNCTION {schema}.seal_batch(p_batch bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    b record;
BEGIN
    SELECT sealed_at, finished_at INTO b FROM {schema}.batches WHERE id = p_batch FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'joblane: batch % does not exist', p_batch USING ERRCODE = 'foreign_key_violation';
    END IF;
    IF b.sealed_at IS NULL THEN
        UPDATE {schema}.batches SET sealed_at = now() WHERE id = p_batch;
    END IF;
    IF b.finished_at IS NULL AND NOT EXISTS (
            SELECT 1 FROM {schema}.jobs
             WHERE batch_id = p_batch AND state IN ('pending', 'running', 'held', 'waiting')) THEN
        PERFORM {schema}.finish_batch(p_batch);
        RETURN true;
    END IF;
    RETURN b.finished_at IS NOT NULL;
END
$$;

-- Wake the jobs waiting for p_key with p_data, in the caller's transaction;
-- with none waiting, keep the signal for the first job that waits for it.
-- Returns how many jobs it woke. The advisory lock on the key serialises a
-- signal with a job parking on the same key (park_jobs).
CREATE FUNCTION {schema}.signal(p_key text, p_data jsonb DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer := 0;
    q text;
BEGIN
    IF p_key IS NULL OR p_key = '' OR length(p_key) > 1000 THEN
        RAISE EXCEPTION 'joblane: a signal key is a non-empty text of at most 1000 characters'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('joblane.signal:' || p_key, 0));
    FOR q IN
        WITH woken AS (
            UPDATE {schema}.jobs
               SET state = 'pending', run_after = now(), wait_key = NULL, wait_timeout = NULL, last_error = NULL,
                   headers = coalesce(headers, '{}'::jsonb)
                             || jsonb_build_object('joblane.signal', jsonb_build_object('key', p_key, 'data', p_data))
             WHERE state = 'waiting' AND wait_key = p_key
            RETURNING queue
        ) SELECT woken.queue FROM woken
    LOOP
        n := n + 1;
        PERFORM pg_notify({schema}.jobs_channel(), q);
    END LOOP;
    IF n = 0 THEN
        INSERT INTO {schema}.signals (key, data) VALUES (p_key, p_data)
        ON CONFLICT (key) DO UPDATE SET data = excluded.data, created_at = now();
    END IF;
    RETURN n;
END
$$;

-- Park running jobs whose try raised WaitFor (a JSON array: id, attempt, key,
-- timeout seconds or null, on_timeout, started_at, finished_at, meta), guarded
-- like complete_jobs. A job whose key was signalled before goes straight back
-- to pending with the signal; the others wait, with no worker and no lease.
-- The try does not spend the attempt budget. Returns the ids that applied.
CREATE FUNCTION {schema}.park_jobs(p_outcomes jsonb, p_worker text) RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    o record;
    sig record;
    q text;
BEGIN
    FOR o IN
        SELECT * FROM jsonb_to_recordset(p_outcomes)
               AS x(id bigint, attempt int, key text, timeout float8, on_timeout text,
                    started_at float8, finished_at float8, meta jsonb)
         ORDER BY x.key, x.id
    LOOP
        IF o.key IS NULL OR o.key = '' OR coalesce(o.on_timeout, 'retry') NOT IN ('retry', 'fail') THEN
            RAISE EXCEPTION 'joblane: a wait needs a key, and on_timeout retry or fail'
                  USING ERRCODE = 'invalid_parameter_value';
        END IF;
        PERFORM pg_advisory_xact_lock(hashtextextended('joblane.signal:' || o.key, 0));
        DELETE FROM {schema}.signals WHERE key = o.key RETURNING * INTO sig;
        IF sig.key IS NOT NULL THEN
            UPDATE {schema}.jobs
               SET state = 'pending', attempts = attempts - 1, run_after = now(), lease_until = NULL,
                   worker = NULL, wait_key = NULL, wait_timeout = NULL,
                   headers = coalesce(headers, '{}'::jsonb)
                             || jsonb_build_object('joblane.signal', jsonb_build_object('key', o.key, 'data', sig.data))
             WHERE id = o.id AND state = 'running' AND attempts = o.attempt AND worker = p_worker
            RETURNING queue INTO q;
            IF NOT FOUND THEN  -- the job was rescued or cancelled meanwhile: keep the signal
                INSERT INTO {schema}.signals (key, data, created_at) VALUES (sig.key, sig.data, sig.created_at);
                CONTINUE;
            END IF;
            PERFORM pg_notify({schema}.jobs_channel(), q);
        ELSE
            UPDATE {schema}.jobs
               SET state = 'waiting', attempts = attempts - 1, lease_until = NULL, worker = NULL,
                   -- with a timeout, run_after is the wait's deadline and wait_timeout its policy
                   wait_key = o.key,
                   wait_timeout = CASE WHEN o.timeout IS NULL THEN NULL ELSE coalesce(o.on_timeout, 'retry') END,
                   run_after = now() + make_interval(secs => coalesce(o.timeout, 0)),
                   last_error = 'waiting for ' || o.key,
                   headers = CASE WHEN headers ? 'joblane.signal' THEN headers - 'joblane.signal' ELSE headers END
             WHERE id = o.id AND state = 'running' AND attempts = o.attempt AND worker = p_worker;
            IF NOT FOUND THEN
                CONTINUE;
            END IF;
        END IF;
        INSERT INTO {schema}.attempts (job_id, attempt, worker, started_at, finished_at, outcome, error, meta)
        VALUES (o.id, o.attempt, p_worker, to_timestamp(o.started_at), coalesce(to_timestamp(o.finished_at), now()),
                'waiting', 'waiting for ' || o.key
                           || CASE WHEN sig.key IS NOT NULL THEN ' (signalled before the wait)' ELSE '' END,
                o.meta);
        RETURN NEXT o.id;
    END LOOP;
END
$$;

-- The SQL API: enqueue a job from a trigger, a function or any language's
-- client, in the caller's transaction, checked as App.enqueue checks it, and
-- notifying idle workers on the channel App.enqueue uses. Returns the job's
-- id (with unique_key: the unfinished job holding it, when there is one).
CREATE FUNCTION {schema}.enqueue(
    kind text,
    payload jsonb DEFAULT '{}'::jsonb,
    queue text DEFAULT 'default',
    run_after timestamptz DEFAULT NULL,
    unique_key text DEFAULT NULL,
    priority integer DEFAULT 0,
    max_attempts integer DEFAULT 10
) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    new_id bigint;
BEGIN
    IF kind IS NULL OR kind = '' OR length(kind) > 200 THEN
        RAISE EXCEPTION 'joblane.enqueue: kind must be a non-empty text of at most 200 characters'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF queue IS NULL OR queue !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$' THEN
        RAISE EXCEPTION 'joblane.enqueue: invalid queue name %: use 1-63 letters, digits, ''_'', ''.'', '':'' or ''-'', starting with a letter or digit', quote_literal(queue)
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF priority IS NULL OR priority NOT BETWEEN -32768 AND 32767 THEN
        RAISE EXCEPTION 'joblane.enqueue: priority must be an integer from -32768 to 32767'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF max_attempts IS NULL OR max_attempts NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'joblane.enqueue: max_attempts must be an integer from 1 to 100000'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF unique_key IS NOT NULL AND (unique_key = '' OR length(unique_key) > 1000) THEN
        RAISE EXCEPTION 'joblane.enqueue: unique_key must be a non-empty text of at most 1000 characters'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF payload IS NULL THEN
        payload := '{}'::jsonb;
    END IF;
    IF octet_length(payload::text) > 1000000 THEN
        RAISE EXCEPTION 'joblane.enqueue: payload is larger than 1000000 bytes'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO {schema}.jobs AS j (queue, kind, payload, priority, max_attempts, run_after, unique_key)
    VALUES (enqueue.queue, enqueue.kind, enqueue.payload, enqueue.priority, enqueue.max_attempts,
            coalesce(enqueue.run_after, now()), enqueue.unique_key)
    ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND state IN ('pending', 'running', 'held')
    DO NOTHING
    RETURNING j.id INTO new_id;
    IF new_id IS NULL THEN
        SELECT j.id INTO new_id FROM {schema}.jobs AS j
         WHERE j.unique_key = enqueue.unique_key AND j.state IN ('pending', 'running', 'held', 'waiting');
        RETURN new_id;
    END IF;
    IF enqueue.run_after IS NULL OR enqueue.run_after <= now() THEN
        PERFORM pg_notify({schema}.jobs_channel(), enqueue.queue);
    END IF;
    RETURN new_id;
END
$$;

-- The SQL API's publish: an outbox row in the caller's transaction, checked
-- as App.publish checks it, notifying relays ('<schema>_outbox', empty payload).
CREATE FUNCTION {schema}.publish(
    topic text,
    payload jsonb DEFAULT '{}'::jsonb,
    key text DEFAULT NULL,
    idempotency_key text DEFAULT NULL,
    headers jsonb DEFAULT '{}'::jsonb
) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    new_id bigint;
BEGIN
    IF topic IS NULL OR topic = '' OR length(topic) > 255 THEN
        RAISE EXCEPTION 'joblane.publish: topic must be a non-empty text of at most 255 characters'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF key IS NOT NULL AND (key = '' OR length(key) > 1000) THEN
        RAISE EXCEPTION 'joblane.publish: key must be a non-empty text of at most 1000 characters'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF idempotency_key IS NOT NULL AND (idempotency_key = '' OR length(idempotency_key) > 1000) THEN
        RAISE EXCEPTION 'joblane.publish: idempotency_key must be a non-empty text of at most 1000 characters'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF headers IS NOT NULL AND jsonb_typeof(headers) <> 'object' THEN
        RAISE EXCEPTION 'joblane.publish: headers must be a JSON object of strings'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(coalesce(payload, '{}'::jsonb)::text) > 1000000 THEN
        RAISE EXCEPTION 'joblane.publish: payload is larger than 1000000 bytes'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    new_id := nextval(pg_get_serial_sequence('{schema}.outbox', 'id'));
    INSERT INTO {schema}.outbox AS o (id, topic, key, idempotency_key, payload, headers)
    OVERRIDING SYSTEM VALUE
    VALUES (new_id, publish.topic, publish.key, coalesce(publish.idempotency_key, 'outbox:' || new_id),
            coalesce(publish.payload, '{}'::jsonb), coalesce(publish.headers, '{}'::jsonb));
    PERFORM pg_notify((parse_ident('{schema}.outbox'))[1] || '_outbox', '');
    RETURN new_id;
END
$$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {schema} FROM PUBLIC;
