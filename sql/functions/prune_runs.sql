-- prune_runs: finished (completed | failed | cancelled) → deleted, when finished_at < now - older_than.
-- One batch of at most batch_size runs per call (one short transaction); the caller loops until 0.
-- Scope: tenant_id NULL = every tenant (a DBA function); a tenant names exactly (tenant, workspace),
-- NULL workspace being the null workspace. Dead letters are failed runs and go too. Checkpoints go
-- by ON DELETE CASCADE, a parent's child_waits rows and the attempt history
-- (zeroth.run_attempt_log; an attempt kept in the runs row goes with the row) in the same
-- statement; the thread_locks rows of threads left without a run go too, and up to
-- batch_size zeroth.events rows older than the cutoff that no run waits on, and, called for every
-- tenant, up to batch_size zeroth.deployment_changes rows older than the cutoff, each deployment's
-- latest change kept (issue 31), and up to min(batch_size, 100) zeroth.code_versions first seen
-- before the cutoff that no run references (issue 34; each under its advisory lock, try only).
-- Returns runs plus event, change and version rows deleted. Locks: the
-- doomed run, lock, event and change rows FOR UPDATE SKIP LOCKED, so it never waits on a worker
-- or an operator and nobody waits on it for long. Raises ZP006 (workspace
-- without tenant), ZP008. Notifies nothing. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.prune_runs(
    older_than   interval,
    batch_size   integer DEFAULT 1000,
    tenant_id    text    DEFAULT NULL,
    workspace_id text    DEFAULT NULL)
    RETURNS integer
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    -- JIT off, as in every function that turns a plan node off: a statement that cannot avoid
    -- the node (a LATERAL row lock needs a nested loop) is costed at 1e10 and JIT-compiled at
    -- each execution, 0.3-1.1 s of CPU where the server has LLVM (docs/performance.md, "JIT").
    SET jit = off
    -- Sequential scans off: a generic plan of the batch's DELETE (the batch estimated at a third
    -- of the finished runs, its LIMIT a parameter) hash-joined it with a scan of every run once
    -- zeroth.runs had statistics; with them off the joins of the batch with child_waits and
    -- run_attempts probe those keys per run (the runs themselves are deleted by address).
    SET enable_seqscan = off AS $$
DECLARE
    v_now     timestamptz := zeroth._now();
    v_wskey   text := zeroth._workspace_key(prune_runs.workspace_id);
    v_cutoff  timestamptz;
    v_deleted integer;
    v_rows    tid[];
    v_tenants text[];
    v_wskeys  text[];
    v_threads text[];
    v_e_tenants text[];
    v_e_wskeys  text[];
    v_e_names   text[];
    v_events_deleted integer := 0;
    v_changes_deleted integer := 0;
    v_change_ids bigint[];
    v_version bigint;
    v_count integer;
    v_versions_deleted integer := 0;
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
    -- runs_finished_idx (the ORDER BY is what keeps the planner on it). The locked rows are
    -- deleted by their addresses in the next statement (which sees the versions locked here), a
    -- TID scan whatever the statistics: joined by key, a generic plan made before the first
    -- ANALYZE on PostgreSQL 15 walked runs_pkey whole once runs_run_id_idx was gone (issue 30).
    SELECT coalesce(array_agg(d.ctid), '{}') INTO v_rows
      FROM (SELECT r.ctid
              FROM zeroth.runs r
             WHERE r.status IN ('completed', 'failed', 'cancelled')
               AND r.finished_at < v_cutoff
               AND (prune_runs.tenant_id IS NULL
                    OR (r.tenant_id = prune_runs.tenant_id AND r.workspace_key = v_wskey))
             ORDER BY r.finished_at
             LIMIT prune_runs.batch_size
               FOR UPDATE SKIP LOCKED) d;

    WITH deleted AS (
        DELETE FROM zeroth.runs r
         WHERE r.ctid = ANY (v_rows)
        RETURNING r.tenant_id, r.workspace_key, r.thread_id, r.run_id
    )
    -- A parent's child waits have no foreign key (0014_child_runs.sql says why): they go here.
    , unwaited AS (
        DELETE FROM zeroth.child_waits w
         USING deleted x
         WHERE w.tenant_id = x.tenant_id
           AND w.workspace_key = x.workspace_key
           AND w.parent_run_id = x.run_id
    )
    -- The attempt history has no foreign key (a key would tax every claim): it goes in this
    -- statement, so a run and its history are deleted together.
    , history AS (
        DELETE FROM zeroth.run_attempt_log a
         USING deleted x
         WHERE a.tenant_id = x.tenant_id
           AND a.workspace_key = x.workspace_key
           AND a.run_id = x.run_id
    )
    SELECT (SELECT count(*) FROM deleted)::integer, coalesce(array_agg(t.tenant_id), '{}'),
           coalesce(array_agg(t.workspace_key), '{}'), coalesce(array_agg(t.thread_id), '{}')
      INTO v_deleted, v_tenants, v_wskeys, v_threads
      FROM (SELECT DISTINCT x.tenant_id, x.workspace_key, x.thread_id
              FROM deleted x WHERE x.thread_id IS NOT NULL) t;

    -- The lock rows (zeroth.thread_locks) of those threads that have no run left, skipping any an
    -- admission holds: it is about to give the thread a run.
    IF cardinality(v_threads) > 0 THEN
        DELETE FROM zeroth.thread_locks l
         USING (SELECT k.tenant_id, k.workspace_key, k.thread_id
                  FROM zeroth.thread_locks k
                  JOIN unnest(v_tenants, v_wskeys, v_threads) AS g(tenant_id, workspace_key, thread_id)
                    ON k.tenant_id = g.tenant_id AND k.workspace_key = g.workspace_key
                   AND k.thread_id = g.thread_id
                 WHERE NOT EXISTS (SELECT 1 FROM zeroth.runs r
                                    WHERE r.tenant_id = k.tenant_id
                                      AND r.workspace_key = k.workspace_key
                                      AND r.thread_id = k.thread_id)
                   FOR UPDATE OF k SKIP LOCKED) gone
         WHERE l.tenant_id = gone.tenant_id
           AND l.workspace_key = gone.workspace_key
           AND l.thread_id = gone.thread_id;
    END IF;

    -- Events: an event's row outlives its runs, and per-run names (what docs/security.md
    -- recommends) would make the table grow for ever. The rows older than the same
    -- cutoff (emitted_at, or created_at of a channel nobody emitted) that no run waits on go, at
    -- most batch_size per call, oldest first through events_age_idx, in this call's scope. Two
    -- statements: the first skips the rows still awaited and locks the rest SKIP LOCKED (a
    -- wait_for_event or emit_event holding one keeps it); the second, with a snapshot taken once
    -- those locks are held, deletes only those no run waits on even now: a wait that committed
    -- meanwhile is seen, and one that comes later waits for this row lock and then writes the
    -- row again (wait_for_event). An emit after the prune is a new event.
    SELECT coalesce(array_agg(x.tenant_id), '{}'), coalesce(array_agg(x.workspace_key), '{}'),
           coalesce(array_agg(x.name), '{}')
      INTO v_e_tenants, v_e_wskeys, v_e_names
      FROM (SELECT e.tenant_id, e.workspace_key, e.name
              FROM zeroth.events e
             WHERE coalesce(e.emitted_at, e.created_at) < v_cutoff
               AND (prune_runs.tenant_id IS NULL
                    OR (e.tenant_id = prune_runs.tenant_id AND e.workspace_key = v_wskey))
               AND NOT EXISTS (SELECT 1 FROM zeroth.event_waits w
                                WHERE w.tenant_id = e.tenant_id
                                  AND w.workspace_key = e.workspace_key
                                  AND w.name = e.name)
             ORDER BY coalesce(e.emitted_at, e.created_at)
             LIMIT prune_runs.batch_size
               FOR UPDATE OF e SKIP LOCKED) x;
    IF cardinality(v_e_names) > 0 THEN
        DELETE FROM zeroth.events e
         USING unnest(v_e_tenants, v_e_wskeys, v_e_names) AS k(tenant_id, workspace_key, name)
         WHERE e.tenant_id = k.tenant_id
           AND e.workspace_key = k.workspace_key
           AND e.name = k.name
           AND NOT EXISTS (SELECT 1 FROM zeroth.event_waits w
                            WHERE w.tenant_id = e.tenant_id
                              AND w.workspace_key = e.workspace_key
                              AND w.name = e.name);
        GET DIAGNOSTICS v_events_deleted = ROW_COUNT;
    END IF;

    -- The registry's audit (issue 31): zeroth.deployment_changes grew by a row per change for
    -- ever. A call for every tenant (the table is global and names no tenant, so a call for one
    -- scope leaves it alone) deletes at most batch_size changes older than the same cutoff,
    -- oldest first (deployment_changes_age_idx), never a deployment's latest change: it says who
    -- set the values in force, and _change_deployment numbers the next version after the highest
    -- audited one (a DBA's DELETE of the deployment row must not restart its versions). Rows a
    -- DBA holds are skipped (SKIP LOCKED), left for the next call. Two statements, as for runs
    -- and events: locked first, then deleted by key. In one DELETE ... IN (SELECT ... LIMIT ...
    -- FOR UPDATE SKIP LOCKED), a generic plan that re-ran the subquery per row skipped the rows
    -- the DELETE had already removed and went on past batch_size.
    IF prune_runs.tenant_id IS NULL THEN
        SELECT coalesce(array_agg(o.change_id), '{}') INTO v_change_ids
          FROM (SELECT o.change_id
                  FROM zeroth.deployment_changes o
                 WHERE o.changed_at < v_cutoff
                   AND EXISTS (SELECT 1 FROM zeroth.deployment_changes n
                                WHERE n.deployment_ref = o.deployment_ref
                                  AND n.version > o.version)
                 ORDER BY o.changed_at
                 LIMIT prune_runs.batch_size
                   FOR UPDATE OF o SKIP LOCKED) o;
        DELETE FROM zeroth.deployment_changes c WHERE c.change_id = ANY (v_change_ids);
        GET DIAGNOSTICS v_changes_deleted = ROW_COUNT;
    END IF;
    -- Code versions (issue 34): zeroth.code_versions grew by a row per version for ever. A call
    -- for every tenant (the table is global) deletes up to min(batch_size, 100) versions first
    -- seen before the cutoff that no run references (runs_code_version_idx, one probe each),
    -- each only once its advisory lock is taken exclusive (try only: a claim, admission, start or
    -- retire_code_version that is recording a reference holds it shared until its commit, so
    -- that version is skipped, left for the next call) and the reference checked again after it
    -- (a fresh snapshot: a reference committed before the lock is seen). At most 100: each lock
    -- takes an entry of the server's shared lock table until commit.
    IF prune_runs.tenant_id IS NULL THEN
        FOR v_version IN
            SELECT DISTINCT v.version_id
              FROM zeroth.code_versions v
             WHERE v.first_seen_at < v_cutoff
               AND NOT EXISTS (SELECT 1 FROM zeroth.runs r WHERE r.code_version_id = v.version_id)
             LIMIT least(prune_runs.batch_size, 100)
        LOOP
            CONTINUE WHEN NOT (SELECT pg_try_advisory_xact_lock(l.class_id, l.object_id)
                                 FROM zeroth._code_version_lock(v_version) AS l);
            DELETE FROM zeroth.code_versions v
             WHERE v.version_id = v_version
               AND v.first_seen_at < v_cutoff
               AND NOT EXISTS (SELECT 1 FROM zeroth.runs r WHERE r.code_version_id = v_version);
            GET DIAGNOSTICS v_count = ROW_COUNT;
            v_versions_deleted := v_versions_deleted + v_count;
        END LOOP;
    END IF;
    RETURN v_deleted + v_events_deleted + v_changes_deleted + v_versions_deleted;
END
$$;
COMMENT ON FUNCTION zeroth.prune_runs(interval, integer, text, text) IS
'prune_runs: finished (completed | failed | cancelled, dead letters included) → deleted when finished_at < now - older_than; one batch of at most batch_size runs per call, and at most batch_size rows of zeroth.events older than the same cutoff (emitted_at, or created_at of a channel never emitted) that no run waits on, and, when tenant_id is NULL, at most batch_size rows of the registry''s audit zeroth.deployment_changes older than the cutoff, each deployment''s latest change kept, and at most min(batch_size, 100) code versions (zeroth.code_versions) first seen before the cutoff that no run references (each under its advisory lock, taken try only: a version a claim is recording is skipped); returns the number of runs plus event, change and version rows deleted (loop until 0). tenant_id NULL = every tenant; a tenant names exactly (tenant, workspace). Checkpoints go by ON DELETE CASCADE, the attempt history in the same statement. FOR UPDATE SKIP LOCKED: never waits on workers. Raises ZP006 (workspace without tenant), ZP008. Time: clock_timestamp().';
ALTER FUNCTION zeroth.prune_runs(interval, integer, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.prune_runs(interval, integer, text, text) FROM PUBLIC;
