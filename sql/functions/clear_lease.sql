-- clear_lease: admin, unfenced. Pending: the lease is cleared. Running: the holder is kept and the
-- lease expired in place, so the run stays recoverable (clearing it would strand it, F-02). Frees
-- every slot naming the run. Locks: slots, then run; ends through the settle path (zeroth._settle,
-- kind clear). Returns false when the run held no lease.
-- Raises ZP001 (unknown run), ZP003 (an edge a DBA removed from zeroth.run_transitions), ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.clear_lease(
    run_id       uuid,
    tenant_id    text DEFAULT NULL,
    workspace_id text DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    -- JIT off, as in every function that turns a plan node off: a statement that cannot avoid
    -- the node (a LATERAL row lock needs a nested loop) is costed at 1e10 and JIT-compiled at
    -- each execution, 0.3-1.1 s of CPU where the server has LLVM (docs/performance.md, "JIT").
    SET jit = off
    -- Sequential scans off: the slot and the run are key probes whatever the statistics say (a
    -- cached plan made on tables analyzed while empty read admission_slots whole:
    -- tests/plans/test_generic_plans_all.py, analyzed-while-empty).
    SET enable_seqscan = off
    AS $$
DECLARE
    v_now    timestamptz;
    v_tenant text := zeroth._scope_tenant(clear_lease.tenant_id, clear_lease.workspace_id);
    v_wskey  text := zeroth._workspace_key(clear_lease.workspace_id);
    v_slots  tid[];
    v_run    record;
    v_state  text;
BEGIN
    PERFORM zeroth._require(clear_lease.run_id IS NOT NULL, 'run_id must not be NULL');

    v_slots := ARRAY(SELECT s.ctid FROM zeroth.admission_slots s
                      -- The scope by IS NOT DISTINCT FROM: by admission_slots_run_idx whatever the
                      -- statistics (see zeroth._lock_settle).
                      WHERE s.run_id = clear_lease.run_id
                        AND (s.tenant_id, s.workspace_key) IS NOT DISTINCT FROM (v_tenant, v_wskey)
                        FOR UPDATE);
    SELECT r.ctid, r.status, r.lease_worker_id, r.lease_generation INTO v_run
      FROM zeroth.runs r
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = clear_lease.run_id
       AND r.lease_worker_id IS NOT NULL
       FOR UPDATE;
    IF NOT FOUND THEN
        IF NOT EXISTS (SELECT 1 FROM zeroth.runs r WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey
                                                      AND r.run_id = clear_lease.run_id) THEN
            RAISE EXCEPTION 'run % not found in this scope', clear_lease.run_id USING ERRCODE = 'ZP001';
        END IF;
        RETURN false;
    END IF;
    -- The clock read under the row lock; the end, the slots and the wakeup: the settle path
    -- (kind clear: a running run's lease expired in place, a pending claim's cleared).
    v_now := zeroth._now();
    SELECT s.sqlstate INTO v_state
      FROM zeroth._settle(v_tenant, v_wskey, v_run.lease_worker_id, ARRAY[clear_lease.run_id],
                          ARRAY[v_run.lease_generation], ARRAY['clear'], NULL, NULL, NULL, NULL, NULL,
                          ARRAY[v_run.ctid], v_slots, v_now) s;
    PERFORM zeroth._raise_unlisted_edge('clear_lease', clear_lease.run_id, v_run.status, v_state);
    RETURN true;
END
$$;
COMMENT ON FUNCTION zeroth.clear_lease(uuid, text, text) IS
'clear_lease: admin, unfenced. Pending: lease cleared. Running: holder kept, lease expired in place so claim_orphaned recovers it (never stranded); the old holder can no longer release or hand it back. Frees the run''s slots. Returns false when there was no lease. Raises ZP001, ZP003 (an edge a DBA removed from zeroth.run_transitions), ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';
ALTER FUNCTION zeroth.clear_lease(uuid, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.clear_lease(uuid, text, text) FROM PUBLIC;
