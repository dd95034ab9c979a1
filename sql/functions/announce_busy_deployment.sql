-- announce_busy_deployment: let go of every stripe of the deployment's wakeup gate this session
-- holds (read from pg_locks), so writers stop notifying it. Returns how many were let go.
-- Raises ZP008 (bad deployment_ref).
CREATE OR REPLACE FUNCTION zeroth.announce_busy_deployment(deployment_ref text)
    RETURNS integer
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_checked text := zeroth.deployment_wakeup_key(announce_busy_deployment.deployment_ref);
    v_lock bigint := zeroth._wakeup_lock_deployment(announce_busy_deployment.deployment_ref);
BEGIN
    RETURN zeroth._release_wakeup_stripes(v_lock);
END
$$;
COMMENT ON FUNCTION zeroth.announce_busy_deployment(text) IS
'announce_busy_deployment: let go of every stripe of the deployment''s wakeup gate this session holds (announce_idle_deployment), so writers stop notifying; returns how many were let go. Raises ZP008.';
ALTER FUNCTION zeroth.announce_busy_deployment(text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.announce_busy_deployment(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.announce_busy_deployment(text) TO zeroth_worker;
