-- run_events_key: the opaque key zeroth_run_events carries when this run's event stream moves
-- (an event appended, its END written), for a subscriber to compare with what it hears.
-- Derived from the owner-only secret (zeroth._notify_key). Read only; notifies nothing.
-- Raises ZP006 (workspace without tenant), ZP008.
CREATE OR REPLACE FUNCTION zeroth.run_events_key(run_id uuid, tenant_id text DEFAULT NULL, workspace_id text DEFAULT NULL)
    RETURNS text
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_tenant text := zeroth._scope_tenant(run_events_key.tenant_id, run_events_key.workspace_id);
BEGIN
    IF v_tenant IS NULL THEN
        RAISE EXCEPTION 'a workspace_id needs a tenant_id' USING ERRCODE = 'ZP006';
    END IF;
    PERFORM zeroth._require(run_events_key.run_id IS NOT NULL, 'run_id must not be NULL');
    RETURN zeroth._run_events_key(v_tenant, zeroth._workspace_key(run_events_key.workspace_id),
                                  run_events_key.run_id);
END
$$;
COMMENT ON FUNCTION zeroth.run_events_key(uuid, text, text) IS
'run_events_key: the opaque payload the run-events channel carries when this run''s event stream moves. Read only; notifies nothing. Raises ZP006, ZP008.';
ALTER FUNCTION zeroth.run_events_key(uuid, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.run_events_key(uuid, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.run_events_key(uuid, text, text) TO zeroth_worker;
