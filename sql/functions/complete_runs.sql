DROP FUNCTION IF EXISTS zeroth._complete_locked_runs(text, text, text, uuid[], bigint[], jsonb[], uuid[], timestamptz);
DROP FUNCTION IF EXISTS zeroth._complete_locked_runs(text, text, text, uuid[], bigint[], jsonb[], uuid[], timestamptz[], timestamptz);
DROP FUNCTION IF EXISTS zeroth._complete_locked_runs(text, text, text, uuid[], bigint[], jsonb[], uuid[], tid[], timestamptz[], timestamptz);

-- complete_runs: complete_run for a batch of one worker's runs. runs[i] = (run_ids[i],
-- generations[i]) completes only while that exact lease is live, held by worker_id, and the run is
-- running; outputs[i] as in complete_run (SQL NULL — or no outputs array — keeps the output written
-- with commit_fenced, JSON null clears it). Returns one row per requested run, in input order,
-- with completed = false for a refused one (fenced out, or not running: complete_run explains
-- which). Locks: the admission slots, then the runs, each in run_id order (zeroth._lock_settle);
-- settled by zeroth._settle. Raises ZP008. Notifies zeroth_wakeup once per deployment when
-- concurrency slots were freed.
-- Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.complete_runs(
    worker_id    text,
    run_ids      uuid[],
    generations  bigint[],
    outputs      jsonb[] DEFAULT NULL,
    tenant_id    text    DEFAULT NULL,
    workspace_id text    DEFAULT NULL)
    RETURNS TABLE (run_id uuid, completed boolean)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    -- A row another session holds (an application's cancel in an open transaction) is waited
    -- for at most this long, then 55P03: the worker retries until its give-up deadline rather
    -- than queue every later completion behind one lock (red-team pass 8).
    SET lock_timeout = '2s' AS $$
DECLARE
    v_tenant text := zeroth._scope_tenant(complete_runs.tenant_id, complete_runs.workspace_id);
    v_wskey  text := zeroth._workspace_key(complete_runs.workspace_id);
    v_lock   record;
BEGIN
    -- The argument checks in one statement, in order (the first that fails raises): every
    -- worker cycle runs them (complete_and_claim), and each PERFORM is a statement of its own
    -- (issue 30, sixth session: four statements were three more than the checks need).
    PERFORM zeroth._require_identifier(complete_runs.worker_id, 'worker_id'),
            zeroth._require_lease_batch(complete_runs.run_ids, complete_runs.generations),
            zeroth._require(complete_runs.outputs IS NULL
                            OR cardinality(complete_runs.outputs) = cardinality(complete_runs.run_ids),
                            'outputs must be NULL or as long as run_ids'),
            -- outputs[i] pairs with run_ids[i] by subscript: '[0:1]={…}' would shift every
            -- output by one.
            zeroth._require(coalesce(array_ndims(complete_runs.outputs), 1) = 1
                            AND coalesce(array_lower(complete_runs.outputs, 1), 1) = 1,
                            'outputs must be a one-dimensional array indexed from 1');

    v_lock := zeroth._lock_settle(v_tenant, v_wskey, complete_runs.worker_id,
                                  complete_runs.run_ids, complete_runs.generations);
    RETURN QUERY
    SELECT s.run_id, s.sqlstate IS NULL
      FROM zeroth._settle(v_tenant, v_wskey, complete_runs.worker_id,
                          complete_runs.run_ids, complete_runs.generations,
                          array_fill('complete'::text, ARRAY[cardinality(complete_runs.run_ids)]),
                          complete_runs.outputs, NULL, NULL, NULL, NULL,
                          v_lock.run_rows, v_lock.slot_rows, zeroth._now()) s
     ORDER BY s.ord;
END
$$;
COMMENT ON FUNCTION zeroth.complete_runs(text, uuid[], bigint[], jsonb[], text, text) IS
'complete_runs: complete_run for a batch of one worker''s runs in one statement; run_ids[i] completes only while generations[i] is live, held by worker_id and running; outputs[i] as complete_run''s output. One row per requested run in input order, completed = false when refused. Locks slots then runs, each in run_id order. Raises ZP008. Notifies zeroth_wakeup (once per deployment) when slots were freed. Time: clock_timestamp().';
ALTER FUNCTION zeroth.complete_runs(text, uuid[], bigint[], jsonb[], text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.complete_runs(text, uuid[], bigint[], jsonb[], text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.complete_runs(text, uuid[], bigint[], jsonb[], text, text) TO zeroth_worker;
