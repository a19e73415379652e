-- Named queries of the history: roll-ups of the attempts (the worker's history
-- service writes them) and the dashboard's reads of them.
--
-- Slices are UTC hours and five-minute parts of them. Attempts are read one
-- slice at a time (a roll-up) or over the few minutes not rolled up yet (a
-- page), each looked up in jobs by its primary key: the LATERAL ... LIMIT 1
-- keeps that a nested loop over the index, never a hash join that would read
-- the whole jobs table.
--
-- Latency buckets: bucket b holds 2^(b/2) to 2^((b+1)/2) milliseconds, so
-- each bucket is ~41% wider than the one before; a percentile read from them
-- is within that step of the true value.

-- name: history_no_jit
-- Turn JIT compilation off for the rest of the history service's transaction (its statements are short; compiling costs more).
SET LOCAL jit = off;

-- name: history_hours_todo
-- UTC hours of the last $1 hours, before the last one, that no slice covers any part of, oldest first, at most $2 (the last and the current hour go in five-minute slices).
--
-- Hours before the one of the oldest attempt hold nothing to roll up (a new
-- schema, or a week before the first job): they are left out, so a first
-- start does not spend its first second on a week of empty slices. The page
-- reads an hour no slice covers from the attempts themselves: none there.
SELECT h.start
  FROM generate_series(date_trunc('hour', now(), 'UTC') - make_interval(hours => $1::int),
                       date_trunc('hour', now(), 'UTC') - interval '2 hours',
                       interval '1 hour') AS h(start)
 WHERE NOT EXISTS (SELECT 1 FROM {schema}.history_slices AS d
                    WHERE d.start >= h.start AND d.start < h.start + interval '1 hour')
   AND h.start >= (SELECT date_trunc('hour', min(a.finished_at), 'UTC') FROM {schema}.attempts AS a)
 ORDER BY h.start
 LIMIT $2;

-- name: history_minutes_todo
-- Closed five-minute slices (ended more than $1 seconds ago) not rolled up, in the current and the last UTC hour or in an hour partly rolled up within the last $2 hours, oldest first, at most $3.
--
-- Not in an hour before the one of the oldest attempt (nothing there); the
-- hour of the oldest attempt is rolled up whole, so it can be merged.
SELECT m.start
  FROM generate_series(date_trunc('hour', now(), 'UTC') - make_interval(hours => $2::int),
                       date_bin('5 minutes', now() - make_interval(secs => $1::float8), timestamptz '2000-01-01 00:00+00')
                         - interval '5 minutes',
                       interval '5 minutes') AS m(start)
 WHERE NOT EXISTS (SELECT 1 FROM {schema}.history_slices AS d
                    WHERE d.start <= m.start AND m.start < d.start + make_interval(secs => d.seconds))
   AND m.start >= (SELECT date_trunc('hour', min(a.finished_at), 'UTC') FROM {schema}.attempts AS a)
   AND (m.start >= date_trunc('hour', now(), 'UTC') - interval '1 hour'
        OR EXISTS (SELECT 1 FROM {schema}.history_slices AS p
                    WHERE p.start >= date_trunc('hour', m.start, 'UTC')
                      AND p.start < date_trunc('hour', m.start, 'UTC') + interval '1 hour'))
 ORDER BY m.start
 LIMIT $3;

-- name: history_rollup
-- Roll up the slice of $2 seconds starting at $1 (attempts per queue, kind and outcome; latency histograms per queue), once: a second call for the same slice does nothing.
WITH claim AS (
    INSERT INTO {schema}.history_slices (start, seconds) VALUES ($1::timestamptz, $2::int)
    ON CONFLICT DO NOTHING
    RETURNING start
), tries AS (
    SELECT j.queue, j.kind, a.outcome, a.attempt, a.started_at, a.finished_at, j.created_at
      FROM {schema}.attempts AS a
     CROSS JOIN LATERAL (SELECT queue, kind, created_at FROM {schema}.jobs WHERE id = a.job_id LIMIT 1) AS j
     WHERE a.finished_at >= $1::timestamptz AND a.finished_at < $1::timestamptz + make_interval(secs => $2::int)
       AND EXISTS (SELECT 1 FROM claim)
), counted AS (
    INSERT INTO {schema}.history_attempts (start, queue, kind, outcome, attempts)
    SELECT $1::timestamptz, queue, kind, outcome, count(*)
      FROM tries
     GROUP BY queue, kind, outcome
    RETURNING 1
), latencies AS (
    INSERT INTO {schema}.history_latency (start, queue, measure, bucket, jobs)
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

-- name: history_full_hours
-- UTC hours before the last one whose twelve five-minute slices are all rolled up: ready to merge (the last hour keeps its slices for the 1 h window).
SELECT date_trunc('hour', start, 'UTC') AS hour
  FROM {schema}.history_slices
 WHERE seconds = 300
   AND start < date_trunc('hour', now(), 'UTC') - interval '1 hour'
 GROUP BY 1
HAVING count(*) = 12
 ORDER BY 1;

-- name: history_merge_attempts
-- Merge the five-minute roll-ups of attempts of the UTC hour $1 into one row per queue, kind and outcome.
WITH parts AS (
    DELETE FROM {schema}.history_attempts
     WHERE start >= $1::timestamptz AND start < $1::timestamptz + interval '1 hour'
    RETURNING queue, kind, outcome, attempts
)
INSERT INTO {schema}.history_attempts (start, queue, kind, outcome, attempts)
SELECT $1::timestamptz, queue, kind, outcome, sum(attempts)
  FROM parts
 GROUP BY queue, kind, outcome;

-- name: history_merge_latency
-- Merge the five-minute latency histograms of the UTC hour $1 into one per queue and measure.
WITH parts AS (
    DELETE FROM {schema}.history_latency
     WHERE start >= $1::timestamptz AND start < $1::timestamptz + interval '1 hour'
    RETURNING queue, measure, bucket, jobs
)
INSERT INTO {schema}.history_latency (start, queue, measure, bucket, jobs)
SELECT $1::timestamptz, queue, measure, bucket, sum(jobs)
  FROM parts
 GROUP BY queue, measure, bucket;

-- name: history_merge_slices
-- Replace the twelve five-minute slices of the UTC hour $1 by the hour.
WITH parts AS (
    DELETE FROM {schema}.history_slices
     WHERE start >= $1::timestamptz AND start < $1::timestamptz + interval '1 hour'
    RETURNING start
)
INSERT INTO {schema}.history_slices (start, seconds)
SELECT $1::timestamptz, 3600
 WHERE (SELECT count(*) FROM parts) > 0;

-- name: history_prune
-- Delete roll-ups of slices older than $1 seconds.
WITH slices AS (
    DELETE FROM {schema}.history_slices WHERE start < now() - make_interval(secs => $1::float8) RETURNING start
), counts AS (
    DELETE FROM {schema}.history_attempts WHERE start < now() - make_interval(secs => $1::float8) RETURNING 1
), latency AS (
    DELETE FROM {schema}.history_latency WHERE start < now() - make_interval(secs => $1::float8) RETURNING 1
)
SELECT (SELECT count(*) FROM slices);

-- name: history_slices_since
-- The slices rolled up that start at $1 or later: start and length in seconds.
SELECT start, seconds FROM {schema}.history_slices WHERE start >= $1::timestamptz ORDER BY start;

-- name: history_first_attempt
-- When the first attempt finished at $1 or later finished (NULL: none did): one probe of attempts_finished.
SELECT min(finished_at) FROM {schema}.attempts WHERE finished_at >= $1::timestamptz;

-- name: history_counts
-- Attempts per queue, kind and outcome: the roll-ups of the slices starting at $1 (an array), plus the attempts finished in the ranges [$2[i], $3[i]) that no slice covers.
SELECT queue, kind, outcome, sum(attempts)::bigint AS attempts
  FROM (SELECT queue, kind, outcome, attempts
          FROM {schema}.history_attempts
         WHERE start = ANY($1::timestamptz[])
        UNION ALL
        SELECT j.queue, j.kind, a.outcome, count(*)
          FROM unnest($2::timestamptz[], $3::timestamptz[]) AS r(lo, hi)
          JOIN {schema}.attempts AS a ON a.finished_at >= r.lo AND a.finished_at < r.hi
         CROSS JOIN LATERAL (SELECT queue, kind FROM {schema}.jobs WHERE id = a.job_id LIMIT 1) AS j
         GROUP BY j.queue, j.kind, a.outcome) AS c
 GROUP BY queue, kind, outcome
 ORDER BY queue, kind, outcome;

-- name: history_latency_buckets
-- Latency histogram buckets per queue and measure: the roll-ups of the slices starting at $1 (an array), plus the attempts finished in the ranges [$2[i], $3[i]) that no slice covers.
SELECT queue, measure, bucket, sum(jobs)::bigint AS jobs
  FROM (SELECT queue, measure, bucket, jobs
          FROM {schema}.history_latency
         WHERE start = ANY($1::timestamptz[])
        UNION ALL
        SELECT j.queue, m.measure, m.bucket, count(*)
          FROM unnest($2::timestamptz[], $3::timestamptz[]) AS r(lo, hi)
          JOIN {schema}.attempts AS a ON a.finished_at >= r.lo AND a.finished_at < r.hi
         CROSS JOIN LATERAL (SELECT queue, created_at FROM {schema}.jobs WHERE id = a.job_id LIMIT 1) AS j
         CROSS JOIN LATERAL (
                SELECT 'start' AS measure,
                       greatest(0, floor(2 * ln(greatest(1.0, extract(epoch FROM a.started_at - j.created_at)::float8 * 1000)) / ln(2.0)))::smallint AS bucket
                 WHERE a.attempt = 1 AND a.started_at IS NOT NULL
                UNION ALL
                SELECT 'finish',
                       greatest(0, floor(2 * ln(greatest(1.0, extract(epoch FROM a.finished_at - j.created_at)::float8 * 1000)) / ln(2.0)))::smallint
                 WHERE a.outcome IN ('done', 'failed')) AS m
         GROUP BY j.queue, m.measure, m.bucket) AS b
 GROUP BY queue, measure, bucket
 ORDER BY queue, measure, bucket;

-- name: history_series
-- Done and failed attempts per time bucket of $4 seconds (from the epoch), queue and kind: the roll-ups of the slices starting at $1 (an array), plus the attempts finished in the ranges [$2[i], $3[i]) that no slice covers.
--
-- A slice counts in the bucket its start falls in (slices never straddle the
-- buckets the dashboard asks for: hours, or five minutes within the last hours).
SELECT to_timestamp(floor(extract(epoch FROM c.at) / $4::float8) * $4::float8) AS bucket, c.queue, c.kind,
       coalesce(sum(c.attempts) FILTER (WHERE c.outcome = 'done'), 0)::bigint AS done,
       coalesce(sum(c.attempts) FILTER (WHERE c.outcome = 'failed'), 0)::bigint AS failed
  FROM (SELECT start AS at, queue, kind, outcome, attempts
          FROM {schema}.history_attempts
         WHERE start = ANY($1::timestamptz[]) AND outcome IN ('done', 'failed')
        UNION ALL
        SELECT a.finished_at, j.queue, j.kind, a.outcome, 1
          FROM unnest($2::timestamptz[], $3::timestamptz[]) AS r(lo, hi)
          JOIN {schema}.attempts AS a ON a.finished_at >= r.lo AND a.finished_at < r.hi
         CROSS JOIN LATERAL (SELECT queue, kind FROM {schema}.jobs WHERE id = a.job_id LIMIT 1) AS j
         WHERE a.outcome IN ('done', 'failed')) AS c
 GROUP BY 1, 2, 3
 ORDER BY 1, 2, 3;

-- name: history_latency_series
-- Enqueue-to-start latency histogram buckets of first tries per time bucket of $4 seconds and queue: the roll-ups of the slices starting at $1 (an array), plus the attempts finished in the ranges [$2[i], $3[i]) that no slice covers.
SELECT to_timestamp(floor(extract(epoch FROM b.at) / $4::float8) * $4::float8) AS bucket, b.queue, b.bucket AS latency_bucket,
       sum(b.jobs)::bigint AS jobs
  FROM (SELECT start AS at, queue, bucket, jobs
          FROM {schema}.history_latency
         WHERE start = ANY($1::timestamptz[]) AND measure = 'start'
        UNION ALL
        SELECT a.finished_at, j.queue,
               greatest(0, floor(2 * ln(greatest(1.0, extract(epoch FROM a.started_at - j.created_at)::float8 * 1000)) / ln(2.0)))::smallint,
               1
          FROM unnest($2::timestamptz[], $3::timestamptz[]) AS r(lo, hi)
          JOIN {schema}.attempts AS a ON a.finished_at >= r.lo AND a.finished_at < r.hi
         CROSS JOIN LATERAL (SELECT queue, created_at FROM {schema}.jobs WHERE id = a.job_id LIMIT 1) AS j
         WHERE a.attempt = 1 AND a.started_at IS NOT NULL) AS b
 GROUP BY 1, 2, 3
 ORDER BY 1, 2, 3;
