-- 0023_dirty_table_and_failover: state changes for the work of the session of 2026-12-06 (second):
-- claims that stay fast on a table full of dead row versions and fewer bytes per run (issue 30),
-- high availability (issue 35) and the test suite (issue 32).
--
-- Each section below names the issue it answers; the functions that use this state are in
-- sql/functions/ and are re-applied after this file in the same upgrade.
SELECT 1;

-- ===== section: claims on a dirty table (issue 30) =====
-- The claim order gets a last, unique key: run_id. A claim's scan may now start at an exact
-- position of runs_claim_pending_idx (the session's claim floor, sql/functions/internal/claims.sql
-- zeroth._claim_floor) instead of the head of the scope, where the entries of every run claimed or
-- deleted since the last VACUUM sit and cost a heap fetch each while some transaction pins the
-- xmin horizon. Without it the runs of one enqueue_runs batch share (priority, run_after,
-- created_at) and a position inside the batch could not be named. The order of runs with equal
-- (priority, run_after, created_at) was unspecified and is now by run_id.
DROP INDEX zeroth.runs_claim_pending_idx;
CREATE INDEX runs_claim_pending_idx ON zeroth.runs
    (tenant_id, workspace_key, deployment_ref, priority DESC, run_after, created_at, run_id)
    WHERE status = 'pending';
COMMENT ON INDEX zeroth.runs_claim_pending_idx IS 'The pending runs of each scope in claim order (priority DESC, run_after, created_at, run_id): the claims read it from the session''s claim floor (zeroth._claim_floor), or from the head of the scope at least once per bound.';


-- ===== section: per-run cost of the hot path (issue 30) =====

-- ===== section: high availability (issue 35) =====

-- ===== section: test suite (issue 32) =====
