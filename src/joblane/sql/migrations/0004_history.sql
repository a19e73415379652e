-- joblane schema, version 4: roll-ups of the attempts, for the dashboard's history.
--
-- The history page reports throughput, failures and retries per queue and
-- kind over 1 h, 24 h and 7 d, and latency percentiles per queue. Read from
-- the attempts themselves that is millions of rows joined to their jobs;
-- instead a maintenance service of the worker (history) rolls the attempts
-- up once per slice of time: five minutes for the current and the last hour,
-- whole hours before that (the five-minute slices of a closed hour are merged
-- into one). The page reads the roll-ups plus the attempts of the minutes
-- not rolled up yet. Nothing here is written on the job's hot path: the
-- attempts table keeps its indexes as they were.

-- The slices rolled up: [start, start + seconds). A slice without attempts
-- has a row here and none in the tables below.
CREATE TABLE {schema}.history_slices (
    start      timestamptz PRIMARY KEY,
    seconds    integer     NOT NULL CHECK (seconds IN (300, 3600)),
    rolled_at  timestamptz NOT NULL DEFAULT now()
);

-- Attempts per slice (by finished_at), queue, kind and outcome.
CREATE TABLE {schema}.history_attempts (
    start     timestamptz NOT NULL,
    queue     text        NOT NULL,
    kind      text        NOT NULL,
    outcome   text        NOT NULL,
    attempts  bigint      NOT NULL,
    PRIMARY KEY (start, queue, kind, outcome)
);

-- Latency histograms per slice and queue: 'start' is enqueue to the start of
-- the first try, 'finish' is enqueue to the end of the try that finished the
-- job (done or failed). Bucket b holds latencies of 2^(b/2) to 2^((b+1)/2)
-- milliseconds (bucket 0 also holds those under 1 ms).
CREATE TABLE {schema}.history_latency (
    start    timestamptz NOT NULL,
    queue    text        NOT NULL,
    measure  text        NOT NULL CHECK (measure IN ('start', 'finish')),
    bucket   smallint    NOT NULL,
    jobs     bigint      NOT NULL,
    PRIMARY KEY (start, queue, measure, bucket)
);
