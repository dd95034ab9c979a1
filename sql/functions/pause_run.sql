-- pause_run: running → waiting (approval, interrupt, …), fenced. The lease is released (a waiting
-- run is claimed by nobody), the slot freed and the attempt given back (waiting is not a
-- failure); resume_run makes it pending again. Returns false
-- when fenced out. Raises ZP003 (holder but not running), ZP008. Notifies zeroth_wakeup when a slot
-- was freed. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.pause_run(
    run_id       uuid,
    worker_id    text,
    generation   bigint,
    reason       text,
    tenant_id    text DEFAULT NULL,
    workspace_id text DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_status zeroth.run_status;
    v_now    timestamptz := zeroth._now();
    v_tenant text := zeroth._scope_tenant(pause_run.tenant_id, pause_run.workspace_id);
    v_wskey  text := zeroth._workspace_key(pause_run.workspace_id);
    v_run    record;
BEGIN
    PERFORM zeroth._require_identifier(pause_run.reason, 'reason');

    -- Checks the fence's arguments; the slot, then the run row, then the clock: see
    -- zeroth._lock_lease_end.
    v_status := zeroth._lock_lease_end(v_tenant, v_wskey, pause_run.run_id, pause_run.worker_id, pause_run.generation);
    v_now := zeroth._now();
    UPDATE zeroth.runs r
       SET status = 'waiting',
           wait_reason = pause_run.reason,
           -- Waiting is not a failure: the attempt is given back, so approval loops never use up
           -- the retry budget (nor push attempts past max_attempts).
           attempts = greatest(r.attempts - 1, 0),
           updated_at = v_now,
           lease_worker_id = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
           admission_slot = NULL, recovery_checkpoint_id = NULL
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = pause_run.run_id
       AND v_status = 'running'
       AND r.lease_worker_id = pause_run.worker_id
       AND r.lease_generation = pause_run.generation
       AND r.lease_expires_at >= v_now
    RETURNING r.deployment_ref, r.workspace_id INTO v_run;
    IF NOT FOUND THEN
        PERFORM zeroth._explain_fenced_miss(v_tenant, v_wskey, pause_run.run_id, pause_run.worker_id,
                                            pause_run.generation, v_now, 'pause_run', '{running}');
        RETURN false;
    END IF;
    IF zeroth._free_slot(v_tenant, v_wskey, pause_run.run_id, pause_run.generation) THEN
        PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_tenant, v_run.workspace_id);
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION zeroth.pause_run(uuid, text, bigint, text, text, text) IS
'pause_run: running → waiting with a reason, for the live lease (worker_id, generation); releases the lease and slot and gives the attempt back. Returns false when fenced out. Raises ZP003 (holder but not running), ZP008. Notifies zeroth_wakeup when a slot was freed. Time: clock_timestamp().';
ALTER FUNCTION zeroth.pause_run(uuid, text, bigint, text, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.pause_run(uuid, text, bigint, text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.pause_run(uuid, text, bigint, text, text, text) TO zeroth_worker;
