-- list_schedules: read: the schedules of one scope (tenant, workspace), by name; with
-- deployment_refs, only those of the listed deployments. Takes no lock, changes nothing. Raises
-- ZP006 invalid_scope, ZP008. Time: none.
CREATE OR REPLACE FUNCTION zeroth.list_schedules(
    tenant_id       text   DEFAULT NULL,
    workspace_id    text   DEFAULT NULL,
    deployment_refs text[] DEFAULT NULL)
    RETURNS SETOF zeroth.schedules
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_tenant text := zeroth._scope_tenant(list_schedules.tenant_id, list_schedules.workspace_id);
BEGIN
    IF v_tenant IS NULL THEN
        RAISE EXCEPTION 'a workspace_id needs a tenant_id' USING ERRCODE = 'ZP006';
    END IF;
    PERFORM zeroth._require(list_schedules.deployment_refs IS NULL
                            OR cardinality(list_schedules.deployment_refs) <= 100,
                            'deployment_refs must be NULL or at most 100 deployments');
    RETURN QUERY
    SELECT s.*
      FROM zeroth.schedules s
     WHERE s.tenant_id = v_tenant
       AND s.workspace_key = zeroth._workspace_key(list_schedules.workspace_id)
       AND (list_schedules.deployment_refs IS NULL OR s.deployment_ref = ANY (list_schedules.deployment_refs))
     ORDER BY s.name;
END
$$;
COMMENT ON FUNCTION zeroth.list_schedules(text, text, text[]) IS
'list_schedules: read: the schedules of one scope by name (optionally of the listed deployments only). Takes no lock. Raises ZP006 invalid_scope, ZP008 invalid_argument. Time: none.';
ALTER FUNCTION zeroth.list_schedules(text, text, text[]) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.list_schedules(text, text, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.list_schedules(text, text, text[]) TO zeroth_worker;
