-- complete_runs: complete_run for a batch of one worker's runs. runs[i] = (run_ids[i],
-- generations[i]) completes only while that exact lease is live, held by worker_id, and the run is
-- running; outputs[i] as in complete_run (SQL NULL — or no outputs array — keeps the output written
-- with commit_fenced, JSON null clears it). Returns one row per requested run, in input order,
-- with completed = false for a refused one (fenced out, or not running: complete_run explains
-- which). Locks: the admission slots, then the runs, each in run_id order. Raises ZP008.
-- Notifies zeroth_wakeup once per deployment when concurrency slots were freed.
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
    SET lock_timeout = '2s'
    SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_now        timestamptz := zeroth._now();
    v_tenant     text := zeroth._scope_tenant(complete_runs.tenant_id, complete_runs.workspace_id);
    v_wskey      text := zeroth._workspace_key(complete_runs.workspace_id);
    v_running    uuid[];
    v_done       uuid[];
    v_freed_deps text[];
BEGIN
    PERFORM zeroth._require_identifier(complete_runs.worker_id, 'worker_id');
    PERFORM zeroth._require_lease_batch(complete_runs.run_ids, complete_runs.generations);
    PERFORM zeroth._require(complete_runs.outputs IS NULL
                            OR cardinality(complete_runs.outputs) = cardinality(complete_runs.run_ids),
                            'outputs must be NULL or as long as run_ids');
    -- outputs[i] pairs with run_ids[i] by subscript: '[0:1]={…}' would shift every output by one.
    PERFORM zeroth._require(coalesce(array_ndims(complete_runs.outputs), 1) = 1
                            AND coalesce(array_lower(complete_runs.outputs, 1), 1) = 1,
                            'outputs must be a one-dimensional array indexed from 1');

    -- Slot rows first, in run_id order: one probe of admission_slots_run_idx per requested run,
    -- as _lock_slot does. Joined to the array by filter, a generic plan made on few slots walked
    -- every slot of the scope (all its deployments) through admission_slots_pkey.
    PERFORM 1
       FROM (SELECT q.run_id, q.generation
               FROM unnest(complete_runs.run_ids, complete_runs.generations) AS q(run_id, generation)
              ORDER BY q.run_id) q
      CROSS JOIN LATERAL (
            SELECT s.slot_no
              FROM zeroth.admission_slots s
             WHERE s.run_id = q.run_id AND s.lease_generation = q.generation
               AND s.tenant_id = v_tenant AND s.workspace_key = v_wskey
               FOR UPDATE OF s) l;

    -- The run rows, in run_id order, then the clock (as zeroth._lock_leased_run: a batch that
    -- waited for a row judges every lease by the time it got them). Found by primary key
    -- (run_id = ANY: an index condition, whatever the statistics say); no predicate here or in the
    -- UPDATE names the status, so the planner cannot prefer runs_running_idx (every running run
    -- of the scope, scanned once per requested run when its row estimate is stale); the running
    -- ones are read from the locked rows.
    SELECT coalesce(array_agg(l.run_id) FILTER (WHERE l.status = 'running'), '{}') INTO v_running
      FROM (SELECT r.run_id, r.status
              FROM zeroth.runs r
              JOIN unnest(complete_runs.run_ids, complete_runs.generations) AS q(run_id, generation)
                ON r.run_id = q.run_id AND r.lease_generation = q.generation
             WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey
               AND r.run_id = ANY (complete_runs.run_ids)
               AND r.lease_worker_id = complete_runs.worker_id
             ORDER BY r.run_id
               FOR UPDATE OF r) l;
    v_now := zeroth._now();

    WITH requested AS (
        SELECT q.run_id, q.generation, complete_runs.outputs[q.position] AS output
          FROM unnest(complete_runs.run_ids, complete_runs.generations)
               WITH ORDINALITY AS q(run_id, generation, position)
    ), done AS (
        UPDATE zeroth.runs r
           SET status = 'completed',
               output = CASE WHEN q.output IS NULL THEN r.output
                             ELSE nullif(q.output, 'null'::jsonb) END,
               finished_at = v_now,
               updated_at = v_now,
               lease_worker_id = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
               admission_slot = NULL, recovery_checkpoint_id = NULL
          FROM requested q
         WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey
           -- By primary key with the array, not only by the join: a generic plan made while
           -- the table was small joined by filter and scanned the whole scope per run (the
           -- continuous-load collapse of issue 13). The array holds the running runs locked.
           AND r.run_id = ANY (v_running)
           AND r.run_id = q.run_id
           AND r.lease_worker_id = complete_runs.worker_id
           AND r.lease_generation = q.generation
           AND r.lease_expires_at >= v_now
        RETURNING r.run_id, q.generation
    ), freed AS (
        UPDATE zeroth.admission_slots s
           SET run_id = NULL, lease_generation = NULL
          FROM done d
         WHERE s.run_id = d.run_id
           AND s.tenant_id = v_tenant AND s.workspace_key = v_wskey
           AND s.lease_generation = d.generation
        RETURNING s.deployment_ref
    )
    SELECT (SELECT coalesce(array_agg(d.run_id), '{}') FROM done d),
           (SELECT coalesce(array_agg(DISTINCT f.deployment_ref), '{}') FROM freed f)
      INTO v_done, v_freed_deps;

    PERFORM zeroth._notify_wakeup(d.deployment_ref, v_tenant, complete_runs.workspace_id)
       FROM unnest(v_freed_deps) AS d(deployment_ref);

    RETURN QUERY
    SELECT q.run_id, q.run_id = ANY (v_done)
      FROM unnest(complete_runs.run_ids) WITH ORDINALITY AS q(run_id, position)
     ORDER BY q.position;
END
$$;
COMMENT ON FUNCTION zeroth.complete_runs(text, uuid[], bigint[], jsonb[], text, text) IS
'complete_runs: complete_run for a batch of one worker''s runs in one statement; run_ids[i] completes only while generations[i] is live, held by worker_id and running; outputs[i] as complete_run''s output. One row per requested run in input order, completed = false when refused. Locks slots then runs, each in run_id order. Raises ZP008. Notifies zeroth_wakeup (once per deployment) when slots were freed. Time: clock_timestamp().';
ALTER FUNCTION zeroth.complete_runs(text, uuid[], bigint[], jsonb[], text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.complete_runs(text, uuid[], bigint[], jsonb[], text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.complete_runs(text, uuid[], bigint[], jsonb[], text, text) TO zeroth_worker;
