-- joblane schema, version 15: promoted rows leave `deferred`.
--
-- Version 13 appended a row to `deferred` for every job made pending ahead of
-- its time (scheduled, retried with a delay, snoozed) and promoted it into
-- `ready` when due, but kept the row: the table grew with every delayed job.
-- prune_deferred deletes the rows the promotion has certainly taken.
--
-- A row is certainly taken when it was due by the time of the promotion's
-- latest round (lane 0's cursor, `at`) and its transaction ended before that
-- round's snapshot (`lo`) was taken (xid below the snapshot's xmin: committed,
-- so the round or an earlier one saw it and promoted it, or rolled back).
-- A row of a transaction that was still running then stays for a later round.
--
-- The promotion never walks the deleted rows: it reads `deferred` from its
-- cursor's time on (deferred_due) and from its snapshot's xmax on
-- (deferred_xid), both past them. The pruner calls this only while no session
-- holds the horizon back (then vacuum can take the dead rows away), in
-- batches of p_limit, the oldest due first. It runs as the schema's owner, so
-- the worker role needs no DELETE on the table; it deletes nothing a claim
-- could still need, so any role may call it.
CREATE FUNCTION {schema}.prune_deferred(p_limit integer)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c record;
    v_n integer;
BEGIN
    SELECT cu.lo, cu.at INTO c
      FROM {schema}.cursors AS cu WHERE cu.lane_id = 0 ORDER BY cu.step DESC LIMIT 1;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    DELETE FROM {schema}.deferred AS d
     WHERE d.ctid = ANY(ARRAY(SELECT x.ctid FROM {schema}.deferred AS x
                               WHERE x.due_at <= c.at AND x.xid < pg_snapshot_xmin(c.lo)
                               ORDER BY x.due_at
                               LIMIT p_limit));
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
