-- 0018_second_review: state changes for the second outside review's findings (issue 29).
--
-- Each section below names the finding it answers; the functions that use this state are in
-- sql/functions/ and are re-applied after this file in the same upgrade.
SELECT 1;

-- Waiting runs and failed runs that are not dead letters, counted by zeroth.scope_overview (and
-- so by the dashboard and `zeroth-pg status`) through their own partial indexes (issue 31, item
-- 3: an operator missed every stuck approval and 3 of 5 failed runs). A run enters each index
-- only while it is waiting or failed, so the claim and completion path writes neither.
CREATE INDEX runs_waiting_idx ON zeroth.runs (tenant_id, workspace_key, deployment_ref)
    WHERE status = 'waiting';
CREATE INDEX runs_failed_idx ON zeroth.runs (tenant_id, workspace_key, deployment_ref)
    WHERE status = 'failed' AND dead_lettered_at IS NULL;

-- The dashboard's run page links a parent run to its children (issue 31, item 4): zeroth_reader
-- reads zeroth.child_runs (through the view zeroth.child_list), its own tenant's rows only, as
-- it reads run_steps and event_waits (0015).
GRANT SELECT ON zeroth.child_runs TO zeroth_reader;
CREATE POLICY child_runs_reader_tenant ON zeroth.child_runs FOR SELECT TO zeroth_reader
    USING (tenant_id = current_setting('zeroth.tenant_id', true));
COMMENT ON POLICY child_runs_reader_tenant ON zeroth.child_runs IS 'zeroth_reader sees the child runs of the tenant named in the setting zeroth.tenant_id (none when unset).';
