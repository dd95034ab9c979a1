-- The write of complete_runs, on runs it has locked: complete each requested run that is in
-- `running` (locked, running) while its lease is live; returns those completed (complete_runs
-- frees their slots). The ended attempts go into the attempt history in the same statement, one
-- INSERT … SELECT for the batch (the trigger runs_attempt_history leaves these completions to
-- it: sql/functions/triggers.sql). The UPDATE clears the lease, so what it cleared and the
-- history needs, the claim's time, comes in from the locking read (acquired[i] for running[i]);
-- attempts, generation and started_at are not changed and are returned.
-- Planned with nested loops off: the UPDATE must pair each run with its request (its generation
-- and output), and a nested loop over the two (the plan a generic plan's estimate of 10 rows
-- picks) compared every run with every request: 1,000,000 comparisons, 0.17 s, for 1,000 runs.
-- The rows are still found by primary key (run_id = ANY), so a hash join reads only the batch.
-- Only this statement is planned so: complete_runs frees the slots (a hash join would walk the
-- scope's slots).
-- The runs are reached by their addresses (rows[i]: the locked row of running[i]), a TID scan,
-- the one plan whatever the table's statistics: by (tenant_id, workspace_key, run_id = ANY) a
-- generic plan made before the first ANALYZE of zeroth.runs (each equality guessed to keep 0.5% of
-- the rows, so a scope looks like one row) put only the scope in the index condition and walked
-- every row version of the scope per completion on PostgreSQL 15 (issue 30). The scope is
-- re-checked by a filter no index can serve, and sequential scans are off so that a plan made on a
-- small table cannot prefer one (a row this transaction holds locked cannot move).
DROP FUNCTION IF EXISTS zeroth._complete_locked_runs(text, text, text, uuid[], bigint[], jsonb[], uuid[], timestamptz);
DROP FUNCTION IF EXISTS zeroth._complete_locked_runs(text, text, text, uuid[], bigint[], jsonb[], uuid[], timestamptz[], timestamptz);
CREATE OR REPLACE FUNCTION zeroth._complete_locked_runs(
    tenant_id text, workspace_key text, worker_id text, run_ids uuid[], generations bigint[],
    outputs jsonb[], running uuid[], rows tid[], acquired timestamptz[], at timestamptz)
    RETURNS uuid[]
    LANGUAGE plpgsql VOLATILE
    SET enable_nestloop = off
    SET enable_seqscan = off
    SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_done uuid[];
BEGIN
    -- Marks the completions of the next statement as recorded by it (the trigger's WHEN reads the
    -- mark: triggers.sql), and lowers it right after, so it never outlives this call; an error
    -- rolls it back with the statement (SET LOCAL semantics). Raised here, not in a SET clause: a
    -- SET clause of a custom setting needs SET privilege on that parameter when the function is
    -- created, which a migrating role that is only a member of zeroth_owner does not have.
    PERFORM set_config('zeroth.completion_records_attempt', 'on', true);
    WITH requested AS (
        SELECT q.run_id, q.generation, _complete_locked_runs.outputs[q.position] AS output
          FROM unnest(_complete_locked_runs.run_ids, _complete_locked_runs.generations)
               WITH ORDINALITY AS q(run_id, generation, position)
    ), completed AS (
        UPDATE zeroth.runs r
           SET status = 'completed',
               output = CASE WHEN q.output IS NULL THEN r.output
                             ELSE nullif(q.output, 'null'::jsonb) END,
               finished_at = _complete_locked_runs.at,
               updated_at = _complete_locked_runs.at,
               lease_worker_id = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
               admission_slot = NULL, recovery_checkpoint_id = NULL
          FROM requested q
         -- By address, not only by the join: a generic plan made while the table was small
         -- joined by filter and scanned the whole scope per run (the continuous-load collapse of
         -- issue 13); one made before the first ANALYZE walked the scope by runs_pkey (issue 30).
         -- IS NOT DISTINCT FROM is = on these NOT NULL columns, but never an index condition.
         WHERE r.ctid = ANY (_complete_locked_runs.rows)
           AND (r.tenant_id, r.workspace_key) IS NOT DISTINCT FROM
               (_complete_locked_runs.tenant_id, _complete_locked_runs.workspace_key)
           AND r.run_id = q.run_id
           AND r.lease_worker_id = _complete_locked_runs.worker_id
           AND r.lease_generation = q.generation
           AND r.lease_expires_at >= _complete_locked_runs.at
        RETURNING r.run_id, r.attempts, r.lease_generation, r.started_at
    ), recorded AS (
        -- The rows zeroth._record_attempt would write for these ends (outcome completed; a
        -- running attempt's number is runs.attempts; it started at the later of its start and
        -- its claim).
        INSERT INTO zeroth.run_attempts (tenant_id, workspace_key, run_id, attempt, lease_generation,
                                         worker_id, claimed_at, started_at, ended_at, outcome)
        SELECT _complete_locked_runs.tenant_id, _complete_locked_runs.workspace_key, d.run_id,
               d.attempts, d.lease_generation, _complete_locked_runs.worker_id, h.acquired_at,
               greatest(d.started_at, h.acquired_at), _complete_locked_runs.at, 'completed'
          FROM completed d
          JOIN unnest(_complete_locked_runs.running, _complete_locked_runs.acquired)
               AS h(run_id, acquired_at) ON h.run_id = d.run_id
    )
    SELECT coalesce(array_agg(d.run_id), '{}') INTO v_done FROM completed d;
    PERFORM set_config('zeroth.completion_records_attempt', 'off', true);
    RETURN v_done;
END
$$;
COMMENT ON FUNCTION zeroth._complete_locked_runs(text, text, text, uuid[], bigint[], jsonb[], uuid[], tid[], timestamptz[], timestamptz) IS 'Internal: the write of complete_runs on the runs it locked (running: the locked running ones, rows: their addresses, reached by a TID scan, acquired: their lease_acquired_at): complete those whose lease (worker, generation) is live at `at`, and insert their ended attempts (outcome completed) into run_attempts in the same statement; returns the completed runs. Planned with nested loops off (a hash join of the batch with its request).';
ALTER FUNCTION zeroth._complete_locked_runs(text, text, text, uuid[], bigint[], jsonb[], uuid[], tid[], timestamptz[], timestamptz) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._complete_locked_runs(text, text, text, uuid[], bigint[], jsonb[], uuid[], tid[], timestamptz[], timestamptz) FROM PUBLIC;

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
    v_acquired   timestamptz[];
    v_rows       tid[];
    v_done       uuid[];
    v_slot_rows  tid[];
    v_freed_deps text[] := '{}';
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
    -- Their row addresses are kept to free them below: a row this transaction holds locked
    -- cannot move, and a TID scan is the one plan that touches those rows and no others.
    SELECT coalesce(array_agg(l.ctid), '{}') INTO v_slot_rows
       FROM (SELECT q.run_id, q.generation
               FROM unnest(complete_runs.run_ids, complete_runs.generations) AS q(run_id, generation)
              ORDER BY q.run_id) q
      CROSS JOIN LATERAL (
            SELECT s.ctid
              FROM zeroth.admission_slots s
             WHERE s.run_id = q.run_id AND s.lease_generation = q.generation
               -- the scope by IS NOT DISTINCT FROM (= on NOT NULL columns, never an index
               -- condition): a plan made before the first ANALYZE walked the scope's slots by
               -- admission_slots_pkey on PostgreSQL 15 (issue 30)
               AND (s.tenant_id, s.workspace_key) IS NOT DISTINCT FROM (v_tenant, v_wskey)
               FOR UPDATE OF s) l;

    -- The run rows, in run_id order, then the clock (as zeroth._lock_leased_run: a batch that
    -- waited for a row judges every lease by the time it got them). One primary-key probe per
    -- requested run: a LATERAL sub-select with a locking clause is never flattened into a join,
    -- so no plan pairs the batch with itself by a filter (1,000 runs made 1,000,000 comparisons),
    -- and no plan reaches the rows through runs_running_idx (no predicate names the status; the
    -- running ones are read from the locked rows).
    SELECT coalesce(array_agg(l.run_id) FILTER (WHERE l.status = 'running'), '{}'),
           coalesce(array_agg(l.ctid) FILTER (WHERE l.status = 'running'), '{}'),
           coalesce(array_agg(l.lease_acquired_at) FILTER (WHERE l.status = 'running'), '{}')
      INTO v_running, v_rows, v_acquired
      FROM (SELECT q.run_id, q.generation
              FROM unnest(complete_runs.run_ids, complete_runs.generations) AS q(run_id, generation)
             ORDER BY q.run_id) q
     CROSS JOIN LATERAL (
            SELECT r.run_id, r.ctid, r.status, r.lease_acquired_at
              FROM zeroth.runs r
             WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey
               AND r.run_id = q.run_id
               AND r.lease_generation = q.generation
               AND r.lease_worker_id = complete_runs.worker_id
               FOR UPDATE OF r) l;
    v_now := zeroth._now();

    v_done := zeroth._complete_locked_runs(v_tenant, v_wskey, complete_runs.worker_id,
                                           complete_runs.run_ids, complete_runs.generations,
                                           complete_runs.outputs, v_running, v_rows, v_acquired, v_now);

    -- The slots of the completed runs, among those locked above (each locked for its run's
    -- requested lease, the lease each completion ended).
    IF cardinality(v_slot_rows) > 0 THEN
        WITH freed AS (
            UPDATE zeroth.admission_slots s
               SET run_id = NULL, lease_generation = NULL
             WHERE s.ctid = ANY (v_slot_rows)
               AND s.run_id = ANY (v_done)
            RETURNING s.deployment_ref
        )
        SELECT coalesce(array_agg(DISTINCT f.deployment_ref), '{}') INTO v_freed_deps FROM freed f;
    END IF;

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
