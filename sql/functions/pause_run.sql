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
    v_tenant text := zeroth._scope_tenant(pause_run.tenant_id, pause_run.workspace_id);
    v_wskey  text := zeroth._workspace_key(pause_run.workspace_id);
    v_end    record;
BEGIN
    PERFORM zeroth._require_identifier(pause_run.reason, 'reason');

    -- The settle path (sql/functions/internal/settle.sql): checks, lock, clock, settle. Waiting
    -- is not a failure: the attempt is given back, so approval loops never use up the retry
    -- budget (nor push attempts past max_attempts).
    v_end := zeroth._settle_one(v_tenant, v_wskey, pause_run.run_id, pause_run.worker_id,
                                pause_run.generation, 'pause', reason => pause_run.reason);
    PERFORM zeroth._raise_unlisted_edge('pause_run', pause_run.run_id, v_end.from_status, v_end.sqlstate);
    RETURN v_end.sqlstate IS NULL;
END
$$;
COMMENT ON FUNCTION zeroth.pause_run(uuid, text, bigint, text, text, text) IS
'pause_run: running → waiting with a reason, for the live lease (worker_id, generation); releases the lease and slot and gives the attempt back. Returns false when fenced out. Raises ZP003 (holder but not running), ZP008. Notifies zeroth_wakeup when a slot was freed. Time: clock_timestamp().';
ALTER FUNCTION zeroth.pause_run(uuid, text, bigint, text, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.pause_run(uuid, text, bigint, text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.pause_run(uuid, text, bigint, text, text, text) TO zeroth_worker;
