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
    v_tenant text := zeroth._scope_tenant(complete_run.tenant_id, complete_run.workspace_id);
    v_wskey  text := zeroth._workspace_key(complete_run.workspace_id);
    v_end    record;
BEGIN
    -- The settle path (sql/functions/internal/settle.sql): checks, lock, clock, settle; the
    -- ended attempt is recorded in the settling statement.
    v_end := zeroth._settle_one(v_tenant, v_wskey, complete_run.run_id, complete_run.worker_id,
                                complete_run.generation, 'complete', payload => complete_run.output);
    PERFORM zeroth._raise_unlisted_edge('complete_run', complete_run.run_id, v_end.from_status, v_end.sqlstate);
    RETURN v_end.sqlstate IS NULL;
END
$$;
COMMENT ON FUNCTION zeroth.complete_run(uuid, text, bigint, jsonb, text, text) IS
'complete_run: running → completed for the live lease (worker_id, generation); stores output (SQL NULL keeps the committed output, JSON null clears it), clears the lease, frees the admission slot. Returns false when fenced out. Raises ZP003 (holder but not running), ZP008. Notifies zeroth_wakeup when a slot was freed. Time: clock_timestamp().';
ALTER FUNCTION zeroth.complete_run(uuid, text, bigint, jsonb, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.complete_run(uuid, text, bigint, jsonb, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.complete_run(uuid, text, bigint, jsonb, text, text) TO zeroth_worker;
