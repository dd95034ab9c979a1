-- wait_for_children: the live holder of a running parent waits for some of its children, as step
-- `step_key`: all of them (mode 'all') or the first to end ('any'). Locks the parent's slot and row
-- (zeroth._lock_settle), then the children's child_runs rows FOR SHARE, so a child that ends
-- right now is either seen here or sees this wait (no lost wake-up). Recorded step → its outcomes;
-- wait met → outcomes recorded as the step result (outcome ready); else running → waiting
-- (wait_reason 'children:' || step_key; lease, slot and attempt given back as wait_for_event; a
-- pending cancel request → cancelled) until the children's ends make it pending. Returns one row
-- (outcome ready | waiting | cancelled, children); outcome NULL when fenced out. Raises ZP003, ZP006,
-- ZP008 (also: a run that is not a child of this run), ZP010. Notifies zeroth_wakeup when a slot
-- was freed. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.wait_for_children(
    run_id        uuid,
    worker_id     text,
    generation    bigint,
    step_key      text,
    child_run_ids uuid[],
    mode          text DEFAULT 'all',
    tenant_id     text DEFAULT NULL,
    workspace_id  text DEFAULT NULL)
    RETURNS TABLE (outcome text, children jsonb)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_lock    record;
    v_now     timestamptz := zeroth._now();
    v_tenant  text := zeroth._scope_tenant(wait_for_children.tenant_id, wait_for_children.workspace_id);
    v_wskey   text := zeroth._workspace_key(wait_for_children.workspace_id);
    v_attempt integer;
    v_step    jsonb;
    v_found   integer;
    v_ended   integer;
    v_left    zeroth.run_status;
BEGIN
    IF v_tenant IS NULL THEN
        RAISE EXCEPTION 'a workspace_id needs a tenant_id' USING ERRCODE = 'ZP006';
    END IF;
    PERFORM zeroth._require_step_key(wait_for_children.step_key);
    PERFORM zeroth._require(wait_for_children.child_run_ids IS NOT NULL
                            AND cardinality(wait_for_children.child_run_ids) BETWEEN 1 AND 10000
                            AND array_position(wait_for_children.child_run_ids, NULL) IS NULL,
                            'child_run_ids must be 1-10000 run ids without NULL');
    PERFORM zeroth._require(cardinality(wait_for_children.child_run_ids)
                            = (SELECT count(DISTINCT u.id) FROM unnest(wait_for_children.child_run_ids) AS u(id)),
                            'child_run_ids must not repeat a run id');
    PERFORM zeroth._require(wait_for_children.mode IN ('all', 'any'),
                            format('mode must be all or any, got %s', coalesce(wait_for_children.mode, 'NULL')));

    -- The settle path's checks and lock (sql/functions/internal/settle.sql): the slot, then the
    -- run row, then the clock.
    PERFORM zeroth._require_fence(wait_for_children.run_id, wait_for_children.worker_id, wait_for_children.generation);
    v_lock := zeroth._lock_settle(v_tenant, v_wskey, wait_for_children.worker_id, ARRAY[wait_for_children.run_id],
                                  ARRAY[wait_for_children.generation]);
    v_now := zeroth._now();
    v_attempt := zeroth._step_holder_attempt(v_tenant, v_wskey, wait_for_children.run_id,
                                             wait_for_children.worker_id, wait_for_children.generation, v_now);
    IF cardinality(v_lock.run_rows) = 0 OR v_attempt IS NULL THEN
        PERFORM zeroth._explain_fenced_miss(v_tenant, v_wskey, wait_for_children.run_id,
                                            wait_for_children.worker_id, wait_for_children.generation, v_now,
                                            'wait_for_children', '{running}');
        RETURN NEXT;  -- one row, outcome NULL: fenced out
        RETURN;
    END IF;

    -- Replayed: the wait's outcomes were recorded by an earlier attempt.
    SELECT s.result INTO v_step FROM zeroth.run_steps s
     WHERE s.tenant_id = v_tenant AND s.workspace_key = v_wskey AND s.run_id = wait_for_children.run_id
       AND s.step_key = wait_for_children.step_key;
    IF FOUND THEN
        IF v_step->>'outcome' IS DISTINCT FROM 'ready' OR jsonb_typeof(v_step->'children') IS DISTINCT FROM 'array' THEN
            RAISE EXCEPTION 'step % of run % is recorded as another kind of step', wait_for_children.step_key,
                wait_for_children.run_id USING ERRCODE = 'ZP010';
        END IF;
        outcome := 'ready';
        children := v_step->'children';
        RETURN NEXT;
        RETURN;
    END IF;

    -- The children's rows, shared-locked in one order: a child ending now (its trigger updates its
    -- row) commits first and is seen here, or waits for this call and then sees the wait.
    SELECT count(*) INTO v_found FROM (
        SELECT c.child_run_id FROM zeroth.child_runs c
         WHERE c.tenant_id = v_tenant AND c.workspace_key = v_wskey
           AND c.parent_run_id = wait_for_children.run_id
           AND c.child_run_id = ANY (wait_for_children.child_run_ids)
         ORDER BY c.child_run_id
           FOR SHARE) x;
    IF v_found <> cardinality(wait_for_children.child_run_ids) THEN
        RAISE EXCEPTION 'child_run_ids name % run(s) that are not child runs of run % in this scope',
            cardinality(wait_for_children.child_run_ids) - v_found, wait_for_children.run_id
            USING ERRCODE = 'ZP008';
    END IF;

    -- A statement of its own (a fresh snapshot): sees every end that committed before the locks.
    v_ended := zeroth._children_ended(v_tenant, v_wskey, wait_for_children.run_id,
                                      wait_for_children.child_run_ids);
    IF v_ended = cardinality(wait_for_children.child_run_ids)
       OR (wait_for_children.mode = 'any' AND v_ended >= 1) THEN
        outcome := 'ready';
        children := zeroth._child_outcomes(v_tenant, v_wskey, wait_for_children.run_id,
                                           wait_for_children.child_run_ids);
        INSERT INTO zeroth.run_steps (tenant_id, workspace_key, run_id, step_key, result,
                                      lease_generation, attempt, recorded_at)
        VALUES (v_tenant, v_wskey, wait_for_children.run_id, wait_for_children.step_key,
                jsonb_build_object('outcome', outcome, 'mode', wait_for_children.mode, 'children', children),
                wait_for_children.generation, v_attempt, v_now);
        DELETE FROM zeroth.child_waits w
         WHERE w.tenant_id = v_tenant AND w.workspace_key = v_wskey AND w.parent_run_id = wait_for_children.run_id
           AND w.step_key = wait_for_children.step_key;
        RETURN NEXT;
        RETURN;
    END IF;

    -- Not there yet: the parent leaves its worker. A pending cancel request wins (as in sleep_run).
    v_left := zeroth._leave_for_wait(v_tenant, v_wskey, wait_for_children.run_id, wait_for_children.worker_id,
                                     wait_for_children.generation, 'children:' || wait_for_children.step_key, v_now);
    IF v_left = 'waiting' THEN
        -- remaining: the children still to end; each child's first end counts it down (trigger).
        INSERT INTO zeroth.child_waits AS w (tenant_id, workspace_key, parent_run_id, step_key, mode,
                                             child_run_ids, remaining, created_at)
        VALUES (v_tenant, v_wskey, wait_for_children.run_id, wait_for_children.step_key, wait_for_children.mode,
                wait_for_children.child_run_ids, cardinality(wait_for_children.child_run_ids) - v_ended, v_now)
        ON CONFLICT ON CONSTRAINT child_waits_pkey DO UPDATE
           SET mode = excluded.mode, child_run_ids = excluded.child_run_ids, remaining = excluded.remaining,
               created_at = excluded.created_at, met_at = NULL;
        outcome := 'waiting';
    ELSIF v_left = 'cancelled' THEN  -- NULL: fenced out (outcome NULL), never 'cancelled'
        outcome := 'cancelled';
    END IF;
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION zeroth.wait_for_children(uuid, text, bigint, text, uuid[], text, text, text) IS
'wait_for_children: for the live lease (worker_id, generation) of a running parent, wait for its children child_run_ids (started by start_child_run) as step step_key: all of them (mode all) or any one (mode any). Recorded step → its outcomes; wait met → the outcomes (run_id, status, output, error, dead_lettered, finished_at per child, in the order given; status NULL for a child not ended under mode any) recorded as the step result, outcome ready; else running → waiting (wait_reason children:step_key; lease, slot and attempt given back; a pending cancel request → cancelled) until the children''s ends make it pending. The children''s rows are locked FOR SHARE, so a child ending meanwhile is never missed. Returns one row (outcome ready | waiting | cancelled, children); outcome NULL when fenced out. Raises ZP003 (holder but not running), ZP006, ZP008 (also: a run that is not a child of this run in this scope), ZP010 (the step key holds another kind of step). Notifies zeroth_wakeup when a slot was freed. Time: clock_timestamp().';
ALTER FUNCTION zeroth.wait_for_children(uuid, text, bigint, text, uuid[], text, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.wait_for_children(uuid, text, bigint, text, uuid[], text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.wait_for_children(uuid, text, bigint, text, uuid[], text, text, text) TO zeroth_worker;
