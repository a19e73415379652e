-- Named queries of the history: hourly roll-ups of the attempts (the worker's
-- history service writes them) and the dashboard's reads of them.
--
-- Latency buckets: bucket b holds 2^(b/2) to 2^((b+1)/2) milliseconds, so
-- each bucket is ~41% wider than the one before; a percentile read from them
-- is within that step of the true value.

-- The attempts read are those of one hour at most (a roll-up, or the hours not
-- rolled up yet), each looked up in jobs by its primary key: the LATERAL ...
-- LIMIT 1 keeps that a nested loop over the index, never a hash join that
-- would read the whole jobs table.
--
-- Hours are UTC hours (date_trunc(..., 'UTC')), whatever the session's time zone.

-- name: history_hours_todo
-- Closed hours (ended more than $1 seconds ago) within the last $2 hours that are not rolled up yet, oldest first, at most $3.
SELECT h.hour
  FROM generate_series(date_trunc('hour', now() - make_interval(secs => $1::float8), 'UTC') - make_interval(hours => $2::int),
                       date_trunc('hour', now() - make_interval(secs => $1::float8), 'UTC') - interval '1 hour',
                       interval '1 hour') AS h(hour)
 WHERE NOT EXISTS (SELECT 1 FROM {schema}.history_hours AS d WHERE d.hour = h.hour)
 ORDER BY h.hour
 LIMIT $3;

-- name: history_rollup
-- Roll up the hour starting at $1 (attempts per queue, kind and outcome; latency histograms per queue), once: a second call for the same hour does nothing.
WITH claim AS (
    INSERT INTO {schema}.history_hours (hour) VALUES ($1::timestamptz)
    ON CONFLICT DO NOTHING
    RETURNING hour
), tries AS (
    SELECT j.queue, j.kind, a.outcome, a.attempt, a.started_at, a.finished_at, j.created_at
      FROM {schema}.attempts AS a
     CROSS JOIN LATERAL (SELECT queue, kind, created_at FROM {schema}.jobs WHERE id = a.job_id LIMIT 1) AS j
     WHERE a.finished_at >= $1::timestamptz AND a.finished_at < $1::timestamptz + interval '1 hour'
       AND EXISTS (SELECT 1 FROM claim)
), counted AS (
    INSERT INTO {schema}.history_attempts (hour, queue, kind, outcome, attempts)
    SELECT $1::timestamptz, queue, kind, outcome, count(*)
      FROM tries
     GROUP BY queue, kind, outcome
    RETURNING 1
), latencies AS (
    INSERT INTO {schema}.history_latency (hour, queue, measure, bucket, jobs)
    SELECT $1::timestamptz, queue, measure, bucket, count(*)
      FROM (SELECT queue, 'start' AS measure,
                   greatest(0, floor(2 * ln(greatest(1.0, extract(epoch FROM started_at - created_at)::float8 * 1000)) / ln(2.0)))::smallint AS bucket
              FROM tries
             WHERE attempt = 1 AND started_at IS NOT NULL
            UNION ALL
            SELECT queue, 'finish',
                   greatest(0, floor(2 * ln(greatest(1.0, extract(epoch FROM finished_at - created_at)::float8 * 1000)) / ln(2.0)))::smallint
              FROM tries
             WHERE outcome IN ('done', 'failed')) AS l
     GROUP BY queue, measure, bucket
    RETURNING 1
)
SELECT (SELECT count(*) FROM claim) AS claimed, (SELECT count(*) FROM counted) AS groups,
       (SELECT count(*) FROM latencies) AS buckets;

-- name: history_prune
-- Delete roll-ups of hours older than $1 seconds.
WITH hours AS (
    DELETE FROM {schema}.history_hours WHERE hour < now() - make_interval(secs => $1::float8) RETURNING hour
), counts AS (
    DELETE FROM {schema}.history_attempts WHERE hour < now() - make_interval(secs => $1::float8) RETURNING 1
), latency AS (
    DELETE FROM {schema}.history_latency WHERE hour < now() - make_interval(secs => $1::float8) RETURNING 1
)
SELECT (SELECT count(*) FROM hours);

-- name: history_rolled_hours
-- The hours from $1 on that are rolled up.
SELECT hour FROM {schema}.history_hours WHERE hour >= $1::timestamptz ORDER BY hour;

-- name: history_counts
-- Attempts per queue, kind and outcome since $1: the roll-ups of hours in $2, plus the attempts of the hours from $1 that are not in $2.
SELECT queue, kind, outcome, sum(attempts)::bigint AS attempts
  FROM (SELECT queue, kind, outcome, attempts
          FROM {schema}.history_attempts
         WHERE hour >= $1::timestamptz AND hour = ANY($2::timestamptz[])
        UNION ALL
        SELECT j.queue, j.kind, a.outcome, count(*)
          FROM {schema}.attempts AS a
         CROSS JOIN LATERAL (SELECT queue, kind, created_at FROM {schema}.jobs WHERE id = a.job_id LIMIT 1) AS j
         WHERE a.finished_at >= greatest($1::timestamptz, $3::timestamptz)
           AND date_trunc('hour', a.finished_at, 'UTC') <> ALL($2::timestamptz[])
         GROUP BY j.queue, j.kind, a.outcome) AS c
 GROUP BY queue, kind, outcome
 ORDER BY queue, kind, outcome;

-- name: history_latency_buckets
-- Latency histogram buckets per queue and measure since $1: roll-ups of hours in $2 plus the attempts from max($1, $3) of hours not in $2.
SELECT queue, measure, bucket, sum(jobs)::bigint AS jobs
  FROM (SELECT queue, measure, bucket, jobs
          FROM {schema}.history_latency
         WHERE hour >= $1::timestamptz AND hour = ANY($2::timestamptz[])
        UNION ALL
        SELECT queue, measure, bucket, count(*)
          FROM (SELECT j.queue, 'start' AS measure,
                       greatest(0, floor(2 * ln(greatest(1.0, extract(epoch FROM a.started_at - j.created_at)::float8 * 1000)) / ln(2.0)))::smallint AS bucket
                  FROM {schema}.attempts AS a
                 CROSS JOIN LATERAL (SELECT queue, kind, created_at FROM {schema}.jobs WHERE id = a.job_id LIMIT 1) AS j
                 WHERE a.finished_at >= greatest($1::timestamptz, $3::timestamptz)
                   AND date_trunc('hour', a.finished_at, 'UTC') <> ALL($2::timestamptz[])
                   AND a.attempt = 1 AND a.started_at IS NOT NULL
                UNION ALL
                SELECT j.queue, 'finish',
                       greatest(0, floor(2 * ln(greatest(1.0, extract(epoch FROM a.finished_at - j.created_at)::float8 * 1000)) / ln(2.0)))::smallint
                  FROM {schema}.attempts AS a
                 CROSS JOIN LATERAL (SELECT queue, kind, created_at FROM {schema}.jobs WHERE id = a.job_id LIMIT 1) AS j
                 WHERE a.finished_at >= greatest($1::timestamptz, $3::timestamptz)
                   AND date_trunc('hour', a.finished_at, 'UTC') <> ALL($2::timestamptz[])
                   AND a.outcome IN ('done', 'failed')) AS l
         GROUP BY queue, measure, bucket) AS b
 GROUP BY queue, measure, bucket
 ORDER BY queue, measure, bucket;
