-- joblane schema, version 1: jobs, their attempts, the outbox and the inbox.
-- {schema} is replaced by the validated, quoted schema name.

CREATE TABLE {schema}.jobs (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue         text        NOT NULL DEFAULT 'default',
    kind          text        NOT NULL,
    payload       jsonb       NOT NULL DEFAULT '{}'::jsonb,
    state         text        NOT NULL DEFAULT 'pending'
                  CHECK (state IN ('pending', 'running', 'done', 'failed', 'held', 'cancelled')),
    priority      smallint    NOT NULL DEFAULT 0,
    attempts      integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts  integer     NOT NULL DEFAULT 10 CHECK (max_attempts > 0),
    run_after     timestamptz NOT NULL DEFAULT now(),
    last_error    text,
    lease_until   timestamptz,
    worker        text,
    unique_key    text,
    replay_of     bigint,
    result        jsonb,
    created_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,
    -- a running job always has an owner and a lease; nothing else does
    CONSTRAINT jobs_lease_only_when_running
        CHECK ((state = 'running') = (lease_until IS NOT NULL AND worker IS NOT NULL))
);

-- Ready work only, in the order the claim reads it: a claim per queue walks
-- this index from the front and stops after LIMIT rows, however many jobs
-- wait. Finished rows never enter it, so it stays small as history grows.
CREATE INDEX jobs_ready ON {schema}.jobs (queue, priority, run_after, id)
    WHERE state = 'pending';

-- At most one unfinished job per unique_key. Finished rows leave the index,
-- so the same key can be enqueued again once its job is done.
CREATE UNIQUE INDEX jobs_unique_key ON {schema}.jobs (unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('pending', 'running', 'held');

-- The rescuer looks for expired leases among running jobs only.
CREATE INDEX jobs_lease ON {schema}.jobs (lease_until) WHERE state = 'running';

-- The pruner and "what finished lately" read finished rows by age.
CREATE INDEX jobs_finished ON {schema}.jobs (finished_at)
    WHERE state IN ('done', 'failed', 'cancelled');

CREATE INDEX jobs_replay_of ON {schema}.jobs (replay_of) WHERE replay_of IS NOT NULL;

-- One row per try. No foreign key to jobs: the pruner deletes both in one
-- statement, and a foreign key would cost an index probe on every insert of
-- the hot completion path.
CREATE TABLE {schema}.attempts (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id       bigint      NOT NULL,
    attempt      integer     NOT NULL,
    worker       text,
    started_at   timestamptz,
    finished_at  timestamptz NOT NULL DEFAULT now(),
    outcome      text        NOT NULL
                 CHECK (outcome IN ('done', 'retry', 'snoozed', 'failed', 'held', 'lost', 'released', 'rejected', 'cancelled')),
    error        text,
    meta         jsonb
);
CREATE INDEX attempts_job ON {schema}.attempts (job_id, attempt);
CREATE INDEX attempts_finished ON {schema}.attempts (finished_at);

CREATE TABLE {schema}.outbox (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic            text        NOT NULL,
    key              text,
    idempotency_key  text,
    payload          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    headers          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    state            text        NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'sent', 'failed')),
    attempts         integer     NOT NULL DEFAULT 0,
    -- NULL: the budget of the route the relay delivers it by; set by a retry
    max_attempts     integer     CHECK (max_attempts > 0),
    run_after        timestamptz NOT NULL DEFAULT now(),
    -- a relay holds a claimed row until lease_until; after that any relay may take it
    lease_until      timestamptz,
    relay            text,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    sent_at          timestamptz
);
CREATE INDEX outbox_ready ON {schema}.outbox (run_after, id) WHERE state = 'pending';
-- Ordered topics: a row waits while an earlier row of its (topic, key) is
-- unsent, pending or failed; the relay probes this index for that earlier row.
CREATE INDEX outbox_key_unsent ON {schema}.outbox (topic, key, id)
    WHERE state <> 'sent' AND key IS NOT NULL;
CREATE INDEX outbox_sent ON {schema}.outbox (sent_at) WHERE state = 'sent';

-- Keys a Python receiver has already processed (App.inbox).
CREATE TABLE {schema}.inbox (
    key          text PRIMARY KEY,
    received_at  timestamptz NOT NULL DEFAULT now()
);
