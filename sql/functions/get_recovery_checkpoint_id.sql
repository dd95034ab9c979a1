-- get_recovery_checkpoint_id: the checkpoint the current lease holder resumes from (a claim sets
-- it when the run has checkpoints), or NULL. A scoped read; no locks. Raises nothing. Time: none.
CREATE OR REPLACE FUNCTION zeroth.get_recovery_checkpoint_id(run_id uuid, tenant_id text DEFAULT NULL, workspace_id text DEFAULT NULL)
    RETURNS uuid
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    RETURN (SELECT r.recovery_checkpoint_id FROM zeroth.runs r
             WHERE r.tenant_id = zeroth._scope_tenant(get_recovery_checkpoint_id.tenant_id, get_recovery_checkpoint_id.workspace_id)
               AND r.workspace_key = zeroth._workspace_key(get_recovery_checkpoint_id.workspace_id)
               AND r.run_id = get_recovery_checkpoint_id.run_id);
COMMENT ON FUNCTION zeroth.get_recovery_checkpoint_id(uuid, text, text) IS
'get_recovery_checkpoint_id: the checkpoint the current lease holder should resume from (set by a claim when the run has checkpoints), or NULL. Read only.';
ALTER FUNCTION zeroth.get_recovery_checkpoint_id(uuid, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.get_recovery_checkpoint_id(uuid, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.get_recovery_checkpoint_id(uuid, text, text) TO zeroth_worker;
