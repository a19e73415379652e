-- Named queries of periodic jobs (periodic.py): the scheduler that runs inside every worker.
-- Each block starts with "-- name: <name>" and a one-line description.
-- {schema} is the validated, quoted schema name; every value is a $n parameter.

-- name: latest_periodic_ticks
-- The latest recorded tick of each schedule named in $1 (schedules never recorded are absent).
--
-- One probe per name walks the primary key (name, tick) backwards, so the cost
-- does not grow with the history the table keeps.
SELECT s.name, last.tick
  FROM unnest($1::text[]) AS s(name)
 CROSS JOIN LATERAL (
        SELECT t.tick
          FROM {schema}.periodic_ticks AS t
         WHERE t.name = s.name
         ORDER BY t.tick DESC
         LIMIT 1
     ) AS last;

-- name: enqueue_periodic
-- Record the ticks $1/$2 and insert one job for each tick that was not recorded before; notify on channel $10 when $9.
--
-- The tick row is the guard: its primary key lets a tick through once, ever,
-- whichever worker gets there and however late, even after the job it made
-- has finished and left the unique_key index. The job insert reads only the
-- tick rows this statement inserted, so a tick another worker recorded first
-- yields no job here.
WITH due AS (
    SELECT *
      FROM unnest($1::text[], $2::timestamptz[], $3::text[], $4::text[], $5::text[],
                  $6::smallint[], $7::int[], $8::text[])
           AS d(name, tick, queue, kind, payload, priority, max_attempts, unique_key)
), recorded AS (
    INSERT INTO {schema}.periodic_ticks (name, tick)
    SELECT name, tick FROM due
    ON CONFLICT (name, tick) DO NOTHING
    RETURNING name, tick
), inserted AS (
    INSERT INTO {schema}.jobs (queue, kind, payload, priority, max_attempts, unique_key, run_after)
    SELECT d.queue, d.kind, d.payload::jsonb, d.priority, d.max_attempts, d.unique_key, now()
      FROM due AS d
      JOIN recorded AS r ON r.name = d.name AND r.tick = d.tick
    ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND state IN ('pending', 'running', 'held')
    DO NOTHING
    RETURNING id, queue, unique_key
), notified AS (
    SELECT pg_notify($10, queue)
      FROM (SELECT DISTINCT queue FROM inserted) AS q
     WHERE $9::bool
)
-- notified is read once (an init plan) so that its notifications are sent.
SELECT id, unique_key, (SELECT count(*) FROM notified) AS notified FROM inserted;

-- name: prune_periodic_ticks
-- Delete ticks recorded more than $1 seconds ago, keeping the latest tick of every schedule.
DELETE FROM {schema}.periodic_ticks AS t
 WHERE t.tick < now() - make_interval(secs => $1::float8)
   AND EXISTS (SELECT 1 FROM {schema}.periodic_ticks AS later
                WHERE later.name = t.name AND later.tick > t.tick)
RETURNING t.name;
