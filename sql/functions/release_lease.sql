-- release_lease: give up exactly (worker_id, generation) while that lease is live, whatever the
-- status, so cleanup of generation N can never touch generation N+1 even when the same worker
-- holds it, and a lease that expired (or an admin cleared) is no longer the caller's to move.
-- A pending run becomes claimable at once (lease cleared). A running run keeps its holder and
-- gets an expired lease instead (a running run without a lease would be stranded, F-02), so
-- claim_orphaned recovers it (the recovery counts the next attempt: an interrupted attempt is
-- spent, only hand_back_to_pending gives one back). Frees the slot. Locks: slot, then run. Returns false on no match.
-- Raises ZP003 (the caller's live lease but the edge is not listed in zeroth.run_transitions), ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.release_lease(
    run_id       uuid,
    worker_id    text,
    generation   bigint,
    tenant_id    text DEFAULT NULL,
    workspace_id text DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_tenant text := zeroth._scope_tenant(release_lease.tenant_id, release_lease.workspace_id);
    v_wskey  text := zeroth._workspace_key(release_lease.workspace_id);
    v_end    record;
BEGIN
    -- The settle path (sql/functions/internal/settle.sql): checks, lock, clock, settle (a
    -- pending run: released; a running one: expired in place).
    v_end := zeroth._settle_one(v_tenant, v_wskey, release_lease.run_id, release_lease.worker_id,
                                release_lease.generation, 'release');
    -- The caller's live lease but no listed edge (a DBA removed it): refused out loud (ZP003),
    -- never reported as a lost lease.
    PERFORM zeroth._raise_unlisted_edge('release_lease', release_lease.run_id, v_end.from_status, v_end.sqlstate);
    RETURN v_end.sqlstate IS NULL;
END
$$;
COMMENT ON FUNCTION zeroth.release_lease(uuid, text, bigint, text, text) IS
'release_lease: give up exactly (worker_id, generation) while that lease is live, any status, never bumps the generation. Pending: lease cleared, claimable at once. Running: holder kept, lease expired in place so claim_orphaned recovers it (never a running run without a lease; the recovery counts an attempt). Frees the slot. Returns false on no match (an expired or cleared lease included). Raises ZP003 (the caller''s live lease but the edge is not listed in zeroth.run_transitions), ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';
ALTER FUNCTION zeroth.release_lease(uuid, text, bigint, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.release_lease(uuid, text, bigint, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.release_lease(uuid, text, bigint, text, text) TO zeroth_worker;
