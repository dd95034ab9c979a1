-- announce_busy: this session's worker has more work than slots again (or stops): let go of every
-- stripe of the scope's wakeup gate this session holds (read from pg_locks), so writers of the
-- scope stop notifying. Returns how many stripes were let go.
-- Raises ZP006 (workspace without tenant), ZP008 (bad deployment_ref).
CREATE OR REPLACE FUNCTION zeroth.announce_busy(
    deployment_ref text, tenant_id text DEFAULT NULL, workspace_id text DEFAULT NULL)
    RETURNS integer
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    -- wakeup_key checks the scope (ZP006, ZP008); the gate has a key of its own.
    v_checked text := zeroth.wakeup_key(announce_busy.deployment_ref, announce_busy.tenant_id, announce_busy.workspace_id);
    v_lock bigint := zeroth._wakeup_lock(zeroth._scope_tenant(announce_busy.tenant_id, announce_busy.workspace_id),
                                         announce_busy.workspace_id, announce_busy.deployment_ref);
BEGIN
    RETURN zeroth._release_wakeup_stripes(v_lock);
END
$$;
COMMENT ON FUNCTION zeroth.announce_busy(text, text, text) IS
'announce_busy: let go of every stripe of the scope''s wakeup gate this session holds (announce_idle), so writers stop notifying; returns how many were let go. Raises ZP006, ZP008.';
ALTER FUNCTION zeroth.announce_busy(text, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.announce_busy(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.announce_busy(text, text, text) TO zeroth_worker;
