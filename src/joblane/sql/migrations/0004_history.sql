-- joblane schema, version 4: hourly roll-ups of the attempts, for the dashboard's history.
--
-- The history page reports throughput, failures and retries per queue and
-- kind over 24 h and 7 d, and latency percentiles per queue. Read from the
-- attempts themselves that is millions of rows joined to their jobs; instead
-- a maintenance service of the worker (history) rolls each closed hour up
-- once, and the page reads the roll-ups plus the attempts of the hours not
-- rolled up yet (the current one). Nothing here is written on the job's hot
-- path: the attempts table keeps its indexes as they were.

-- Attempts per hour (by finished_at), queue, kind and outcome.
CREATE TABLE {schema}.history_attempts (
    hour      timestamptz NOT NULL,
    queue     text        NOT NULL,
    kind      text        NOT NULL,
    outcome   text        NOT NULL,
    attempts  bigint      NOT NULL,
    PRIMARY KEY (hour, queue, kind, outcome)
);

-- Latency histograms per hour and queue: 'start' is enqueue to the start of
-- the first try, 'finish' is enqueue to the end of the try that finished the
-- job (done or failed). Bucket b holds latencies of 2^(b/2) to 2^((b+1)/2)
-- milliseconds (bucket 0 also holds those under 1 ms).
CREATE TABLE {schema}.history_latency (
    hour     timestamptz NOT NULL,
    queue    text        NOT NULL,
    measure  text        NOT NULL CHECK (measure IN ('start', 'finish')),
    bucket   smallint    NOT NULL,
    jobs     bigint      NOT NULL,
    PRIMARY KEY (hour, queue, measure, bucket)
);

-- The hours rolled up (an hour without attempts has a row here and none above).
CREATE TABLE {schema}.history_hours (
    hour       timestamptz PRIMARY KEY,
    rolled_at  timestamptz NOT NULL DEFAULT now()
);
