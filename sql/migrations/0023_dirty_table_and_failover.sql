-- 0023_dirty_table_and_failover: state changes for the work of the session of 2026-12-06 (second):
-- claims that stay fast on a table full of dead row versions and fewer bytes per run (issue 30),
-- high availability (issue 35) and the test suite (issue 32).
--
-- Each section below names the issue it answers; the functions that use this state are in
-- sql/functions/ and are re-applied after this file in the same upgrade.
SELECT 1;

-- ===== section: claims on a dirty table (issue 30) =====

-- ===== section: per-run cost of the hot path (issue 30) =====
-- Issue 30, item 3: one index entry fewer at every enqueue and every completion. A run known by
-- its id alone (the dashboard's run page, search and bulk actions, `zeroth-pg runs show`) was a
-- probe of runs_run_id_not_running_idx (run_id) WHERE status <> 'running' plus a walk of the
-- running runs: an index that every enqueue and every completion wrote (a non-HOT update inserts
-- into every index its new row version meets), about 85 bytes of WAL each. The primary key now
-- leads with run_id: (run_id, tenant_id, workspace_key). A lookup by the full key is the same one
-- probe; a lookup by id alone is one probe too, for every status (no walk of the running runs),
-- on PostgreSQL 15 as on 18; and no plan can put only the scope in runs_pkey's index condition
-- and walk the scope (issue 30's generic plans before the first ANALYZE). Every query that reads
-- a scope's runs has a status and an index of its own that leads with the scope (claim_pending,
-- running, waiting, thread indexes). The five foreign keys that reference the key (the same
-- column set, any order) are dropped and made again around it, unchanged.
-- Cost of the upgrade: runs_pkey is rebuilt and the foreign keys re-validated (a scan of
-- checkpoints, child_runs, event_waits, run_events and run_steps against it) under the
-- migration's ACCESS EXCLUSIVE lock of zeroth.runs (docs/dba-guide.md, "Upgrading").
-- Per run from enqueue to completion: 8 index entries instead of 10 (bench/per_run_cost.py).
ALTER TABLE zeroth.checkpoints DROP CONSTRAINT checkpoints_run_fkey;
ALTER TABLE zeroth.child_runs DROP CONSTRAINT child_runs_parent_fkey;
ALTER TABLE zeroth.event_waits DROP CONSTRAINT event_waits_run_fkey;
ALTER TABLE zeroth.run_events DROP CONSTRAINT run_events_run_fkey;
ALTER TABLE zeroth.run_steps DROP CONSTRAINT run_steps_run_fkey;
ALTER TABLE zeroth.runs DROP CONSTRAINT runs_pkey;
ALTER TABLE zeroth.runs ADD CONSTRAINT runs_pkey PRIMARY KEY (run_id, tenant_id, workspace_key);
ALTER TABLE zeroth.checkpoints ADD CONSTRAINT checkpoints_run_fkey
    FOREIGN KEY (tenant_id, workspace_key, run_id)
    REFERENCES zeroth.runs (tenant_id, workspace_key, run_id) ON DELETE CASCADE;
ALTER TABLE zeroth.child_runs ADD CONSTRAINT child_runs_parent_fkey
    FOREIGN KEY (tenant_id, workspace_key, parent_run_id)
    REFERENCES zeroth.runs (tenant_id, workspace_key, run_id) ON DELETE CASCADE;
ALTER TABLE zeroth.event_waits ADD CONSTRAINT event_waits_run_fkey
    FOREIGN KEY (tenant_id, workspace_key, run_id)
    REFERENCES zeroth.runs (tenant_id, workspace_key, run_id) ON DELETE CASCADE;
ALTER TABLE zeroth.run_events ADD CONSTRAINT run_events_run_fkey
    FOREIGN KEY (tenant_id, workspace_key, run_id)
    REFERENCES zeroth.runs (tenant_id, workspace_key, run_id) ON DELETE CASCADE;
ALTER TABLE zeroth.run_steps ADD CONSTRAINT run_steps_run_fkey
    FOREIGN KEY (tenant_id, workspace_key, run_id)
    REFERENCES zeroth.runs (tenant_id, workspace_key, run_id) ON DELETE CASCADE;
DROP INDEX zeroth.runs_run_id_not_running_idx;


-- ===== section: high availability (issue 35) =====

-- ===== section: test suite (issue 32) =====
