-- cancel_run: the lease holder ends its run as cancelled (after seeing a cancel request, or on its
-- own). pending or running → cancelled, fenced; clears the lease and frees the slot. Returns false
-- when fenced out. Raises ZP003 (the caller's live lease but the edge is not listed in zeroth.run_transitions), ZP008. Notifies zeroth_wakeup when a slot was freed. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.cancel_run(
    run_id       uuid,
    worker_id    text,
    generation   bigint,
    tenant_id    text DEFAULT NULL,
    workspace_id text DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_tenant text := zeroth._scope_tenant(cancel_run.tenant_id, cancel_run.workspace_id);
    v_wskey  text := zeroth._workspace_key(cancel_run.workspace_id);
    v_end    record;
BEGIN
    -- The settle path (sql/functions/internal/settle.sql): checks, lock, clock, settle.
    v_end := zeroth._settle_one(v_tenant, v_wskey, cancel_run.run_id, cancel_run.worker_id,
                                cancel_run.generation, 'cancel');
    -- The caller's live lease but no listed edge (a DBA removed it): refused out loud (ZP003),
    -- never reported as a lost lease.
    PERFORM zeroth._raise_unlisted_edge('cancel_run', cancel_run.run_id, v_end.from_status, v_end.sqlstate);
    RETURN v_end.sqlstate IS NULL;
END
$$;
COMMENT ON FUNCTION zeroth.cancel_run(uuid, text, bigint, text, text) IS
'cancel_run: the live lease holder (worker_id, generation) ends its pending or running run as cancelled; clears the lease, frees the slot. Returns false when fenced out. Raises ZP003 (the caller''s live lease but the edge is not listed in zeroth.run_transitions), ZP008. Notifies zeroth_wakeup when a slot was freed. Time: clock_timestamp().';
ALTER FUNCTION zeroth.cancel_run(uuid, text, bigint, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.cancel_run(uuid, text, bigint, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.cancel_run(uuid, text, bigint, text, text) TO zeroth_worker;
