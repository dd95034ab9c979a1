-- current_generation: the run's lease generation (0 before its first claim), or NULL when no run
-- has this id in this scope. A scoped read; no locks. Raises nothing. Time: none.
CREATE OR REPLACE FUNCTION zeroth.current_generation(run_id uuid, tenant_id text DEFAULT NULL, workspace_id text DEFAULT NULL)
    RETURNS bigint
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    RETURN (SELECT r.lease_generation FROM zeroth.runs r
             WHERE r.tenant_id = zeroth._scope_tenant(current_generation.tenant_id, current_generation.workspace_id)
               AND r.workspace_key = zeroth._workspace_key(current_generation.workspace_id)
               AND r.run_id = current_generation.run_id);
COMMENT ON FUNCTION zeroth.current_generation(uuid, text, text) IS
'current_generation: the run''s lease generation (0 before its first claim), or NULL when no run has this id in this scope. Read only.';
ALTER FUNCTION zeroth.current_generation(uuid, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.current_generation(uuid, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.current_generation(uuid, text, text) TO zeroth_worker;
