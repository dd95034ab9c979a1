-- record_step: record a step's result once, fenced. Locks the run row (zeroth._lock_leased_run),
-- reads the clock, then INSERT … ON CONFLICT DO NOTHING guarded by the live lease: the first
-- recorded result wins, a stale holder records nothing. Returns one row: recorded (true: this call
-- wrote it; false: a result was recorded before, which is returned) and recorded_result; recorded NULL when
-- fenced out. Raises ZP003 (holder but not running), ZP008. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.record_step(
    run_id       uuid,
    worker_id    text,
    generation   bigint,
    step_key     text,
    result       jsonb,
    tenant_id    text DEFAULT NULL,
    workspace_id text DEFAULT NULL)
    RETURNS TABLE (recorded boolean, recorded_result jsonb)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now     timestamptz := zeroth._now();
    v_tenant  text := zeroth._scope_tenant(record_step.tenant_id, record_step.workspace_id);
    v_wskey   text := zeroth._workspace_key(record_step.workspace_id);
    v_attempt integer;
BEGIN
    PERFORM zeroth._require(record_step.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(record_step.worker_id, 'worker_id');
    PERFORM zeroth._require(record_step.generation IS NOT NULL, 'generation must not be NULL');
    PERFORM zeroth._require_step_key(record_step.step_key);
    PERFORM zeroth._require_step_key_fits(v_tenant, v_wskey, record_step.step_key);
    PERFORM zeroth._require(record_step.result IS NOT NULL, 'result must not be NULL (JSON null is ''null''::jsonb)');

    -- The run row first, then the clock: see zeroth._lock_leased_run.
    PERFORM zeroth._lock_leased_run(v_tenant, v_wskey, record_step.run_id, record_step.worker_id,
                                    record_step.generation);
    v_now := zeroth._now();
    v_attempt := zeroth._step_holder_attempt(v_tenant, v_wskey, record_step.run_id, record_step.worker_id,
                                             record_step.generation, v_now);
    IF v_attempt IS NULL THEN
        PERFORM zeroth._explain_fenced_miss(v_tenant, v_wskey, record_step.run_id, record_step.worker_id,
                                            record_step.generation, v_now, 'record_step', '{running}');
        RETURN NEXT;  -- one row, recorded NULL: fenced out
        RETURN;
    END IF;

    INSERT INTO zeroth.run_steps AS s (tenant_id, workspace_key, run_id, step_key, result,
                                       lease_generation, attempt, recorded_at)
    VALUES (v_tenant, v_wskey, record_step.run_id, record_step.step_key, record_step.result,
            record_step.generation, v_attempt, v_now)
    ON CONFLICT ON CONSTRAINT run_steps_pkey DO NOTHING;
    IF FOUND THEN
        recorded := true;
        recorded_result := record_step.result;
    ELSE
        recorded := false;
        SELECT s.result INTO recorded_result FROM zeroth.run_steps s
         WHERE s.tenant_id = v_tenant AND s.workspace_key = v_wskey AND s.run_id = record_step.run_id
           AND s.step_key = record_step.step_key;
    END IF;
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION zeroth.record_step(uuid, text, bigint, text, jsonb, text, text) IS
'record_step: record the result of a step of a running run once, for the live lease (worker_id, generation): run row locked, then INSERT … ON CONFLICT DO NOTHING; the first recorded result wins, a stale holder records nothing. Returns one row (recorded, recorded_result): recorded false returns the result recorded before; recorded NULL when fenced out. Raises ZP003 (holder but not running), ZP008. Time: clock_timestamp().';
ALTER FUNCTION zeroth.record_step(uuid, text, bigint, text, jsonb, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.record_step(uuid, text, bigint, text, jsonb, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.record_step(uuid, text, bigint, text, jsonb, text, text) TO zeroth_worker;
