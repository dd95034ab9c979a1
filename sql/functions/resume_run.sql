-- resume_run: waiting → pending (approval given, interrupt resolved). input, when given, is stored
-- as metadata.resume_input for the next drive. A run queued behind its thread's active run is not
-- paused and cannot be resumed (ZP003): it starts when that run ends. Locks: the run row. Returns
-- true. Raises ZP001 (unknown run), ZP003 (not waiting, or queued), ZP008. Notifies zeroth_wakeup.
-- Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.resume_run(
    run_id       uuid,
    tenant_id    text  DEFAULT NULL,
    workspace_id text  DEFAULT NULL,
    input        jsonb DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now    timestamptz := zeroth._now();
    v_tenant text := zeroth._scope_tenant(resume_run.tenant_id, resume_run.workspace_id);
    v_wskey  text := zeroth._workspace_key(resume_run.workspace_id);
    v_run    record;
    v_row    tid;
BEGIN
    PERFORM zeroth._require(resume_run.run_id IS NOT NULL, 'run_id must not be NULL');

    -- The run by its primary key alone, then the UPDATE by its address: a lookup that named
    -- status 'waiting' could be planned as a walk of runs_waiting_idx (every waiting run: the
    -- thread queues' too), as a plan made before zeroth.runs' first ANALYZE did.
    SELECT r.ctid INTO v_row
      FROM zeroth.runs r
     WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey AND r.run_id = resume_run.run_id
       FOR UPDATE;
    UPDATE zeroth.runs r
       SET status = 'pending',
           wait_reason = NULL,
           run_after = v_now,
           metadata = CASE WHEN resume_run.input IS NULL THEN r.metadata
                           ELSE r.metadata || jsonb_build_object('resume_input', resume_run.input) END,
           updated_at = v_now
     WHERE r.ctid = v_row
       AND r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = resume_run.run_id
       AND r.status = 'waiting'
       AND r.thread_queued_at IS NULL
    RETURNING r.deployment_ref, r.workspace_id INTO v_run;
    IF NOT FOUND THEN
        IF EXISTS (SELECT 1 FROM zeroth.runs r
                    WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey AND r.run_id = resume_run.run_id
                      AND r.thread_queued_at IS NOT NULL) THEN
            RAISE EXCEPTION 'run % is queued behind the active run of its thread; it starts when that run ends',
                resume_run.run_id USING ERRCODE = 'ZP003';
        END IF;
        PERFORM zeroth._explain_admin_miss(v_tenant, v_wskey, resume_run.run_id, 'resume_run', '{waiting}');
    END IF;
    PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_tenant, v_run.workspace_id);
    RETURN true;
END
$$;
COMMENT ON FUNCTION zeroth.resume_run(uuid, text, text, jsonb) IS
'resume_run: waiting → pending; input (if given) is stored as metadata.resume_input. A run queued behind its thread''s active run cannot be resumed. Raises ZP001 (unknown run), ZP003 (not waiting, or queued), ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';
ALTER FUNCTION zeroth.resume_run(uuid, text, text, jsonb) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.resume_run(uuid, text, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.resume_run(uuid, text, text, jsonb) TO zeroth_worker;
