-- list_thread_runs: the runs of a thread in this scope, newest first (created_at, run_id), at
-- most max_runs (capped at 1000), through runs_thread_idx. A scoped read: no locks, no
-- errors (an unknown thread is no rows). Time: none.
CREATE OR REPLACE FUNCTION zeroth.list_thread_runs(
    thread_id    text,
    tenant_id    text    DEFAULT NULL,
    workspace_id text    DEFAULT NULL,
    max_runs     integer DEFAULT 20)
    RETURNS SETOF zeroth.thread_run
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    BEGIN ATOMIC
        SELECT t.*
          FROM zeroth.runs r
         CROSS JOIN LATERAL zeroth._thread_run(r) AS t
         WHERE r.tenant_id = zeroth._scope_tenant(list_thread_runs.tenant_id, list_thread_runs.workspace_id)
           AND r.workspace_key = zeroth._workspace_key(list_thread_runs.workspace_id)
           AND r.thread_id = list_thread_runs.thread_id
         ORDER BY r.created_at DESC, r.run_id DESC
         LIMIT greatest(least(list_thread_runs.max_runs, 1000), 0);
    END;
COMMENT ON FUNCTION zeroth.list_thread_runs(text, text, text, integer) IS
'list_thread_runs: the runs of a thread, newest first (created_at, run_id), at most max_runs (capped at 1000). Read only.';
ALTER FUNCTION zeroth.list_thread_runs(text, text, text, integer) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.list_thread_runs(text, text, text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.list_thread_runs(text, text, text, integer) TO zeroth_worker;
