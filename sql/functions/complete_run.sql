-- complete_run: running → completed, fenced; stores output (SQL NULL keeps what commit_fenced
-- wrote, JSON null clears it), clears the lease, frees the slot. Locks: the admission slot, then
-- the run. Returns false when fenced out. Raises ZP003 (holder but not running), ZP008. Notifies
-- zeroth_wakeup when a concurrency slot was freed. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.complete_run(
    run_id       uuid,
    worker_id    text,
    generation   bigint,
    output       jsonb DEFAULT NULL,
    tenant_id    text  DEFAULT NULL,
    workspace_id text  DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_status zeroth.run_status;
    v_now    timestamptz := zeroth._now();
    v_tenant text := zeroth._scope_tenant(complete_run.tenant_id, complete_run.workspace_id);
    v_wskey  text := zeroth._workspace_key(complete_run.workspace_id);
    v_run    record;
    v_acquired timestamptz;
    v_completed boolean;
BEGIN
    -- Checks the fence's arguments; the slot, then the run row, then the clock: see
    -- zeroth._lock_lease_end.
    v_status := zeroth._lock_lease_end(v_tenant, v_wskey, complete_run.run_id, complete_run.worker_id, complete_run.generation);
    v_now := zeroth._now();
    -- The claim's time for the attempt history, which the UPDATE clears (the row is locked).
    SELECT r.lease_acquired_at INTO v_acquired FROM zeroth.runs r
     WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey AND r.run_id = complete_run.run_id;
    -- The ended attempt is recorded here, in the completing statement (as complete_runs does;
    -- the trigger runs_attempt_history leaves completions by the functions to them). The mark
    -- the trigger's WHEN reads is raised for this statement only, as in
    -- zeroth._complete_locked_runs (which says why it is not a SET clause).
    PERFORM set_config('zeroth.completion_records_attempt', 'on', true);
    WITH completed AS (
        UPDATE zeroth.runs r
           SET status = 'completed',
               output = CASE WHEN complete_run.output IS NULL THEN r.output
                             ELSE nullif(complete_run.output, 'null'::jsonb) END,
               finished_at = v_now,
               updated_at = v_now,
               lease_worker_id = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
               admission_slot = NULL, recovery_checkpoint_id = NULL
         WHERE r.tenant_id = v_tenant
           AND r.workspace_key = v_wskey
           AND r.run_id = complete_run.run_id
           AND v_status = 'running'
           AND r.lease_worker_id = complete_run.worker_id
           AND r.lease_generation = complete_run.generation
           AND r.lease_expires_at >= v_now
        RETURNING r.deployment_ref, r.workspace_id, r.attempts, r.started_at
    ), recorded AS (
        INSERT INTO zeroth.run_attempts (tenant_id, workspace_key, run_id, attempt, lease_generation,
                                         worker_id, claimed_at, started_at, ended_at, outcome)
        SELECT v_tenant, v_wskey, complete_run.run_id, c.attempts, complete_run.generation,
               complete_run.worker_id, v_acquired, greatest(c.started_at, v_acquired), v_now,
               'completed'
          FROM completed c
    )
    SELECT c.deployment_ref, c.workspace_id INTO v_run FROM completed c;
    v_completed := FOUND;
    PERFORM set_config('zeroth.completion_records_attempt', 'off', true);
    IF NOT v_completed THEN
        PERFORM zeroth._explain_fenced_miss(v_tenant, v_wskey, complete_run.run_id, complete_run.worker_id,
                                            complete_run.generation, v_now, 'complete_run', '{running}');
        RETURN false;
    END IF;
    IF zeroth._free_slot(v_tenant, v_wskey, complete_run.run_id, complete_run.generation) THEN
        PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_tenant, v_run.workspace_id);
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION zeroth.complete_run(uuid, text, bigint, jsonb, text, text) IS
'complete_run: running → completed for the live lease (worker_id, generation); stores output (SQL NULL keeps the committed output, JSON null clears it), clears the lease, frees the admission slot. Returns false when fenced out. Raises ZP003 (holder but not running), ZP008. Notifies zeroth_wakeup when a slot was freed. Time: clock_timestamp().';
ALTER FUNCTION zeroth.complete_run(uuid, text, bigint, jsonb, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.complete_run(uuid, text, bigint, jsonb, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.complete_run(uuid, text, bigint, jsonb, text, text) TO zeroth_worker;
