-- announce_idle_deployment: announce_idle for a fleet worker that serves every scope of a
-- deployment (claim_and_start_scopes without a list): takes the stripes of the deployment's
-- wakeup gate this session does not hold yet (session-level exclusive advisory locks, no wait)
-- and returns every stripe it holds (from pg_locks). Every writer of any scope of the deployment
-- then notifies with deployment_wakeup_key while its stripe is held. The rules of announce_idle
-- apply: claim once more after a call that returned a new stripe, poll while fewer than 8 are
-- held, call announce_busy_deployment when busy, and write nothing on this session.
-- Raises ZP008 (bad deployment_ref).
CREATE OR REPLACE FUNCTION zeroth.announce_idle_deployment(deployment_ref text)
    RETURNS integer[]
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_checked text := zeroth.deployment_wakeup_key(announce_idle_deployment.deployment_ref);
    v_lock bigint := zeroth._wakeup_lock_deployment(announce_idle_deployment.deployment_ref);
BEGIN
    RETURN zeroth._take_wakeup_stripes(v_lock);
END
$$;
COMMENT ON FUNCTION zeroth.announce_idle_deployment(text) IS
'announce_idle_deployment: this session waits for work in any scope of the deployment: take the deployment''s wakeup gate stripes it does not hold (session advisory locks, no wait) so writers NOTIFY with deployment_wakeup_key; returns every stripe held. Claim again after it returned a new stripe. Raises ZP008.';
ALTER FUNCTION zeroth.announce_idle_deployment(text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.announce_idle_deployment(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.announce_idle_deployment(text) TO zeroth_worker;
