-- Named queries of the job lifecycle: enqueue, claim, heartbeat, finish, rescue.
-- Each block starts with "-- name: <name>" and a one-line description.
-- {schema} is the validated, quoted schema name; every value is a $n parameter.

-- name: enqueue
-- Insert one job in the caller's transaction; notify idle workers in the same round trip when $11.
--
-- $13 is the trace context (telemetry.py), NULL unless a span is active.
WITH inserted AS (
    INSERT INTO {schema}.jobs
           (queue, kind, payload, priority, max_attempts, run_after, unique_key, state, replay_of, headers)
    VALUES ($1, $2, $3::text::jsonb, $4, $5,
            coalesce($6::timestamptz, now()) + make_interval(secs => $7::float8),
            $8, $9, $10, $13::text::jsonb)
    -- A duplicate unfinished unique_key is skipped instead of raising, so the
    -- caller's transaction is never aborted by a unique violation.
    ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND state IN ('pending', 'running', 'held')
    DO NOTHING
    RETURNING id, queue
)
SELECT id, CASE WHEN $11::bool THEN pg_notify($12, queue)::text END AS notified
  FROM inserted;

-- name: enqueue_plain
-- ``enqueue`` of a job without a unique key: the same row and the same wake-up, through insert_job.
--
-- With no key there is nothing to conflict on, so no ON CONFLICT arbiter (a
-- speculative insert and its confirmation record) and no CTE; the function
-- keeps its INSERT's plan for the session, so the unprepared call is cheap to
-- plan (migration 0007). $12 is the trace context.
SELECT {schema}.insert_job($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12);

-- name: endpoints
-- Both ends of this session's connection as the server sees them, its port and its socket directories (NULL unless readable).
--
-- App(prepare=None) prepares enqueue and publish on a connection whose ends
-- match what the client's socket says (store.reaches_server): then nothing
-- stands between them that could hand the session's prepared statements to
-- another client. host() drops the netmask; unix_socket_directories is read
-- through pg_settings, which leaves it out for a role without
-- pg_read_all_settings instead of raising in the caller's transaction.
SELECT host(inet_client_addr()), inet_client_port(), host(inet_server_addr()), inet_server_port(),
       current_setting('port'),
       (SELECT setting FROM pg_settings WHERE name = 'unix_socket_directories');

-- name: unfinished_by_unique_key
-- The unfinished job holding a unique_key (after enqueue skipped a duplicate).
SELECT id FROM {schema}.jobs
 WHERE unique_key = $1 AND state IN ('pending', 'running', 'held', 'waiting');

-- name: enqueue_many
-- Insert many jobs that differ only in payload (one kind, queue, priority, ... for all), none with a unique key: payloads $1 (a JSON array); wakes queues $10 once.
--
-- The bulk enqueue of one task: the payloads travel as one JSON array (one
-- C call to encode, one for the server to parse), everything else once.
-- Without a unique key there is no ON CONFLICT: each row is a plain insert,
-- not a speculative one.
-- The notifications are an init plan in the argument of the function that
-- reads the payloads, so they run once, before the first row: one per queue
-- per statement, however many rows. (As a WHERE clause the same init plan
-- costs a Result node per row, about a tenth of the statement.) The run_after
-- all the jobs share is an init plan too: computed once, not once a row.
INSERT INTO {schema}.jobs (queue, kind, payload, priority, max_attempts, run_after, state)
SELECT $2::text, $3::text, p.value, $4::smallint, $5::int,
       (SELECT coalesce($6::timestamptz, now()) + make_interval(secs => $7::float8)), $8::text
  FROM jsonb_array_elements(
           CASE WHEN (SELECT count(pg_notify($9, q.name)) FROM unnest($10::text[]) AS q(name)) >= 0
                THEN $1::text::jsonb END) AS p
RETURNING id;

-- name: enqueue_many_varied
-- Insert many jobs, none with a unique key, in one statement: payloads $1 (a JSON array); each column one value for all ($2-$9) or one per job ($10-$17, JSON arrays); wakes queues $19 once.
--
-- A column the jobs share travels as one value, and only the columns that
-- differ travel as JSON arrays, one element per job; ROWS FROM zips them
-- with the payloads (an absent array gives NULL, and the shared value
-- stands in). JSON text costs the client one C call per column, where array
-- parameters cost a Python call per element, and the server parses it in C.
-- The notifications run once, before the first row, as in enqueue_many.
INSERT INTO {schema}.jobs (queue, kind, payload, priority, max_attempts, run_after, unique_key, state)
SELECT coalesce(t.queue, $2::text), coalesce(t.kind, $3::text), t.payload,
       coalesce(t.priority::smallint, $4::smallint), coalesce(t.max_attempts::int, $5::int),
       coalesce(t.run_after::timestamptz, $6::timestamptz, now())
           + make_interval(secs => coalesce(t.delay::float8, $7::float8)),
       coalesce(t.unique_key, $8::text), coalesce(t.state, $9::text)
  FROM ROWS FROM (jsonb_array_elements(
                      CASE WHEN (SELECT count(pg_notify($18, q.name)) FROM unnest($19::text[]) AS q(name)) >= 0
                           THEN $1::text::jsonb END),
                  jsonb_array_elements_text($10::text::jsonb), jsonb_array_elements_text($11::text::jsonb),
                  jsonb_array_elements_text($12::text::jsonb), jsonb_array_elements_text($13::text::jsonb),
                  jsonb_array_elements_text($14::text::jsonb), jsonb_array_elements_text($15::text::jsonb),
                  jsonb_array_elements_text($16::text::jsonb), jsonb_array_elements_text($17::text::jsonb))
       AS t(payload, queue, kind, priority, max_attempts, run_after, delay, unique_key, state)
RETURNING id;

-- name: enqueue_many_unique
-- enqueue_many_varied for jobs some of which have a unique key: a job whose key an unfinished job holds is skipped.
--
-- The same statement as enqueue_many_varied with the arbiter of the partial
-- unique index: every row becomes a speculative insert (an extra WAL record
-- and a lock each), which is why key-less chunks use the other two. A skipped job
-- returns no id; its queue may still be woken (a claim that finds nothing).
INSERT INTO {schema}.jobs (queue, kind, payload, priority, max_attempts, run_after, unique_key, state)
SELECT coalesce(t.queue, $2::text), coalesce(t.kind, $3::text), t.payload,
       coalesce(t.priority::smallint, $4::smallint), coalesce(t.max_attempts::int, $5::int),
       coalesce(t.run_after::timestamptz, $6::timestamptz, now())
           + make_interval(secs => coalesce(t.delay::float8, $7::float8)),
       coalesce(t.unique_key, $8::text), coalesce(t.state, $9::text)
  FROM ROWS FROM (jsonb_array_elements(
                      CASE WHEN (SELECT count(pg_notify($18, q.name)) FROM unnest($19::text[]) AS q(name)) >= 0
                           THEN $1::text::jsonb END),
                  jsonb_array_elements_text($10::text::jsonb), jsonb_array_elements_text($11::text::jsonb),
                  jsonb_array_elements_text($12::text::jsonb), jsonb_array_elements_text($13::text::jsonb),
                  jsonb_array_elements_text($14::text::jsonb), jsonb_array_elements_text($15::text::jsonb),
                  jsonb_array_elements_text($16::text::jsonb), jsonb_array_elements_text($17::text::jsonb))
       AS t(payload, queue, kind, priority, max_attempts, run_after, delay, unique_key, state)
    -- A duplicate unfinished unique_key is skipped instead of raising, so the
    -- caller's transaction is never aborted by a unique violation.
    ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND state IN ('pending', 'running', 'held')
    DO NOTHING
RETURNING id;

-- name: claim_jobs
-- Claim up to $2 ready jobs from queues $1 for worker $3, leased for $4 seconds, in one statement.
--
-- The statement lives in the function claim_jobs (migration 0008, read from a
-- cursor per lane since 0013), which keeps its plan for the session on the
-- server. Its fifth argument asks for a last row of NULLs when the worker
-- should claim again at once (store.claimed_rows; migration 0016).
SELECT * FROM {schema}.claim_jobs($1::text[], $2::int, $3::text, $4::float8, true);

-- name: complete_jobs
-- Write many outcomes (a JSON array, store.outcome_rows) at once; a row changes only while it is still running this attempt for worker $2.
--
-- The guard (state, attempts, worker) makes a late or repeated write a no-op:
-- a job that was rescued, cancelled or re-claimed meanwhile is left alone,
-- and only the rows that applied get an attempts row. The outcomes come as
-- one jsonb document: the server parses it in C, where eleven array
-- parameters would cost the worker more to encode than the update costs. An
-- object may leave out a field that is null, and delay and refund when 0.
-- A job named twice in one document (one try run twice, a failed batch put
-- back beside its copy) takes its first-finished outcome only: the update
-- would apply one copy, the attempts row must be that copy's, and only one.
WITH outcome AS (
    SELECT DISTINCT ON (id) *
      FROM jsonb_to_recordset($1::text::jsonb)
           AS o(id bigint, attempt int, state text, outcome text, error text, delay float8, refund int,
                result jsonb, started_at float8, finished_at float8, meta jsonb)
     ORDER BY id, finished_at
), applied AS (
    UPDATE {schema}.jobs AS j
       SET state = o.state,
           attempts = j.attempts - coalesce(o.refund, 0),
           last_error = coalesce(o.error, j.last_error),
           result = coalesce(o.result, j.result),
           run_after = CASE WHEN o.state = 'pending'
                            THEN now() + make_interval(secs => coalesce(o.delay, 0))
                            ELSE j.run_after END,
           lease_until = NULL,
           worker = NULL,
           finished_at = CASE WHEN o.state IN ('done', 'failed', 'cancelled') THEN now() END
      FROM outcome AS o
     -- "j.id = ANY(...)" is the primary-key path to the rows; the state test is written so that it
     -- cannot match jobs_lease's predicate (see extend_leases), which keeps the planner on that path
     WHERE j.id = ANY(ARRAY(SELECT id FROM outcome)) AND j.id = o.id
       AND (j.state = 'running') IS TRUE AND j.attempts = o.attempt AND j.worker = $2
 RETURNING j.id
), audit AS (
    INSERT INTO {schema}.attempts (job_id, attempt, worker, started_at, finished_at, outcome, error, meta)
    SELECT o.id, o.attempt, $2, to_timestamp(o.started_at), coalesce(to_timestamp(o.finished_at), now()),
           o.outcome, o.error, o.meta
      FROM outcome AS o
      JOIN applied USING (id)
)
SELECT id FROM applied;

-- name: delete_done
-- Lean completion (App.task(lean=True)): delete jobs $1, each still running try $2 for worker $3; returns the ids finished.
--
-- The same guard as complete_jobs, so a late or repeated write is a no-op.
-- A deleted job takes its checkpointed steps and the attempts rows of its
-- earlier tries along (nothing would prune them otherwise); a first try
-- that succeeds has none of the latter, so that probe is skipped. A job that
-- other jobs wait for (has_children) or that belongs to a batch is not
-- deleted but set done, without an attempts row: the jobs_flow trigger
-- releases its children or closes its batch as for any completion.
--
-- The DELETE checks the guard itself, with no row locked first: a lock
-- before the delete costs a second WAL record per job (as much as the
-- delete). A job linked by a transaction that commits while this one waits
-- for its row fails the delete's re-check; the UPDATE then takes every
-- guarded job the delete did not, so it is set done instead.
WITH gone AS (
    DELETE FROM {schema}.jobs AS j
     WHERE j.id = ANY($1::bigint[]) AND (j.state = 'running') IS TRUE AND j.worker = $3
       AND j.attempts = ($2::int[])[array_position($1::bigint[], j.id)]
       AND j.has_children IS NOT TRUE AND j.batch_id IS NULL
 RETURNING j.id, j.attempts
), kept AS (
    UPDATE {schema}.jobs AS j
       SET state = 'done', lease_until = NULL, worker = NULL, finished_at = now()
     WHERE (SELECT count(*) FROM gone) < cardinality($1::bigint[])  -- once: when every job went, no scan
       AND j.id = ANY($1::bigint[]) AND j.id NOT IN (SELECT id FROM gone)
       AND (j.state = 'running') IS TRUE AND j.worker = $3
       AND j.attempts = ($2::int[])[array_position($1::bigint[], j.id)]
 RETURNING j.id
), steps AS (
    DELETE FROM {schema}.job_steps AS s WHERE s.job_id = ANY(ARRAY(SELECT id FROM gone))
), earlier AS (
    DELETE FROM {schema}.attempts AS a WHERE a.job_id = ANY(ARRAY(SELECT id FROM gone WHERE attempts > 1))
)
SELECT id FROM gone
UNION ALL
SELECT id FROM kept;

-- name: extend_leases
-- Heartbeat: extend the leases of the jobs worker $2 still runs; returns those it still owns.
--
-- "(state = 'running') IS TRUE" is "state = 'running'" (state is never
-- NULL) in a form the planner cannot match to jobs_lease's predicate. Where
-- it can, it reads every running job of every worker through that index and
-- tests each against the whole id array (two linear searches a row in
-- delete_done); through the primary key it reads the jobs named and no
-- others, however many run elsewhere. complete_jobs and delete_done test the
-- state the same way.
UPDATE {schema}.jobs
   SET lease_until = now() + make_interval(secs => $3::float8)
 WHERE id = ANY($1::bigint[]) AND (state = 'running') IS TRUE AND worker = $2
RETURNING id;

-- name: rotate_ready
-- Turn the ring of ready entries and cursor rows every $1 seconds, and empty the slots left behind that no claim can need (migration 0013); returns what it did.
SELECT {schema}.rotate_ready($1::float8);

-- name: prune_deferred
-- Delete up to $1 rows of deferred that the promotion has certainly taken into ready (migration 0015); returns how many.
SELECT {schema}.prune_deferred($1::int);

-- name: rescue_expired
-- Give back up to $1 running jobs whose lease expired: pending again, or failed when out of attempts.
WITH lost AS (
    SELECT id, worker, started_at
      FROM {schema}.jobs
     WHERE state = 'running' AND lease_until < now()
     ORDER BY lease_until
     LIMIT $1
       FOR UPDATE SKIP LOCKED
), rescued AS (
    UPDATE {schema}.jobs AS j
       SET state = CASE WHEN j.attempts >= j.max_attempts THEN 'failed' ELSE 'pending' END,
           last_error = 'worker ' || coalesce(lost.worker, '?') || ' was lost during attempt '
                        || j.attempts || ' (its lease expired)',
           lease_until = NULL,
           worker = NULL,
           run_after = now(),
           finished_at = CASE WHEN j.attempts >= j.max_attempts THEN now() END
      FROM lost
     WHERE j.id = ANY(ARRAY(SELECT id FROM lost)) AND j.id = lost.id
 RETURNING j.id, j.state, j.attempts, lost.worker, lost.started_at, j.last_error
), audit AS (
    INSERT INTO {schema}.attempts (job_id, attempt, worker, started_at, outcome, error)
    SELECT id, attempts, worker, started_at, 'lost', last_error FROM rescued
)
SELECT id, state FROM rescued;

-- name: prune_finished
-- Delete up to $3 jobs done or cancelled more than $1 seconds ago (failed ones too when $2), with their attempts and steps.
--
-- The oldest first through jobs_finished, and every delete by index on an
-- array of ids: joined to the picked rows instead, the planner hashes the
-- whole attempts table each round, a cost that grows with the history kept.
-- No row lock ahead of the delete (it would write each row twice): the
-- delete repeats the conditions, so a job retried meanwhile is re-checked
-- and kept, and only the jobs it deleted lose their attempts and steps.
WITH gone AS (
    DELETE FROM {schema}.jobs
     WHERE id = ANY(ARRAY(SELECT id
                            FROM {schema}.jobs
                           WHERE state IN ('done', 'failed', 'cancelled')
                             AND (state <> 'failed' OR $2::bool)
                             AND finished_at < now() - make_interval(secs => $1::float8)
                           ORDER BY finished_at
                           LIMIT $3))
       AND state IN ('done', 'failed', 'cancelled')
       AND (state <> 'failed' OR $2::bool)
       AND finished_at < now() - make_interval(secs => $1::float8)
    RETURNING id
), gone_attempts AS (
    -- only the tries in attempts_v10 and attempts_carried: a generation's
    -- partition leaves whole (retire_attempt_generation), never row by row
    DELETE FROM {schema}.attempts AS a
     WHERE a.job_id = ANY(ARRAY(SELECT id FROM gone))
       AND NOT EXISTS (SELECT 1 FROM {schema}.attempt_partitions() AS p
                        WHERE p.lo IS NOT NULL AND a.job_id >= p.lo AND a.job_id < p.hi)
), gone_steps AS (
    DELETE FROM {schema}.job_steps WHERE job_id = ANY(ARRAY(SELECT id FROM gone))
), gone_deps AS (
    -- dependencies of finished children (a finished parent's edges go with its children)
    DELETE FROM {schema}.job_deps WHERE child_id = ANY(ARRAY(SELECT id FROM gone))
)
SELECT id FROM gone;

-- name: ensure_attempt_generations
-- Make the partitions of attempts for the generation of the highest job id and the next one, where missing; how many were made.
SELECT {schema}.ensure_attempt_generations();

-- name: attempt_generations
-- The partitions of attempts that hold a range of job ids (attempts_v10 and the generations; not attempts_carried), oldest first.
SELECT part::text FROM {schema}.attempt_partitions() WHERE hi IS NOT NULL ORDER BY hi;

-- name: retire_attempt_generation
-- One step of taking generation $1 of attempts away when every job in it finished more than $2 seconds ago (failed ones count when $3): 'truncated', 'dropped' or 'kept: <why>'.
SELECT {schema}.retire_attempt_generation($1::text::regclass, $2::float8, $3::bool);

-- name: short_lock_timeout
-- Give up on a lock after 100 ms for the rest of the transaction (a partition's TRUNCATE, DETACH or DROP, left for the next round).
SET LOCAL lock_timeout = '100ms';

-- name: lock_holder
-- The session that has held a lock on table $1 or on attempts longest (what a lock_timeout waited for): kind, who, application, user, state, seconds, query, xid age.
SELECT 'session'::text AS kind, a.pid::text AS who, a.application_name::text AS application,
       a.usename::text AS username, a.state::text AS state,
       extract(epoch FROM now() - coalesce(a.xact_start, a.query_start, a.backend_start))::float8 AS seconds,
       left(a.query, 300) AS query, age(coalesce(a.backend_xmin, a.backend_xid)) AS xid_age
  FROM pg_locks AS l
  JOIN pg_stat_activity AS a ON a.pid = l.pid
 WHERE l.locktype = 'relation' AND l.granted AND l.pid <> pg_backend_pid()
   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND l.relation IN (to_regclass($1::text), '{schema}.attempts'::regclass)
 ORDER BY a.xact_start NULLS LAST, a.pid
 LIMIT 1;

-- name: job_steps
-- The finished steps of job $1 (name, result as JSON text), read once per try on its first step.
SELECT name, result::text FROM {schema}.job_steps WHERE job_id = $1;

-- name: save_step
-- Record a finished step of job $1 (a repeat of the same name keeps the first result).
INSERT INTO {schema}.job_steps (job_id, name, attempt, result)
VALUES ($1, $2, $3, $4::text::jsonb)
ON CONFLICT (job_id, name) DO NOTHING;

-- name: try_service_lock
-- Take the transaction-scoped advisory lock that lets one worker at a time run a service.
SELECT pg_try_advisory_xact_lock($1::bigint);

-- name: note_late_outcomes
-- Keep the trace of outcomes that arrived after their job was rescued or cancelled: meta.late on that try's attempts row.
--
-- complete_jobs applies an outcome only while the job still runs that
-- attempt for that worker. One that arrives later (the worker lost its lease
-- while the task ran on) changes nothing in jobs; its result is kept here, on
-- the 'lost' or 'cancelled' row the rescue or the cancel wrote for that try.
-- A try the task finished itself (complete_job in its own transaction) has
-- its 'done' row already: nothing to note.
WITH late AS (
    SELECT o.id, o.attempt, o.outcome, o.error, o.finished_at
      FROM jsonb_to_recordset($1::text::jsonb)
           AS o(id bigint, attempt int, outcome text, error text, finished_at float8)
)
UPDATE {schema}.attempts a
   SET meta = coalesce(a.meta, '{}'::jsonb) || jsonb_build_object('late', jsonb_build_object(
           'outcome', l.outcome, 'error', l.error, 'worker', $2::text,
           'finished_at', to_timestamp(l.finished_at)))
  FROM late l
 WHERE a.job_id = l.id AND a.attempt = l.attempt AND a.outcome IN ('lost', 'cancelled')
RETURNING a.job_id;

-- name: register_process
-- Register worker or relay $1 (role $2) with its host, pid, version, queues, kinds and concurrency; leased for $9 seconds.
INSERT INTO {schema}.processes (name, role, host, pid, version, queues, kinds, concurrency, lease_until)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now() + make_interval(secs => $9::float8))
ON CONFLICT (name) DO UPDATE
   SET role = excluded.role, host = excluded.host, pid = excluded.pid, version = excluded.version,
       queues = excluded.queues, kinds = excluded.kinds, concurrency = excluded.concurrency,
       last_seen = now(), lease_until = excluded.lease_until;

-- name: heartbeat_process
-- Process $1 is alive with $2 jobs running, stopping as $4 says (JSON text, NULL while it runs normally): extend its registration by $3 seconds; returns nothing when it was dropped.
UPDATE {schema}.processes
   SET running = $2, last_seen = now(), lease_until = now() + make_interval(secs => $3::float8),
       stopping = $4::text::jsonb
 WHERE name = $1
RETURNING name;

-- name: deregister_process
-- Process $1 stops: remove its registration.
DELETE FROM {schema}.processes WHERE name = $1;

-- name: kind_known_live
-- Whether a live worker other than $2 knows task kind $1 (its registration not expired).
SELECT EXISTS (
    SELECT 1 FROM {schema}.processes
     WHERE kinds @> ARRAY[$1::text] AND role = 'worker' AND name <> $2 AND lease_until > now()
);

-- name: prune_processes
-- Delete registrations whose lease ran out more than $1 seconds ago (their process died).
DELETE FROM {schema}.processes
 WHERE lease_until < now() - make_interval(secs => $1::float8)
RETURNING name;

-- name: vacuum_due
-- Which of tables $2 in schema $1 hold at least $3 dead row versions and had no vacuum for $4 seconds, among those this role may vacuum; with the seconds since their last vacuum.
--
-- The statistics come from the functions behind pg_stat_all_tables, called
-- for these tables alone: the view computes its columns for every table of
-- the database (and sums the index scans of each), about 12 ms on a database
-- of a few hundred tables, where this reads two rows of pg_class (0.2 ms).
SELECT c.relname::text, s.dead, coalesce(extract(epoch FROM now() - s.last)::float8, 'Infinity')
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
 CROSS JOIN LATERAL (SELECT pg_stat_get_dead_tuples(c.oid) AS dead,
                            greatest(pg_stat_get_last_autovacuum_time(c.oid), pg_stat_get_last_vacuum_time(c.oid)) AS last) AS s
 WHERE n.nspname = $1 AND c.relname = ANY($2::text[]) AND c.relkind = 'r'
   AND s.dead >= $3
   AND coalesce(s.last, '-infinity') < now() - make_interval(secs => $4::float8)
   AND pg_has_role(c.relowner, 'USAGE')
 ORDER BY s.dead DESC;

-- name: dead_rows
-- The dead row versions of table $2 in schema $1 now, by the statistics (after a vacuum: those it could not remove).
SELECT pg_stat_get_dead_tuples(c.oid)
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind = 'r';

-- name: horizon_holder
-- The oldest of what holds back vacuum's horizon for this database's tables: kind, who, application, user, state, seconds, query, xid age.
--
-- A session's snapshot (backend_xmin: an open REPEATABLE READ transaction,
-- a long query) or transaction id (backend_xid) in this database, a
-- walsender's hot_standby_feedback, a replication slot's xmin, a prepared
-- transaction: vacuum can remove no row version deleted after the oldest of
-- them began. Sessions of other databases hold only the shared catalogs.
-- Another role's query text reads "<insufficient privilege>" without
-- pg_read_all_stats.
WITH holders AS (
    SELECT 'session'::text AS kind, a.pid::text AS who, a.application_name::text AS application,
           a.usename::text AS username, a.state::text AS state,
           extract(epoch FROM now() - coalesce(a.xact_start, a.query_start, a.backend_start))::float8 AS seconds,
           left(a.query, 300) AS query, age(coalesce(a.backend_xmin, a.backend_xid)) AS xid_age
      FROM pg_stat_activity a
     WHERE coalesce(a.backend_xmin, a.backend_xid) IS NOT NULL AND a.pid <> pg_backend_pid()
       AND (a.datname = current_database() OR a.datname IS NULL)
    UNION ALL
    SELECT 'replication slot', s.slot_name::text, s.plugin::text, NULL, CASE WHEN s.active THEN 'active' ELSE 'inactive' END,
           NULL, NULL, age(s.xmin)
      FROM pg_replication_slots s
     WHERE s.xmin IS NOT NULL
    UNION ALL
    SELECT 'prepared transaction', p.gid, NULL, p.owner::text, 'prepared',
           extract(epoch FROM now() - p.prepared)::float8, NULL, age(p.transaction)
      FROM pg_prepared_xacts p
     WHERE p.database = current_database()
)
SELECT kind, who, application, username, state, seconds, query, xid_age
  FROM holders
 ORDER BY xid_age DESC
 LIMIT 1;

-- name: vacuum_jobs
-- Vacuum the jobs table, unless a vacuum (autovacuum or another worker's) holds it now.
VACUUM (SKIP_LOCKED) {schema}.jobs;

-- name: vacuum_outbox
-- Vacuum the outbox table, unless a vacuum (autovacuum or another relay's) holds it now.
VACUUM (SKIP_LOCKED) {schema}.outbox;
