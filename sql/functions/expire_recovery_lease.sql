-- expire_recovery_lease: make owned running work immediately reclaimable without losing anything:
-- for exactly the live lease (worker_id, generation), lease_expires_at := now - 1 µs, holder and
-- recovery checkpoint kept, slot freed. Used when the setup of a recovered run fails (the run must
-- stay claimable, never released to a NULL lease); the next recovery counts an attempt. Locks:
-- slot, then run. Returns false on no match. Raises ZP003 (the caller's live lease but the edge is not listed in zeroth.run_transitions), ZP008. Notifies zeroth_wakeup.
-- Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.expire_recovery_lease(
    run_id       uuid,
    worker_id    text,
    generation   bigint,
    tenant_id    text DEFAULT NULL,
    workspace_id text DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_tenant text := zeroth._scope_tenant(expire_recovery_lease.tenant_id, expire_recovery_lease.workspace_id);
    v_wskey  text := zeroth._workspace_key(expire_recovery_lease.workspace_id);
    v_end    record;
BEGIN
    -- The settle path (sql/functions/internal/settle.sql): checks, lock, clock, settle.
    v_end := zeroth._settle_one(v_tenant, v_wskey, expire_recovery_lease.run_id, expire_recovery_lease.worker_id,
                                expire_recovery_lease.generation, 'expire');
    -- The caller's live lease on a running run whose edge is not listed (a DBA removed it):
    -- refused out loud, never reported as a lost lease. A claim not started: false, as ever.
    IF v_end.from_status = 'running' THEN
        PERFORM zeroth._raise_unlisted_edge('expire_recovery_lease', expire_recovery_lease.run_id, v_end.from_status, v_end.sqlstate);
    END IF;
    RETURN v_end.sqlstate IS NULL;
END
$$;
COMMENT ON FUNCTION zeroth.expire_recovery_lease(uuid, text, bigint, text, text) IS
'expire_recovery_lease: for exactly the live lease (worker_id, generation) of a running run, set lease_expires_at to now - 1 µs, keeping holder and recovery checkpoint, freeing the slot: immediately reclaimable by claim_orphaned (which counts an attempt). Returns false on no match. Raises ZP003 (the caller''s live lease but the edge is not listed in zeroth.run_transitions), ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';
ALTER FUNCTION zeroth.expire_recovery_lease(uuid, text, bigint, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.expire_recovery_lease(uuid, text, bigint, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.expire_recovery_lease(uuid, text, bigint, text, text) TO zeroth_worker;
