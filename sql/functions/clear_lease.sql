-- clear_lease: admin, unfenced. Pending: the lease is cleared. Running: the holder is kept and the
-- lease expired in place, so the run stays recoverable (clearing it would strand it, F-02). Frees
-- every slot naming the run. Locks: slots, then run. Returns false when the run held no lease.
-- Raises ZP001 (unknown run), ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.clear_lease(
    run_id       uuid,
    tenant_id    text DEFAULT NULL,
    workspace_id text DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now    timestamptz := zeroth._now();
    v_tenant text := zeroth._scope_tenant(clear_lease.tenant_id, clear_lease.workspace_id);
    v_wskey  text := zeroth._workspace_key(clear_lease.workspace_id);
    v_run    record;
BEGIN
    PERFORM zeroth._require(clear_lease.run_id IS NOT NULL, 'run_id must not be NULL');

    UPDATE zeroth.admission_slots s
       SET run_id = NULL, lease_generation = NULL
     -- The scope by IS NOT DISTINCT FROM: by admission_slots_run_idx whatever the
     -- statistics (see zeroth._lock_settle).
     WHERE s.run_id = clear_lease.run_id
       AND (s.tenant_id, s.workspace_key) IS NOT DISTINCT FROM (v_tenant, v_wskey);
    UPDATE zeroth.runs r
       SET lease_worker_id   = CASE WHEN r.status = 'running' THEN r.lease_worker_id END,
           lease_acquired_at = CASE WHEN r.status = 'running' THEN r.lease_acquired_at END,
           lease_expires_at  = CASE WHEN r.status = 'running'
                                    THEN least(r.lease_expires_at, v_now - interval '1 microsecond') END,
           admission_slot = NULL,
           recovery_checkpoint_id = NULL,
           updated_at = v_now
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = clear_lease.run_id
       AND r.lease_worker_id IS NOT NULL
    RETURNING r.deployment_ref, r.workspace_id INTO v_run;
    IF NOT FOUND THEN
        IF NOT EXISTS (SELECT 1 FROM zeroth.runs r WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey
                                                      AND r.run_id = clear_lease.run_id) THEN
            RAISE EXCEPTION 'run % not found in this scope', clear_lease.run_id USING ERRCODE = 'ZP001';
        END IF;
        RETURN false;
    END IF;
    PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_tenant, v_run.workspace_id);
    RETURN true;
END
$$;
COMMENT ON FUNCTION zeroth.clear_lease(uuid, text, text) IS
'clear_lease: admin, unfenced. Pending: lease cleared. Running: holder kept, lease expired in place so claim_orphaned recovers it (never stranded); the old holder can no longer release or hand it back. Frees the run''s slots. Returns false when there was no lease. Raises ZP001, ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';
ALTER FUNCTION zeroth.clear_lease(uuid, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.clear_lease(uuid, text, text) FROM PUBLIC;
