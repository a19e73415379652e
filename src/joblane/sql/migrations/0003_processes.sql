-- joblane schema, version 3: the registry of running workers and relays, and when a running try started.

-- When the running try of a job started (set by the claim): the attempts row
-- a rescue or a cancel writes for that try keeps its real start.
ALTER TABLE {schema}.jobs ADD COLUMN started_at timestamptz;

--
-- Every worker and relay registers at start and heartbeats its row while it
-- runs (its own thread, so a task that blocks the event loop does not stop
-- it). A row whose lease has run out belongs to a process that died; the
-- rescuer deletes it. The registry tells which task kinds some live worker
-- knows: a worker that claims a job of a kind it does not know gives it back
-- while another live worker knows it (a rolling deploy), and fails it only
-- when none has for a while.
CREATE TABLE {schema}.processes (
    name         text        PRIMARY KEY,
    role         text        NOT NULL CHECK (role IN ('worker', 'relay')),
    host         text        NOT NULL,
    pid          integer     NOT NULL,
    version      text        NOT NULL,
    queues       text[]      NOT NULL DEFAULT '{}',
    kinds        text[]      NOT NULL DEFAULT '{}',
    concurrency  integer,
    running      integer     NOT NULL DEFAULT 0,
    started_at   timestamptz NOT NULL DEFAULT now(),
    last_seen    timestamptz NOT NULL DEFAULT now(),
    lease_until  timestamptz NOT NULL
);
-- "Does any live worker know kind k?" reads the few live rows' arrays.
CREATE INDEX processes_kinds ON {schema}.processes USING gin (kinds);

-- Autovacuum for a queue. Every job leaves row versions behind (the claim,
-- the completion, the pruner's delete); PostgreSQL's defaults wait for 20 %
-- of a table to be dead before vacuuming it and then throttle the vacuum,
-- which a busy queue outruns. These tables are vacuumed after 1 % (or 1,000
-- rows) and at ten times the default cost limit, so dead rows stay few and
-- their space is reused instead of growing the table.
ALTER TABLE {schema}.jobs SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_limit = 2000, autovacuum_vacuum_cost_delay = 1);
ALTER TABLE {schema}.attempts SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.02, autovacuum_vacuum_cost_limit = 2000,
    autovacuum_vacuum_cost_delay = 1);
ALTER TABLE {schema}.outbox SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.02, autovacuum_vacuum_cost_limit = 2000,
    autovacuum_vacuum_cost_delay = 1);
