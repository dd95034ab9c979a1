-- control_key: the opaque key zeroth_control carries for this worker id when a cancel was
-- requested for one of its runs (confirm with renew_leases before acting). Derived from the
-- owner-only secret (zeroth._notify_key), so it cannot be computed for another subject. Read
-- only; notifies nothing. Raises ZP008.
CREATE OR REPLACE FUNCTION zeroth.control_key(worker_id text) RETURNS text
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM zeroth._require_identifier(control_key.worker_id, 'worker_id');
    RETURN zeroth._notify_key('control', ARRAY[control_key.worker_id]);
END
$$;
COMMENT ON FUNCTION zeroth.control_key(text) IS
'control_key: the opaque payload the control channel carries for this worker id (a cancel was requested for one of its runs; confirm with renew_leases before acting). Read only; notifies nothing. Raises ZP008.';
ALTER FUNCTION zeroth.control_key(text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.control_key(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.control_key(text) TO zeroth_worker;
