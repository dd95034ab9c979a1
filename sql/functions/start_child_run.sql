-- start_child_run: the live holder of a running parent starts a child run, as step `step_key`:
-- new → pending in the parent's scope, parent_run_id set, due now. Locks the parent's row
-- (zeroth._lock_leased_run), then reads the clock; the fence, a stale holder starts nothing. Once
-- per (parent, step_key): a replay returns the same child (created false); the same key with
-- another deployment_ref, payload or detached raises ZP010. detached: the child is not cancelled
-- with its parent. priority / max_attempts NULL (the defaults): the child deployment's registered
-- defaults (zeroth.deployments, one primary-key lookup), else 0 / 3; an explicit value wins.
-- Returns one row (child_run_id, created); child_run_id NULL when fenced out.
-- Raises ZP003 (holder but not running), ZP006, ZP008, ZP010. Notifies zeroth_wakeup for the
-- child. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.start_child_run(
    run_id         uuid,
    worker_id      text,
    generation     bigint,
    step_key       text,
    deployment_ref text,
    payload        jsonb   DEFAULT '{}'::jsonb,
    priority       integer DEFAULT NULL,
    max_attempts   integer DEFAULT NULL,
    metadata       jsonb   DEFAULT '{}'::jsonb,
    detached       boolean DEFAULT false,
    tenant_id      text    DEFAULT NULL,
    workspace_id   text    DEFAULT NULL)
    RETURNS TABLE (child_run_id uuid, created boolean)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now     timestamptz := zeroth._now();
    v_tenant  text := zeroth._scope_tenant(start_child_run.tenant_id, start_child_run.workspace_id);
    v_wskey   text := zeroth._workspace_key(start_child_run.workspace_id);
    v_attempt integer;
    v_link    record;
    v_child   uuid;
    v_priority integer := start_child_run.priority;
    v_attempts integer := start_child_run.max_attempts;
    v_def_priority integer;
    v_def_attempts integer;
BEGIN
    IF v_tenant IS NULL THEN
        RAISE EXCEPTION 'a workspace_id needs a tenant_id' USING ERRCODE = 'ZP006';
    END IF;
    PERFORM zeroth._require(start_child_run.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(start_child_run.worker_id, 'worker_id');
    PERFORM zeroth._require(start_child_run.generation IS NOT NULL, 'generation must not be NULL');
    PERFORM zeroth._require_step_key(start_child_run.step_key);
    PERFORM zeroth._require_identifier(start_child_run.deployment_ref, 'deployment_ref');
    PERFORM zeroth._require(jsonb_typeof(start_child_run.payload) = 'object', 'payload must be a JSON object');
    PERFORM zeroth._require(jsonb_typeof(start_child_run.metadata) = 'object', 'metadata must be a JSON object');
    PERFORM zeroth._require(start_child_run.max_attempts IS NULL OR start_child_run.max_attempts BETWEEN 1 AND 1000,
                            'max_attempts must be NULL or between 1 and 1000');
    PERFORM zeroth._require(start_child_run.detached IS NOT NULL, 'detached must not be NULL');

    -- The parent's row first, then the clock: see zeroth._lock_leased_run.
    PERFORM zeroth._lock_leased_run(v_tenant, v_wskey, start_child_run.run_id, start_child_run.worker_id,
                                    start_child_run.generation);
    v_now := zeroth._now();
    v_attempt := zeroth._step_holder_attempt(v_tenant, v_wskey, start_child_run.run_id,
                                             start_child_run.worker_id, start_child_run.generation, v_now);
    IF v_attempt IS NULL THEN
        PERFORM zeroth._explain_fenced_miss(v_tenant, v_wskey, start_child_run.run_id, start_child_run.worker_id,
                                            start_child_run.generation, v_now, 'start_child_run', '{running}');
        RETURN NEXT;  -- one row, child_run_id NULL: fenced out
        RETURN;
    END IF;

    -- Replayed: this step started its child in an earlier attempt (or earlier in this one).
    SELECT c.child_run_id, c.deployment_ref, c.payload, c.detached INTO v_link FROM zeroth.child_runs c
     WHERE c.tenant_id = v_tenant AND c.workspace_key = v_wskey AND c.parent_run_id = start_child_run.run_id
       AND c.step_key = start_child_run.step_key;
    IF FOUND THEN
        IF v_link.deployment_ref <> start_child_run.deployment_ref OR v_link.payload <> start_child_run.payload
           OR v_link.detached <> start_child_run.detached THEN
            RAISE EXCEPTION 'step % of run % started child % of deployment % with another payload or detached flag; a replay must start the same child',
                start_child_run.step_key, start_child_run.run_id, v_link.child_run_id, v_link.deployment_ref
                USING ERRCODE = 'ZP010';
        END IF;
        child_run_id := v_link.child_run_id;
        created := false;
        RETURN NEXT;
        RETURN;
    END IF;
    PERFORM 1 FROM zeroth.run_steps s
     WHERE s.tenant_id = v_tenant AND s.workspace_key = v_wskey AND s.run_id = start_child_run.run_id
       AND s.step_key = start_child_run.step_key;
    IF FOUND THEN
        RAISE EXCEPTION 'step % of run % is recorded as another kind of step', start_child_run.step_key,
            start_child_run.run_id USING ERRCODE = 'ZP010';
    END IF;

    IF v_priority IS NULL OR v_attempts IS NULL THEN
        SELECT d.priority, d.max_attempts INTO v_def_priority, v_def_attempts
          FROM zeroth.deployments d
         WHERE d.deployment_ref = start_child_run.deployment_ref;
        v_priority := coalesce(v_priority, v_def_priority, 0);
        v_attempts := coalesce(v_attempts, v_def_attempts, 3);
    END IF;
    v_child := gen_random_uuid();
    INSERT INTO zeroth.runs (run_id, tenant_id, workspace_id, deployment_ref, status, priority, run_after,
                             max_attempts, created_at, updated_at, payload, metadata, parent_run_id)
    VALUES (v_child, v_tenant, start_child_run.workspace_id, start_child_run.deployment_ref, 'pending',
            v_priority, v_now, v_attempts, v_now, v_now,
            start_child_run.payload, start_child_run.metadata, start_child_run.run_id);
    INSERT INTO zeroth.child_runs (tenant_id, workspace_key, parent_run_id, step_key, child_run_id,
                                   deployment_ref, payload, detached, created_at)
    VALUES (v_tenant, v_wskey, start_child_run.run_id, start_child_run.step_key, v_child,
            start_child_run.deployment_ref, start_child_run.payload, start_child_run.detached, v_now);
    -- Also a step: one namespace of step keys per run, and get_step shows which child it started.
    INSERT INTO zeroth.run_steps (tenant_id, workspace_key, run_id, step_key, result, lease_generation,
                                  attempt, recorded_at)
    VALUES (v_tenant, v_wskey, start_child_run.run_id, start_child_run.step_key,
            jsonb_build_object('child_run_id', v_child, 'deployment_ref', start_child_run.deployment_ref),
            start_child_run.generation, v_attempt, v_now);
    PERFORM zeroth._notify_wakeup(start_child_run.deployment_ref, v_tenant, start_child_run.workspace_id);
    child_run_id := v_child;
    created := true;
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION zeroth.start_child_run(uuid, text, bigint, text, text, jsonb, integer, integer, jsonb, boolean, text, text) IS
'start_child_run: for the live lease (worker_id, generation) of a running parent, start a child run of deployment_ref as step step_key: new → pending in the parent''s scope (parent_run_id set), due now, also recorded as the step. priority / max_attempts NULL (default): the child deployment''s registered defaults (zeroth.deployments), else 0 / 3. Once per (parent, step_key): a replay returns the same child with created = false; another deployment_ref, payload or detached under the key raises ZP010. A child is cancelled with its parent unless detached. Returns one row (child_run_id, created); child_run_id NULL when fenced out. Raises ZP003 (holder but not running), ZP006, ZP008, ZP010. Notifies zeroth_wakeup for the child. Time: clock_timestamp().';
ALTER FUNCTION zeroth.start_child_run(uuid, text, bigint, text, text, jsonb, integer, integer, jsonb, boolean, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.start_child_run(uuid, text, bigint, text, text, jsonb, integer, integer, jsonb, boolean, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.start_child_run(uuid, text, bigint, text, text, jsonb, integer, integer, jsonb, boolean, text, text) TO zeroth_worker;
