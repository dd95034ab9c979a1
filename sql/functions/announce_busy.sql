-- announce_busy: this session's worker has work again (or stops): let go of the scope's wakeup gate
-- stripes announce_idle returned (`held`), so writers of the scope stop notifying. A stripe this
-- session does not hold is skipped. Returns how many stripes were let go.
-- Raises ZP006 (workspace without tenant), ZP008 (bad deployment_ref, held not a list of distinct
-- stripes in 0..7).
CREATE OR REPLACE FUNCTION zeroth.announce_busy(
    deployment_ref text, tenant_id text DEFAULT NULL, workspace_id text DEFAULT NULL,
    held integer[] DEFAULT '{}')
    RETURNS integer
    -- pg_advisory_unlock of a stripe the session does not hold returns false (with a WARNING).
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_lock integer := zeroth._wakeup_lock(zeroth.wakeup_key(
        announce_busy.deployment_ref, announce_busy.tenant_id, announce_busy.workspace_id));
    v_released integer := 0;
    v_stripe integer;
BEGIN
    FOR v_stripe IN SELECT unnest(zeroth._wakeup_stripes_arg(announce_busy.held)) LOOP
        IF pg_advisory_unlock(v_lock, v_stripe) THEN
            v_released := v_released + 1;
        END IF;
    END LOOP;
    RETURN v_released;
END
$$;
COMMENT ON FUNCTION zeroth.announce_busy(text, text, text, integer[]) IS
'announce_busy: let go of the scope''s wakeup gate stripes in held (announce_idle), so writers stop notifying; returns how many were held and let go. Raises ZP006, ZP008.';
ALTER FUNCTION zeroth.announce_busy(text, text, text, integer[]) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.announce_busy(text, text, text, integer[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.announce_busy(text, text, text, integer[]) TO zeroth_worker;
