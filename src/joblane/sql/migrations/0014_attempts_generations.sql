-- joblane schema, version 14: attempts by generation (issue 39, build step 4).
--
-- attempts becomes a table partitioned by RANGE on job_id, in generations of
-- 2^20 job ids: generation g holds the tries of jobs [g * 2^20, (g + 1) * 2^20).
-- Its history leaves a generation at a time (TRUNCATE, then DETACH and DROP),
-- which frees the space whatever snapshot is held, instead of row by row.
--
-- No history is copied. The table of version 13 keeps its rows and becomes the
-- first partition, attempts_v10: it covers every job id up to the first
-- generation boundary above the highest job id so far. A CHECK on its job_id
-- (added NOT VALID, then validated: one scan) lets the ATTACH trust its rows
-- without scanning them again. Its indexes become the partitions of the new
-- parent's indexes of the same definitions, so no index is built.
--
-- attempts.id stays an identity, continued from the old one, so ids never
-- collide; it is no longer a primary key (a unique index on a partitioned
-- table must hold the partition key). Each partition has an index on (id)
-- (attempts_v10 keeps its primary key), which list_attempts pages by.
--
-- A partition for each generation is made ahead of the job ids that need it
-- (ensure_attempt_generations: the generation of the highest job id and the
-- next one), by this migration and by the pruner every round. A DEFAULT
-- partition, attempts_carried, takes any try whose generation has no
-- partition (dropped, or never made), so an insert never fails for lack of
-- one; the pruner deletes its rows row by row, as it does those of
-- attempts_v10.
--
-- This migration changes no function of version 13 and reads only the
-- identity sequence of jobs: it applies after any migration 13.

-- the old table, its indexes and its identity, out of the way of the new names
ALTER TABLE {schema}.attempts RENAME TO attempts_v10;
ALTER INDEX {schema}.attempts_pkey RENAME TO attempts_v10_pkey;
ALTER INDEX {schema}.attempts_job RENAME TO attempts_v10_job;
ALTER INDEX {schema}.attempts_finished RENAME TO attempts_v10_finished;
ALTER INDEX {schema}.attempts_model RENAME TO attempts_v10_model;
ALTER INDEX {schema}.attempts_outcome RENAME TO attempts_v10_outcome;

-- The new parent has the columns of the old table (names, types, order,
-- defaults, NOT NULL and CHECK constraints), whatever migrations before this
-- one added to it: LIKE copies them.
CREATE TABLE {schema}.attempts (
    LIKE {schema}.attempts_v10 INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMMENTS
) PARTITION BY RANGE (job_id);

CREATE INDEX attempts_job ON {schema}.attempts (job_id, attempt);
CREATE INDEX attempts_finished ON {schema}.attempts (finished_at);
CREATE INDEX attempts_model ON {schema}.attempts ((meta->>'model'), finished_at)
    WHERE meta->>'model' IS NOT NULL;
CREATE INDEX attempts_outcome ON {schema}.attempts (outcome, finished_at) WHERE outcome <> 'done';

-- The identity moves to the parent, continuing the old sequence (a partition
-- may not have an identity of its own); the job id range of attempts_v10 ends
-- at the first generation boundary above the highest job id (or job_id of a
-- try) so far.
DO $$
DECLARE
    seq regclass := pg_get_serial_sequence('{schema}.attempts_v10', 'id')::regclass;
    next_id bigint;
    top bigint;
    bound bigint;
BEGIN
    EXECUTE format('SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM %s', seq) INTO next_id;
    top := greatest(coalesce(pg_sequence_last_value(pg_get_serial_sequence('{schema}.jobs', 'id')::regclass), 0),
                    coalesce((SELECT max(job_id) FROM {schema}.attempts_v10), 0));
    bound := (greatest(top, 0) / 1048576 + 1) * 1048576;
    ALTER TABLE {schema}.attempts_v10 ALTER COLUMN id DROP IDENTITY;
    EXECUTE format('ALTER TABLE {schema}.attempts ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (START WITH %s)',
                   next_id);
    EXECUTE format('ALTER TABLE {schema}.attempts_v10 ADD CONSTRAINT attempts_v10_job_id_check'
                   ' CHECK (job_id < %s) NOT VALID', bound);
    ALTER TABLE {schema}.attempts_v10 VALIDATE CONSTRAINT attempts_v10_job_id_check;
    EXECUTE format('ALTER TABLE {schema}.attempts ATTACH PARTITION {schema}.attempts_v10'
                   ' FOR VALUES FROM (MINVALUE) TO (%s)', bound);
END
$$;

CREATE TABLE {schema}.attempts_carried PARTITION OF {schema}.attempts DEFAULT
    WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
          autovacuum_vacuum_insert_scale_factor = 0.02, autovacuum_vacuum_cost_limit = 2000,
          autovacuum_vacuum_cost_delay = 1);
CREATE INDEX attempts_carried_id ON {schema}.attempts_carried (id);

-- The partitions of attempts with their job id ranges [lo, hi): lo is NULL
-- for MINVALUE (attempts_v10), lo and hi are NULL for the DEFAULT partition.
-- Read from the catalog, so a partition made or dropped is seen at once.
CREATE FUNCTION {schema}.attempt_partitions()
RETURNS TABLE (part regclass, lo bigint, hi bigint)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT c.oid::regclass,
           CASE WHEN b[1] <> 'MINVALUE' THEN b[1]::bigint END,
           b[2]::bigint
      FROM pg_inherits AS i
      JOIN pg_class AS c ON c.oid = i.inhrelid
      LEFT JOIN LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid),
                                     '^FOR VALUES FROM \(''?([^'')]*)''?\) TO \(''?([^'')]*)''?\)$') AS b ON true
     WHERE i.inhparent = '{schema}.attempts'::regclass
     ORDER BY 2 NULLS FIRST, 3 NULLS LAST;
$$;

-- Make the partitions of the generation of the highest job id and of the next
-- one, where none covers them yet; returns how many it made. Cheap when they
-- exist (a catalog read). A generation some of whose tries already went to
-- attempts_carried (no partition was there in time) is left to it: a
-- partition cannot be made over rows the DEFAULT partition holds. Runs as
-- the schema's owner, who alone may add partitions; the pruner calls it
-- under a short lock_timeout (adding a partition locks the parent briefly).
CREATE FUNCTION {schema}.ensure_attempt_generations()
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    size constant bigint := 1048576;
    top bigint := greatest(coalesce(pg_sequence_last_value(pg_get_serial_sequence('{schema}.jobs', 'id')::regclass), 0), 0);
    g bigint;
    g_lo bigint;
    made integer := 0;
BEGIN
    FOREACH g IN ARRAY ARRAY[top / size, top / size + 1] LOOP
        g_lo := g * size;
        CONTINUE WHEN EXISTS (SELECT 1 FROM {schema}.attempt_partitions() AS p
                               WHERE p.hi > g_lo AND (p.lo IS NULL OR p.lo < g_lo + size));
        CONTINUE WHEN EXISTS (SELECT 1 FROM {schema}.attempts AS a WHERE a.job_id >= g_lo AND a.job_id < g_lo + size);
        EXECUTE format('CREATE TABLE {schema}.%I PARTITION OF {schema}.attempts FOR VALUES FROM (%s) TO (%s)'
                       ' WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,'
                       ' autovacuum_vacuum_insert_scale_factor = 0.02, autovacuum_vacuum_cost_limit = 2000,'
                       ' autovacuum_vacuum_cost_delay = 1)', 'attempts_g' || g, g_lo, g_lo + size);
        EXECUTE format('CREATE INDEX %I ON {schema}.%I (id)', 'attempts_g' || g || '_id', 'attempts_g' || g);
        made := made + 1;
    END LOOP;
    RETURN made;
END
$$;

-- Why generation p_part (a partition of attempts with an upper bound) must stay,
-- or NULL when it may go: a job id in its range may still be handed out, a
-- job in its range is unfinished (or failed, unless p_prune_failed), or
-- finished p_retention seconds ago or less, or one of its tries finished
-- then. Jobs deleted count as finished (the pruner deletes only jobs past the
-- retention; a lean success leaves no try).
CREATE FUNCTION {schema}.attempt_generation_kept(p_part regclass, p_retention float8, p_prune_failed boolean)
RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_lo bigint;
    v_hi bigint;
    cutoff timestamptz := now() - make_interval(secs => p_retention);
    stays bigint;
BEGIN
    SELECT coalesce(p.lo, -9223372036854775808), p.hi INTO v_lo, v_hi
      FROM {schema}.attempt_partitions() AS p WHERE p.part = p_part AND p.hi IS NOT NULL;
    IF NOT FOUND THEN
        RETURN 'not a generation of attempts';
    END IF;
    IF v_hi - 1 > coalesce(pg_sequence_last_value(pg_get_serial_sequence('{schema}.jobs', 'id')::regclass), 0) THEN
        RETURN 'job ids of the generation are still to be handed out';
    END IF;
    SELECT j.id INTO stays FROM {schema}.jobs AS j
     WHERE j.id >= v_lo AND j.id < v_hi
       AND NOT coalesce((j.state IN ('done', 'cancelled') OR (j.state = 'failed' AND p_prune_failed))
                        AND j.finished_at < cutoff, false)
     ORDER BY j.id
     LIMIT 1;
    IF FOUND THEN
        RETURN format('job %s is unfinished, kept or finished within the retention', stays);
    END IF;
    IF EXISTS (SELECT 1 FROM {schema}.attempts AS a WHERE a.job_id >= v_lo AND a.job_id < v_hi AND a.finished_at >= cutoff) THEN
        RETURN 'a try finished within the retention';
    END IF;
    RETURN NULL;
END
$$;

-- One step of taking a generation away, for the pruner (it runs each step in
-- a transaction of its own, under a short lock_timeout):
-- - 'kept: <why>' when it must stay (attempt_generation_kept);
-- - 'truncated' when it held rows: they are gone, under a lock on the
--   partition alone, taken before the conditions are checked again;
-- - 'dropped' when it was empty: detached (a brief lock on attempts) and
--   dropped, unless a try arrived since the truncation ('kept: ...').
-- Runs as the schema's owner; only partitions of attempts are touched.
CREATE FUNCTION {schema}.retire_attempt_generation(p_part regclass, p_retention float8, p_prune_failed boolean)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    why text := {schema}.attempt_generation_kept(p_part, p_retention, p_prune_failed);
    has_rows boolean;
BEGIN
    IF why IS NOT NULL THEN
        RETURN 'kept: ' || why;
    END IF;
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s)', p_part) INTO has_rows;
    IF has_rows THEN
        EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', p_part);
        why := {schema}.attempt_generation_kept(p_part, p_retention, p_prune_failed);
        IF why IS NOT NULL THEN
            RETURN 'kept: ' || why;
        END IF;
        EXECUTE format('TRUNCATE %s', p_part);
        RETURN 'truncated';
    END IF;
    BEGIN
        EXECUTE format('ALTER TABLE {schema}.attempts DETACH PARTITION %s', p_part);
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s)', p_part) INTO has_rows;
        IF has_rows THEN
            RAISE EXCEPTION 'a try arrived after the truncation' USING ERRCODE = 'JL001';
        END IF;
        EXECUTE format('DROP TABLE %s', p_part);
    EXCEPTION WHEN SQLSTATE 'JL001' THEN
        RETURN 'kept: a try arrived after the truncation';
    END;
    RETURN 'dropped';
END
$$;

REVOKE ALL ON FUNCTION {schema}.ensure_attempt_generations() FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.retire_attempt_generation(regclass, float8, boolean) FROM PUBLIC;

SELECT {schema}.ensure_attempt_generations();
