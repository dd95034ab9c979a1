-- cancel_run: the lease holder ends its run as cancelled (after seeing a cancel request, or on its
-- own). pending or running → cancelled, fenced; clears the lease and frees the slot. Returns false
-- when fenced out. Raises ZP008. Notifies zeroth_wakeup when a slot was freed. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.cancel_run(
    run_id       uuid,
    worker_id    text,
    generation   bigint,
    tenant_id    text DEFAULT NULL,
    workspace_id text DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_status zeroth.run_status;
    v_now    timestamptz := zeroth._now();
    v_tenant text := zeroth._scope_tenant(cancel_run.tenant_id, cancel_run.workspace_id);
    v_wskey  text := zeroth._workspace_key(cancel_run.workspace_id);
    v_run    record;
BEGIN
    -- Checks the fence's arguments; the slot, then the run row, then the clock: see
    -- zeroth._lock_lease_end.
    v_status := zeroth._lock_lease_end(v_tenant, v_wskey, cancel_run.run_id, cancel_run.worker_id, cancel_run.generation);
    v_now := zeroth._now();
    UPDATE zeroth.runs r
       SET status = 'cancelled',
           cancel_requested_at = coalesce(r.cancel_requested_at, v_now),
           cancel_action = coalesce(r.cancel_action, 'cancel'),
           finished_at = v_now,
           updated_at = v_now,
           lease_worker_id = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
           admission_slot = NULL, recovery_checkpoint_id = NULL
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = cancel_run.run_id
       AND r.lease_worker_id = cancel_run.worker_id
       AND r.lease_generation = cancel_run.generation
       AND r.lease_expires_at >= v_now
    RETURNING r.deployment_ref, r.workspace_id INTO v_run;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF zeroth._free_slot(v_tenant, v_wskey, cancel_run.run_id, cancel_run.generation) THEN
        PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_tenant, v_run.workspace_id);
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION zeroth.cancel_run(uuid, text, bigint, text, text) IS
'cancel_run: the live lease holder (worker_id, generation) ends its pending or running run as cancelled; clears the lease, frees the slot. Returns false when fenced out. Raises ZP008. Notifies zeroth_wakeup when a slot was freed. Time: clock_timestamp().';
ALTER FUNCTION zeroth.cancel_run(uuid, text, bigint, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.cancel_run(uuid, text, bigint, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.cancel_run(uuid, text, bigint, text, text) TO zeroth_worker;
