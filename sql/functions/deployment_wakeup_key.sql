-- deployment_wakeup_key: the opaque key zeroth_wakeup carries when work may be claimable in any
-- scope of a deployment and a fleet worker waits on the deployment's wakeup gate
-- (announce_idle_deployment). A key means nothing without the owner-only secret and cannot be
-- computed for another deployment, nor matched to a scope's key. Read only; notifies nothing.
-- Raises ZP008.
CREATE OR REPLACE FUNCTION zeroth.deployment_wakeup_key(deployment_ref text)
    RETURNS text
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM zeroth._require_identifier(deployment_wakeup_key.deployment_ref, 'deployment_ref');
    RETURN zeroth._notify_key('wakeup_deployment', ARRAY[deployment_wakeup_key.deployment_ref]);
END
$$;
COMMENT ON FUNCTION zeroth.deployment_wakeup_key(text) IS
'deployment_wakeup_key: the opaque payload the wakeup channel carries for work in any scope of this deployment while a fleet worker waits on its gate (announce_idle_deployment). Read only; notifies nothing. Raises ZP008.';
ALTER FUNCTION zeroth.deployment_wakeup_key(text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.deployment_wakeup_key(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.deployment_wakeup_key(text) TO zeroth_worker;
