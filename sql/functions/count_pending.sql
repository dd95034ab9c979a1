-- count_pending: the pending runs of one deployment in one scope — what a worker's queue-depth
-- gauge reads. A worker role has no table privileges, so it gets this read instead of the
-- views. Uses runs_claim_pending_idx. No locks. Raises nothing. Time: none.
CREATE OR REPLACE FUNCTION zeroth.count_pending(
    deployment_ref text,
    tenant_id      text DEFAULT NULL,
    workspace_id   text DEFAULT NULL)
    RETURNS bigint
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    -- JIT off, as in every function that turns a plan node off: a statement that cannot avoid
    -- the node (a LATERAL row lock needs a nested loop) is costed at 1e10 and JIT-compiled at
    -- each execution, 0.3-1.1 s of CPU where the server has LLVM (docs/performance.md, "JIT").
    SET jit = off
    -- Through runs_claim_pending_idx whatever the statistics say: the runs in claim order with
    -- sequential scans, bitmap scans and sorts off leave its (index-only) scan as the one plan.
    -- Statistics taken while the table held mostly pending runs (an autoanalyze early in a cold
    -- start) made the planner count by a sequential scan of the whole table as it grew with
    -- finished runs (PostgreSQL 15, W = 64 bench: 3,661 blocks a call at 66,000 runs, growing
    -- with the table; issue 30), and with only those off, by the smaller
    -- runs_created_not_running_idx, every finished run's entry read.
    -- (tests/plans/test_dirty_claim.py, count_pending on a grown table.)
    SET enable_seqscan = off
    SET enable_bitmapscan = off
    SET enable_sort = off
    RETURN (SELECT count(*) FROM (
              SELECT 1 FROM zeroth.runs r
               WHERE r.tenant_id = zeroth._scope_tenant(count_pending.tenant_id, count_pending.workspace_id)
                 AND r.workspace_key = zeroth._workspace_key(count_pending.workspace_id)
                 AND r.deployment_ref = count_pending.deployment_ref
                 AND r.status = 'pending'
               ORDER BY r.priority DESC, r.run_after, r.created_at) pending);
COMMENT ON FUNCTION zeroth.count_pending(text, text, text) IS
'count_pending: number of pending runs of a deployment in a scope (the worker''s queue-depth gauge); read only, through runs_claim_pending_idx. Raises nothing.';
ALTER FUNCTION zeroth.count_pending(text, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.count_pending(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.count_pending(text, text, text) TO zeroth_worker;
