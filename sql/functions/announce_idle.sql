-- announce_idle: this session's worker waits for work of (deployment, tenant, workspace) and wants
-- a NOTIFY when some becomes claimable (the wakeup gate, sql/functions/internal/notify.sql). Takes
-- the scope's gate stripes this session does not hold yet as session-level exclusive advisory
-- locks, without waiting, and returns every stripe it now holds (read from pg_locks, so a second
-- call takes nothing twice). A writer notifies only while a worker holds its stripe, so:
--   * claim once more after every call that returned a stripe the last one did not: a writer
--     that held that stripe (and so did not notify) has committed, and its run is visible now;
--   * while fewer than all 8 stripes are held (another waiting worker, or a writer's open
--     transaction, holds the rest), keep polling on a backoff as well as listening;
--   * call announce_busy once a claim fills every free slot (or none is free), so writers stop
--     notifying.
-- Call it on the LISTEN connection and write nothing on that session (its own locks never stop
-- its own writes, so those would never notify). Session locks end with the session: after a
-- reconnect nothing is held. Raises ZP006 (workspace without tenant), ZP008 (bad deployment_ref).
CREATE OR REPLACE FUNCTION zeroth.announce_idle(
    deployment_ref text, tenant_id text DEFAULT NULL, workspace_id text DEFAULT NULL)
    RETURNS integer[]
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    -- wakeup_key checks the scope (ZP006, ZP008); the gate has a key of its own.
    v_checked text := zeroth.wakeup_key(announce_idle.deployment_ref, announce_idle.tenant_id, announce_idle.workspace_id);
    v_lock bigint := zeroth._wakeup_lock(zeroth._scope_tenant(announce_idle.tenant_id, announce_idle.workspace_id),
                                         announce_idle.workspace_id, announce_idle.deployment_ref);
BEGIN
    RETURN zeroth._take_wakeup_stripes(v_lock);
END
$$;
COMMENT ON FUNCTION zeroth.announce_idle(text, text, text) IS
'announce_idle: this session waits for work of the scope: take the scope''s wakeup gate stripes it does not hold (session advisory locks, no wait) so writers NOTIFY; returns every stripe held. Claim again after it returned a new stripe. Raises ZP006, ZP008.';
ALTER FUNCTION zeroth.announce_idle(text, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.announce_idle(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.announce_idle(text, text, text) TO zeroth_worker;
