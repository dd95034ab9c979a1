-- 0005_operator: the operator surface for DBAs with psql alone: lease views, table health,
-- prune_runs, the index that makes prune cheap on a big table, and queue-table storage settings.
--
-- Views are plain SQL over zeroth.runs and the statistics views; they read a normal snapshot and
-- take no row locks. They use clock_timestamp() (the database clock) like every function.
-- queue_depth and dead_letters live in 0003.
--
-- The functions, views and trigger this migration created when it was released live in
-- sql/functions/ now (one file each, re-applied by every upgrade: sql/README.md); this file
-- keeps what has state: types, tables, indexes, roles, policies and data changes.

-- ---------------------------------------------------------------------------------------------
-- Storage settings of the queue table
-- ---------------------------------------------------------------------------------------------

-- zeroth.runs is a queue: every run is inserted, updated a handful of times while it is young
-- (claim, start, renewals, checkpoints, completion) and then rests until prune_runs deletes it.
-- With the default autovacuum_vacuum_scale_factor (0.2), a table holding 1M finished runs would
-- collect 200k dead tuples before autovacuum looked at it, and those dead versions sit exactly in
-- the hot pages and the small partial indexes (pending, running) that every claim scans. A small
-- scale factor plus a fixed threshold vacuums after ~1% churn whatever the size of the history.
-- The insert scale factor keeps the visibility map current for the insert-mostly tail, and the
-- analyze settings keep the planner's estimate of the pending set fresh. fillfactor 80 (0001)
-- stays: lease renewals touch no indexed column and find room on the page (HOT), while finished
-- rows, the bulk of the table, waste no more than 20% of their pages.
ALTER TABLE zeroth.runs SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_analyze_threshold = 1000
);

-- Finished runs by age, for prune_runs. Without it each prune batch reads the table itself to
-- find old finished rows among the others: the planner picks a sequential scan with a LIMIT, whose
-- cost grows as pruning empties the front of the table. The partial index holds only finished
-- rows, in finished_at order, so a batch reads the oldest batch_size entries and nothing else
-- (measured at 1M finished runs: ~2 ms to find and lock 1000 runs, ~40 ms per batch including
-- the delete and the checkpoint cascade). tenant_id and workspace_key trail the key so that a
-- tenant-scoped prune rejects other tenants' rows from the index tuple, without visiting the heap
-- (600 ms → 2 ms per batch when the oldest 200k runs belong to other tenants). It costs nothing
-- while a run is active: a run enters it on the UPDATE that finishes it, which changes status
-- (already indexed by the claim index's predicate) and so is never a HOT update anyway.
CREATE INDEX runs_finished_idx ON zeroth.runs (finished_at, tenant_id, workspace_key)
    WHERE status IN ('completed', 'failed', 'cancelled');
