-- sql/functions/internal/errors.sql: the errors of admin transitions and the stop document of a run ended by someone else.
-- Internal helpers: SECURITY INVOKER, executable by zeroth_owner only (they run inside the
-- SECURITY DEFINER public functions). Re-applied by every upgrade (sql/README.md).

-- Raises ZP001 when no run has this id in this scope, else ZP003 naming the status that refused.
CREATE OR REPLACE FUNCTION zeroth._explain_admin_miss(tenant_id text, workspace_key text, run_id uuid, transition text,
                                           allowed zeroth.run_status[])
    RETURNS void
    LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_status zeroth.run_status;
BEGIN
    SELECT r.status INTO v_status FROM zeroth.runs r
     WHERE r.tenant_id = _explain_admin_miss.tenant_id
       AND r.workspace_key = _explain_admin_miss.workspace_key
       AND r.run_id = _explain_admin_miss.run_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % not found in this scope', run_id USING ERRCODE = 'ZP001';
    END IF;
    RAISE EXCEPTION '% needs a run in status %, run % is %', transition, allowed, run_id, v_status
        USING ERRCODE = 'ZP003';
END
$$;
COMMENT ON FUNCTION zeroth._explain_admin_miss(text, text, uuid, text, zeroth.run_status[]) IS 'Internal: raise ZP001 (no such run in scope) or ZP003 (wrong status) after an admin UPDATE matched nothing.';
ALTER FUNCTION zeroth._explain_admin_miss(text, text, uuid, text, zeroth.run_status[]) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._explain_admin_miss(text, text, uuid, text, zeroth.run_status[]) FROM PUBLIC;

CREATE OR REPLACE FUNCTION zeroth._stop_error(stop_reason text, message text, worker_id text, generation bigint, previous jsonb)
    RETURNS jsonb
    LANGUAGE sql IMMUTABLE
    RETURN jsonb_build_object('stop_reason', stop_reason, 'message', message, 'worker_id', worker_id,
                              'lease_generation', generation)
           || CASE WHEN previous IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('previous_error', previous) END;
COMMENT ON FUNCTION zeroth._stop_error(text, text, text, bigint, jsonb) IS 'Internal: the error document of a run ended by someone other than its owner ({stop_reason, message, worker_id, lease_generation[, previous_error]}).';
ALTER FUNCTION zeroth._stop_error(text, text, text, bigint, jsonb) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._stop_error(text, text, text, bigint, jsonb) FROM PUBLIC;
