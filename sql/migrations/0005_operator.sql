-- 0005_operator: the operator surface for DBAs with psql alone: lease views, table health,
-- prune_runs, the index that makes prune cheap on a big table, and queue-table storage settings.
--
-- Views are plain SQL over zeroth.runs and the statistics views; they read a normal snapshot and
-- take no row locks. They use clock_timestamp() (the database clock) like every function.
-- queue_depth and dead_letters live in 0003.

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

-- ---------------------------------------------------------------------------------------------
-- Views
-- ---------------------------------------------------------------------------------------------

-- Live leases: every pending (claimed) or running run whose lease has not expired. The pending
-- and running rows are found through the partial indexes of 0001, so the view costs O(active
-- runs) whatever the number of finished runs.
CREATE VIEW zeroth.live_leases AS
SELECT r.run_id,
       r.tenant_id,
       r.workspace_id,
       r.deployment_ref,
       r.status,
       r.lease_worker_id,
       r.lease_generation,
       r.lease_acquired_at,
       r.lease_expires_at,
       EXTRACT(epoch FROM r.lease_expires_at - clock_timestamp())::double precision AS seconds_left,
       r.cancel_requested_at
  FROM zeroth.runs r
 WHERE (r.status = 'pending' OR r.status = 'running')
   AND r.lease_expires_at >= clock_timestamp();
COMMENT ON VIEW zeroth.live_leases IS 'Runs holding a live lease: claimed (status pending, not yet started) or running. seconds_left is measured on the database clock; cancel_requested_at is set when request_cancel asked the holder to stop.';

-- Expired leases that nobody took over yet. A running one is an orphan that claim_orphaned will
-- recover (from recovery_checkpoint_id = its latest checkpoint); a pending one is a claim that was
-- never started and that claim_pending will simply take again.
CREATE VIEW zeroth.expired_leases AS
SELECT r.run_id,
       r.tenant_id,
       r.workspace_id,
       r.deployment_ref,
       r.status,
       r.lease_worker_id,
       r.lease_generation,
       r.lease_expires_at,
       EXTRACT(epoch FROM clock_timestamp() - r.lease_expires_at)::double precision AS seconds_expired,
       CASE WHEN r.status = 'running' THEN 'claim_orphaned' ELSE 'claim_pending' END AS reclaimed_by,
       r.checkpoint_seq
  FROM zeroth.runs r
 WHERE (r.status = 'pending' OR r.status = 'running')
   AND r.lease_expires_at < clock_timestamp();
COMMENT ON VIEW zeroth.expired_leases IS 'Pending or running runs whose lease expired and that no worker has taken yet. reclaimed_by names the claim that will take each: claim_orphaned for running runs (orphans of a crashed or stalled worker, resumed from their latest checkpoint; checkpoint_seq counts them), claim_pending for claims that were never started.';

-- Table health of the three hot tables, and the oldest transaction horizon holding back vacuum in
-- this database: a backend's snapshot (backend_xmin), a replication slot's xmin, or a prepared
-- transaction. Dead tuples that vacuum may not remove yet accumulate behind it, so a large
-- oldest_xmin_age next to a growing n_dead_tup names the culprit. Other users' backend_xmin is
-- only visible with pg_read_all_stats (e.g. through pg_monitor); without it those sessions are
-- not seen.
CREATE VIEW zeroth.table_health AS
WITH horizon AS (
    SELECT h.holder, h.xmin_age, h.since
      FROM (SELECT format('backend %s (%s, %s)', a.pid, coalesce(a.state, 'unknown'),
                          coalesce(nullif(a.application_name, ''), a.backend_type)) AS holder,
                   age(a.backend_xmin) AS xmin_age,
                   a.xact_start AS since
              FROM pg_stat_activity a
             WHERE a.backend_xmin IS NOT NULL
               AND a.pid <> pg_backend_pid()
               AND (a.datname = current_database() OR a.datname IS NULL)
            UNION ALL
            SELECT format('replication slot %s', s.slot_name), age(s.xmin), NULL::timestamptz
              FROM pg_replication_slots s
             WHERE s.xmin IS NOT NULL
            UNION ALL
            SELECT format('prepared transaction %s', p.gid), age(p.transaction), p.prepared
              FROM pg_prepared_xacts p
             WHERE p.database = current_database()) h
     ORDER BY h.xmin_age DESC
     LIMIT 1
)
SELECT t.relname::text AS table_name,
       t.n_live_tup,
       t.n_dead_tup,
       round(t.n_dead_tup::numeric / nullif(t.n_live_tup + t.n_dead_tup, 0), 4) AS dead_ratio,
       t.n_tup_upd,
       t.n_tup_hot_upd,
       round(t.n_tup_hot_upd::numeric / nullif(t.n_tup_upd, 0), 4) AS hot_update_ratio,
       t.last_autovacuum,
       t.last_vacuum,
       t.last_autoanalyze,
       t.autovacuum_count,
       pg_table_size(t.relid) AS table_bytes,
       pg_indexes_size(t.relid) AS index_bytes,
       pg_size_pretty(pg_table_size(t.relid)) AS table_size,
       pg_size_pretty(pg_indexes_size(t.relid)) AS index_size,
       h.holder AS oldest_xmin_holder,
       h.xmin_age AS oldest_xmin_age,
       clock_timestamp() - h.since AS oldest_xmin_duration
  FROM pg_stat_all_tables t
  LEFT JOIN horizon h ON true
 WHERE t.schemaname = 'zeroth'
   AND t.relname IN ('runs', 'checkpoints', 'admission_slots');
COMMENT ON VIEW zeroth.table_health IS 'Per hot table (runs, checkpoints, admission_slots): live and dead tuples, the share of HOT updates (lease renewals should be HOT), last (auto)vacuum and autoanalyze, table and index size; and, on every row, the oldest transaction horizon in this database that holds back vacuum (a backend snapshot, a replication slot or a prepared transaction), its age in transactions and, for backends and prepared transactions, how long it has been open. Other users'' backends are visible only with pg_read_all_stats (pg_monitor).';

-- ---------------------------------------------------------------------------------------------
-- Pruning
-- ---------------------------------------------------------------------------------------------

-- prune_runs: finished (completed | failed | cancelled) → deleted, when finished_at < now - older_than.
-- One batch of at most batch_size runs per call (one short transaction); the caller loops until 0.
-- Scope: tenant_id NULL = every tenant (a DBA function); a tenant names exactly (tenant, workspace),
-- NULL workspace being the null workspace. Dead letters are failed runs and go too. Checkpoints go
-- by ON DELETE CASCADE. Locks: the doomed run rows FOR UPDATE SKIP LOCKED, so it never waits on a
-- worker or an operator and nobody waits on it for long. Raises ZP006 (workspace without tenant),
-- ZP008. Notifies nothing. Time: clock_timestamp() (or now_override).
CREATE FUNCTION zeroth.prune_runs(
    older_than   interval,
    batch_size   integer     DEFAULT 1000,
    tenant_id    text        DEFAULT NULL,
    workspace_id text        DEFAULT NULL,
    now_override timestamptz DEFAULT NULL)
    RETURNS integer
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now     timestamptz := zeroth._now(now_override);
    v_wskey   text := zeroth._workspace_key(prune_runs.workspace_id);
    v_cutoff  timestamptz;
    v_deleted integer;
BEGIN
    IF prune_runs.tenant_id IS NULL AND prune_runs.workspace_id IS NOT NULL THEN
        RAISE EXCEPTION 'a workspace_id needs a tenant_id' USING ERRCODE = 'ZP006';
    END IF;
    PERFORM zeroth._require(prune_runs.older_than IS NOT NULL AND isfinite(prune_runs.older_than)
                            AND prune_runs.older_than >= interval '0',
                            'older_than must be a finite, non-negative interval');
    PERFORM zeroth._require(prune_runs.batch_size BETWEEN 1 AND 10000, 'batch_size must be between 1 and 10000');
    IF prune_runs.tenant_id IS NOT NULL THEN
        PERFORM zeroth._require_identifier(prune_runs.tenant_id, 'tenant_id');
    END IF;
    IF prune_runs.workspace_id IS NOT NULL THEN
        PERFORM zeroth._require_identifier(prune_runs.workspace_id, 'workspace_id');
    END IF;
    BEGIN
        v_cutoff := v_now - prune_runs.older_than;
    EXCEPTION WHEN datetime_field_overflow THEN
        RAISE EXCEPTION 'older_than % reaches before the earliest timestamp', prune_runs.older_than
            USING ERRCODE = 'ZP008';
    END;

    -- Lock first, skipping rows another session holds (a redrive, a cancel), then delete what
    -- was locked. A row changed under us is re-checked against the WHERE when it is locked, so a
    -- run redriven to pending in the meantime is not deleted. Oldest first, through
    -- runs_finished_idx (the ORDER BY is what keeps the planner on it).
    WITH doomed AS MATERIALIZED (
        SELECT r.tenant_id, r.workspace_key, r.run_id
          FROM zeroth.runs r
         WHERE r.status IN ('completed', 'failed', 'cancelled')
           AND r.finished_at < v_cutoff
           AND (prune_runs.tenant_id IS NULL
                OR (r.tenant_id = prune_runs.tenant_id AND r.workspace_key = v_wskey))
         ORDER BY r.finished_at
         LIMIT prune_runs.batch_size
           FOR UPDATE SKIP LOCKED
    )
    DELETE FROM zeroth.runs r
     USING doomed d
     WHERE r.tenant_id = d.tenant_id
       AND r.workspace_key = d.workspace_key
       AND r.run_id = d.run_id;
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    RETURN v_deleted;
END
$$;
COMMENT ON FUNCTION zeroth.prune_runs(interval, integer, text, text, timestamptz) IS
'prune_runs: finished (completed | failed | cancelled, dead letters included) → deleted when finished_at < now - older_than; one batch of at most batch_size per call, returns the number deleted (loop until 0). tenant_id NULL = every tenant; a tenant names exactly (tenant, workspace). Checkpoints go by ON DELETE CASCADE. FOR UPDATE SKIP LOCKED: never waits on workers. Raises ZP006 (workspace without tenant), ZP008. Time: clock_timestamp().';

-- count_pending: the pending runs of one deployment in one scope — what a worker's queue-depth
-- gauge reads. A worker role has no table privileges, so it gets this read instead of the
-- views. Uses runs_claim_pending_idx. No locks. Raises nothing. Time: none.
CREATE FUNCTION zeroth.count_pending(
    deployment_ref text,
    tenant_id      text DEFAULT NULL,
    workspace_id   text DEFAULT NULL)
    RETURNS bigint
    LANGUAGE sql STABLE
    RETURN (SELECT count(*) FROM zeroth.runs r
             WHERE r.tenant_id = zeroth._scope_tenant(count_pending.tenant_id, count_pending.workspace_id)
               AND r.workspace_key = zeroth._workspace_key(count_pending.workspace_id)
               AND r.deployment_ref = count_pending.deployment_ref
               AND r.status = 'pending');
COMMENT ON FUNCTION zeroth.count_pending(text, text, text) IS
'count_pending: number of pending runs of a deployment in a scope (the worker''s queue-depth gauge); read only, through runs_claim_pending_idx. Raises nothing.';
