-- current_holder: the worker id the run's lease names (live, or expired and not yet taken over),
-- or NULL. A scoped read; no locks. Raises nothing. Time: none.
CREATE OR REPLACE FUNCTION zeroth.current_holder(run_id uuid, tenant_id text DEFAULT NULL, workspace_id text DEFAULT NULL)
    RETURNS text
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    RETURN (SELECT r.lease_worker_id FROM zeroth.runs r
             WHERE r.tenant_id = zeroth._scope_tenant(current_holder.tenant_id, current_holder.workspace_id)
               AND r.workspace_key = zeroth._workspace_key(current_holder.workspace_id)
               AND r.run_id = current_holder.run_id);
COMMENT ON FUNCTION zeroth.current_holder(uuid, text, text) IS
'current_holder: the worker id named in the run''s lease (live or expired but not yet taken over), or NULL. Read only.';
ALTER FUNCTION zeroth.current_holder(uuid, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.current_holder(uuid, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.current_holder(uuid, text, text) TO zeroth_worker;
