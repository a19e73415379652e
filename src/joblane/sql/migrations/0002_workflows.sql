-- joblane schema, version 2: what AI workflows and operations need on top of version 1.
-- Trace context on jobs, checkpointed steps, periodic ticks, queue rate limits,
-- and the partial indexes of the review queue, the dashboard and the attempts export.

-- trace context (W3C traceparent) of the enqueue, set only while a span is active
ALTER TABLE {schema}.jobs ADD COLUMN headers jsonb;

-- The review queue and the dashboard's counts read held and failed jobs from
-- these; both sets stay small however long the history grows, so a count or
-- an "oldest first" page never reads the finished rows.
CREATE INDEX jobs_held ON {schema}.jobs (queue, id) WHERE state = 'held';
CREATE INDEX jobs_failed ON {schema}.jobs (queue, finished_at) WHERE state = 'failed';

-- Filters of `joblane attempts` and its export. Both are partial, so the
-- completion path pays only for the rows they cover: attempts that record a
-- model, and attempts that did not simply succeed.
CREATE INDEX attempts_model ON {schema}.attempts ((meta->>'model'), finished_at)
    WHERE meta->>'model' IS NOT NULL;
CREATE INDEX attempts_outcome ON {schema}.attempts (outcome, finished_at) WHERE outcome <> 'done';

-- Failed rows per topic for the dashboard and `outbox retry`, without reading the sent history.
CREATE INDEX outbox_failed ON {schema}.outbox (topic, id) WHERE state = 'failed';

-- Checkpointed steps: the JSON result of each finished step of a job
-- (job.step), so a retry returns it instead of calling the model again.
CREATE TABLE {schema}.job_steps (
    job_id      bigint      NOT NULL,
    name        text        NOT NULL,
    attempt     integer     NOT NULL,
    result      jsonb,
    finished_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, name)
);

-- One row per tick a periodic schedule enqueued (periodic.py). The primary key
-- makes a tick enqueue once across any number of workers, also after its job
-- finished and left the unique_key index. The scheduler prunes old ticks but
-- keeps each schedule's latest, which is what it catches up from.
CREATE TABLE {schema}.periodic_ticks (
    name         text        NOT NULL,
    tick         timestamptz NOT NULL,
    enqueued_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, tick)
);

-- Rate limits of a queue, shared by every worker on every host (ratelimit.py).
-- Only queues with a row here are claimed through claim_jobs_limited; every
-- other queue keeps the plain claim.
CREATE TABLE {schema}.queue_limits (
    queue            text PRIMARY KEY,
    max_starts       integer CHECK (max_starts > 0),          -- starts per starts_interval
    starts_interval  float8  NOT NULL DEFAULT 1 CHECK (starts_interval > 0),
    concurrency      integer CHECK (concurrency > 0),         -- running at once, all workers
    max_cost         float8  CHECK (max_cost > 0),            -- estimated/settled cost per cost_interval
    cost_interval    float8  NOT NULL DEFAULT 60 CHECK (cost_interval > 0),
    cost_path        text[],                                  -- payload field holding a job's estimate
    default_cost     float8  NOT NULL DEFAULT 0 CHECK (default_cost >= 0),
    key_path         text[],                                  -- payload field of the fairness key
    per_key          integer CHECK (per_key > 0),             -- running at once per key
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT queue_limits_key CHECK ((key_path IS NULL) = (per_key IS NULL))
);

-- A queue that no worker starts jobs from until `until` (RetryAfter(pause_queue=True)).
CREATE TABLE {schema}.queue_pauses (
    queue   text PRIMARY KEY,
    until   timestamptz NOT NULL,
    reason  text
);

-- The sliding-window log of a limited queue: one row per start, with the
-- cost it reserved, kept for the longest window of the queue's limits.
CREATE TABLE {schema}.queue_starts (
    queue       text        NOT NULL,
    started_at  timestamptz NOT NULL,
    job_id      bigint      NOT NULL,
    attempt     integer     NOT NULL,
    cost        float8      NOT NULL DEFAULT 0
);
CREATE INDEX queue_starts_window ON {schema}.queue_starts (queue, started_at);
