-- list_deployments: read: the registry of deployments (zeroth.deployments), by name; with
-- deployment_ref, that one only. For the roles that read no table (zeroth_worker: an App, a CLI,
-- a worker in another language that wants the retry count its runs get). Takes no lock, changes
-- nothing. Raises ZP008. Time: none.
CREATE OR REPLACE FUNCTION zeroth.list_deployments(
    deployment_ref text DEFAULT NULL)
    RETURNS SETOF zeroth.deployments
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF list_deployments.deployment_ref IS NOT NULL THEN
        PERFORM zeroth._require_identifier(list_deployments.deployment_ref, 'deployment_ref');
    END IF;
    RETURN QUERY
    SELECT d.*
      FROM zeroth.deployments d
     WHERE list_deployments.deployment_ref IS NULL OR d.deployment_ref = list_deployments.deployment_ref
     ORDER BY d.deployment_ref;
END
$$;
COMMENT ON FUNCTION zeroth.list_deployments(text) IS
'list_deployments: read: the registered deployments and their defaults (zeroth.deployments), by name, or the one named. Takes no lock. Raises ZP008 invalid_argument. Time: none.';
ALTER FUNCTION zeroth.list_deployments(text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.list_deployments(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.list_deployments(text) TO zeroth_worker;
