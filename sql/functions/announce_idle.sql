-- announce_idle: this session's worker waits for work of (deployment, tenant, workspace) and wants
-- a NOTIFY when some becomes claimable (the wakeup gate, sql/functions/internal/notify.sql). Takes
-- the scope's gate stripes it does not hold yet (`held`, as this function returned them last time
-- on this session) as session-level exclusive advisory locks, without waiting, and returns every
-- stripe the session now holds. A writer notifies only while a worker holds its stripe, so:
--   * claim once more after every call that returned a stripe more than it was given: a writer
--     that held that stripe (and so did not notify) has committed, and its run is visible now;
--   * while fewer than all stripes are held (another waiting worker, or a writer's open
--     transaction, holds the rest), keep polling on a short backoff as well as listening;
--   * call announce_busy as soon as a claim finds work again, so writers stop notifying.
-- Session locks end with the session: a worker that dies or reconnects holds nothing (call again,
-- with held = '{}', after every reconnect). LISTEN on zeroth_wakeup is separate and unchanged.
-- Raises ZP006 (workspace without tenant), ZP008 (bad deployment_ref, held not a list of distinct
-- stripes in 0..7).
CREATE OR REPLACE FUNCTION zeroth.announce_idle(
    deployment_ref text, tenant_id text DEFAULT NULL, workspace_id text DEFAULT NULL,
    held integer[] DEFAULT '{}')
    RETURNS integer[]
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_lock integer := zeroth._wakeup_lock(zeroth.wakeup_key(
        announce_idle.deployment_ref, announce_idle.tenant_id, announce_idle.workspace_id));
    v_held integer[] := zeroth._wakeup_stripes_arg(announce_idle.held);
    v_now_held integer[] := '{}';
BEGIN
    FOR v_stripe IN 0 .. zeroth._wakeup_stripes() - 1 LOOP
        IF v_stripe = ANY (v_held) THEN
            v_now_held := v_now_held || v_stripe;
        ELSIF pg_try_advisory_lock(v_lock, v_stripe) THEN
            v_now_held := v_now_held || v_stripe;
        END IF;
    END LOOP;
    RETURN v_now_held;
END
$$;
COMMENT ON FUNCTION zeroth.announce_idle(text, text, text, integer[]) IS
'announce_idle: this session waits for work of the scope: take the scope''s wakeup gate stripes not in held (session advisory locks, no wait) so writers NOTIFY; returns every stripe held. Claim again after it returned a new stripe. Raises ZP006, ZP008.';
ALTER FUNCTION zeroth.announce_idle(text, text, text, integer[]) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.announce_idle(text, text, text, integer[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.announce_idle(text, text, text, integer[]) TO zeroth_worker;
