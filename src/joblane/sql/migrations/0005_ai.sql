-- joblane schema: spend caps (budgets), the shared cache of step results, and replay tags.

-- A spend cap on the jobs of one queue (ai.py, app.budget). Every job of the
-- queue reserves its estimate (a payload field) when it starts, per key (a
-- payload field such as the tenant, or the whole queue); once the try has
-- finished, the cost it recorded (attempts.meta, field cost_field) replaces
-- the estimate. A key whose spend in the current window has reached the cap
-- gets no job started until the window rolls or the cap is raised. Only
-- queues with a row here are claimed through claim_jobs_budgeted.
CREATE TABLE {schema}.budgets (
    name              text PRIMARY KEY,
    queue             text    NOT NULL,
    cap               float8  NOT NULL CHECK (cap > 0),
    window_seconds    float8  CHECK (window_seconds > 0),   -- fixed windows from the epoch; NULL: calendar months (UTC)
    key_path          text[],                               -- payload field of the key; NULL: one key for the queue
    estimate_path     text[],                               -- payload field of a job's estimated cost
    default_estimate  float8  NOT NULL DEFAULT 0 CHECK (default_estimate >= 0),
    cost_field        text    NOT NULL DEFAULT 'cost',      -- attempts.meta field of the settled cost
    updated_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX budgets_queue ON {schema}.budgets (queue);

-- Settled spend per budget, key and window: finished tries are folded in here
-- by the budgeted claim, so a claim sums one row per key, not one per try.
CREATE TABLE {schema}.budget_usage (
    budget        text        NOT NULL,
    key           text        NOT NULL,
    window_start  timestamptz NOT NULL,
    spent         float8      NOT NULL DEFAULT 0,
    tries         bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (budget, window_start, key)
);

-- The estimates of tries in flight: written by the budgeted claim, folded
-- into budget_usage once the try's attempts row exists.
CREATE TABLE {schema}.budget_holds (
    budget        text        NOT NULL,
    key           text        NOT NULL,
    window_start  timestamptz NOT NULL,
    job_id        bigint      NOT NULL,
    attempt       integer     NOT NULL,
    started_at    timestamptz NOT NULL,                  -- the claim's jobs.started_at: in flight while they match
    estimate      float8      NOT NULL,
    PRIMARY KEY (budget, job_id, started_at)
);

-- Results of cached steps (job.step(..., cache=True)), shared by every job:
-- keyed by the step name and a hash of its arguments (and the model and
-- prompt version the task recorded). A 'running' row is a claim on the key:
-- the job that wrote it makes the call, others wait for its result.
CREATE TABLE {schema}.step_cache (
    key            text        PRIMARY KEY,
    step           text        NOT NULL,
    state          text        NOT NULL CHECK (state IN ('running', 'done')),
    result         jsonb,
    meta           jsonb,
    job_id         bigint,
    attempt        integer,
    claimed_until  timestamptz,
    created_at     timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz,
    hits           bigint      NOT NULL DEFAULT 0,
    last_hit_at    timestamptz
);
CREATE INDEX step_cache_created ON {schema}.step_cache (created_at);

-- The tag of a replay (joblane replay --tag v2-prompt), what joblane compare reads.
ALTER TABLE {schema}.jobs ADD COLUMN replay_tag text;
CREATE INDEX jobs_replay_tag ON {schema}.jobs (replay_tag, replay_of) WHERE replay_tag IS NOT NULL;
