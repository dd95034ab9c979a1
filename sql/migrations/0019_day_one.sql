-- 0019_day_one: state changes for the work of the session of 2026-12-05 (afternoon): performance
-- on day one (issue 30), the first hour and the operator's day (issue 31), the test suite (32).
--
-- Each section below names the issue it answers; the functions that use this state are in
-- sql/functions/ and are re-applied after this file in the same upgrade.
SELECT 1;

-- Issue 30, item 3 (a hot path that costs what a queue should): no unconditional index on
-- zeroth.runs for the dashboard's sake. Every claim and every completion changes `status`, which
-- the partial indexes name, so each is a non-HOT update and inserts an entry into every index
-- whose predicate its new row version meets; runs_created_idx (created_at, run_id) and
-- runs_run_id_idx (run_id) (0015) met every row version, six of the thirteen index entries a run
-- cost (enqueue, claim, completion). Instead:
--   * runs_created_not_running_idx: (created_at, run_id) of the runs that are not running. A run
--     enters it when it is enqueued (pending) and again when it ends; the claim, which makes it
--     running, and the renewals leave it alone. A keyset page of zeroth.run_list (the dashboard,
--     `zeroth-pg runs list`) is two queries merged, each with the page's LIMIT: the runs that are
--     not running (a backward walk of this index) and the running ones (runs_running_idx, as
--     many as there are live leases, sorted): O(page + running runs) at millions of runs
--     (tests/plans/test_run_list_plan.py, tests/plans/test_hot_path_indexes.py).
--   * a run by its id alone (the dashboard's run page and search, `zeroth-pg runs show`): one
--     runs_pkey (tenant_id, workspace_key, run_id) probe per scope, the scopes found by a skip
--     scan of the same index (zeroth_pg._calls.run_by_id): the cost grows with the scopes, not
--     the runs. zeroth.attempt_history gains workspace_key so that one run's attempts are read
--     by (tenant_id, workspace_key, run_id), by index.
-- Per run from enqueue to completion: 9 index entries instead of 13 (bench/per_run_cost.py).
CREATE INDEX runs_created_not_running_idx ON zeroth.runs (created_at, run_id)
    WHERE status <> 'running';
COMMENT ON INDEX zeroth.runs_created_not_running_idx IS 'Keyset pages of the runs that are not running by (created_at, run_id), newest first (zeroth.run_list, the dashboard''s runs page; the running runs come from runs_running_idx). Not written by a claim or a renewal.';
DROP INDEX zeroth.runs_created_idx;
DROP INDEX zeroth.runs_run_id_idx;
