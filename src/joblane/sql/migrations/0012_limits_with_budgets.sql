-- joblane schema, version 12: rate limits and spend caps on one queue, caps an
-- operator set that outlive worker restarts, and the AI tables pruned.
--
-- A queue may now take limits (queue_limits) and budgets together: both are
-- enforced by one claim statement (claim_jobs_limited) under one lock per
-- queue (a transaction-scoped advisory lock, so it holds whichever of the two
-- tables has rows for the queue). Nothing in the tables changes for that.
--
-- budgets.cap is the cap in force. A worker writes the cap its app declares
-- (App.budget) at every start; it used to overwrite the cap an operator had
-- set with `joblane budgets set NAME --cap N`, silently. Now the declared cap
-- is kept apart (declared_cap) and an operator's cap (cap_source 'operator',
-- since cap_set_at) stands until `joblane budgets reset NAME` returns to the
-- declared one. A budget made from the command line alone has no declared
-- cap. Existing rows take their cap as declared: which of them an operator
-- set cannot be known.
ALTER TABLE {schema}.budgets
    ADD COLUMN declared_cap float8 CHECK (declared_cap > 0),
    ADD COLUMN cap_source text NOT NULL DEFAULT 'code' CHECK (cap_source IN ('code', 'operator')),
    ADD COLUMN cap_set_at timestamptz;
UPDATE {schema}.budgets SET declared_cap = cap;

-- What a lean task's successful try cost (App.task(lean=True) deletes the job
-- and writes no attempts row, where the fold reads a try's cost): written by
-- the completer when the try recorded one; the fold takes it before the estimate.
ALTER TABLE {schema}.budget_holds ADD COLUMN cost float8;

-- The pruner removes cached results past their expiry and claims on a key that
-- ran out (their job died); each walk reads only what is due.
CREATE INDEX step_cache_expires ON {schema}.step_cache (expires_at) WHERE state = 'done';
CREATE INDEX step_cache_claims ON {schema}.step_cache (claimed_until) WHERE state = 'running';
