-- get_thread_run: one run (with a thread or not) as zeroth.thread_run, or no row when no run
-- has this id in this scope; join re-reads a run with it. A scoped read: no locks, no errors.
-- Time: none.
CREATE OR REPLACE FUNCTION zeroth.get_thread_run(run_id uuid, tenant_id text DEFAULT NULL, workspace_id text DEFAULT NULL)
    RETURNS SETOF zeroth.thread_run
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    BEGIN ATOMIC
        SELECT t.*
          FROM zeroth.runs r
         CROSS JOIN LATERAL zeroth._thread_run(r) AS t
         WHERE r.tenant_id = zeroth._scope_tenant(get_thread_run.tenant_id, get_thread_run.workspace_id)
           AND r.workspace_key = zeroth._workspace_key(get_thread_run.workspace_id)
           AND r.run_id = get_thread_run.run_id;
    END;
COMMENT ON FUNCTION zeroth.get_thread_run(uuid, text, text) IS
'get_thread_run: one run (thread or not) as zeroth.thread_run, or no row when no run has this id in this scope. Read only.';
ALTER FUNCTION zeroth.get_thread_run(uuid, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.get_thread_run(uuid, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.get_thread_run(uuid, text, text) TO zeroth_worker;
