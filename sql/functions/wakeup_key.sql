-- wakeup_key: the opaque key zeroth_wakeup carries for a (deployment, tenant, workspace) whose
-- work may be claimable, for a worker to compare with what it hears (wakeup_key, control_key and
-- run_finished_key are the three channels' keys). A key means nothing without the owner-only
-- secret and cannot be computed for another subject. Read only; notifies nothing.
-- Raises ZP006 (workspace without tenant), ZP008.
CREATE OR REPLACE FUNCTION zeroth.wakeup_key(deployment_ref text, tenant_id text DEFAULT NULL, workspace_id text DEFAULT NULL)
    RETURNS text
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_tenant text := zeroth._scope_tenant(wakeup_key.tenant_id, wakeup_key.workspace_id);
BEGIN
    IF v_tenant IS NULL THEN
        RAISE EXCEPTION 'a workspace_id needs a tenant_id' USING ERRCODE = 'ZP006';
    END IF;
    PERFORM zeroth._require_identifier(wakeup_key.deployment_ref, 'deployment_ref');
    RETURN zeroth._notify_key('wakeup', ARRAY[v_tenant, wakeup_key.workspace_id, wakeup_key.deployment_ref]);
END
$$;
COMMENT ON FUNCTION zeroth.wakeup_key(text, text, text) IS
'wakeup_key: the opaque payload the wakeup channel carries for this (deployment, tenant, workspace). Read only; notifies nothing. Raises ZP006, ZP008.';
ALTER FUNCTION zeroth.wakeup_key(text, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.wakeup_key(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.wakeup_key(text, text, text) TO zeroth_worker;
