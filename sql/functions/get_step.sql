-- get_step: read a step's recorded result, by the live lease holder only. One statement: the fence
-- (worker_id, generation, live lease, running) and the step row are read in one snapshot, so an
-- earlier attempt never sees a step a later attempt recorded. No lock. Returns one row: step_found
-- (false: not recorded yet) and result; step_found NULL when fenced out. Raises ZP003 (holder but not
-- running), ZP008. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.get_step(
    run_id       uuid,
    worker_id    text,
    generation   bigint,
    step_key     text,
    tenant_id    text DEFAULT NULL,
    workspace_id text DEFAULT NULL)
    RETURNS TABLE (step_found boolean, result jsonb)
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now    timestamptz := zeroth._now();
    v_tenant text := zeroth._scope_tenant(get_step.tenant_id, get_step.workspace_id);
    v_wskey  text := zeroth._workspace_key(get_step.workspace_id);
BEGIN
    PERFORM zeroth._require(get_step.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(get_step.worker_id, 'worker_id');
    PERFORM zeroth._require(get_step.generation IS NOT NULL, 'generation must not be NULL');
    PERFORM zeroth._require_step_key(get_step.step_key);
    PERFORM zeroth._require_step_key_fits(v_tenant, v_wskey, get_step.step_key);

    SELECT s.step_key IS NOT NULL, s.result INTO step_found, result
      FROM zeroth.runs r
      LEFT JOIN zeroth.run_steps s
        ON s.tenant_id = r.tenant_id AND s.workspace_key = r.workspace_key AND s.run_id = r.run_id
       AND s.step_key = get_step.step_key
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = get_step.run_id
       AND r.status = 'running'
       AND r.lease_worker_id = get_step.worker_id
       AND r.lease_generation = get_step.generation
       AND r.lease_expires_at >= v_now;
    IF NOT FOUND THEN
        PERFORM zeroth._explain_fenced_miss(v_tenant, v_wskey, get_step.run_id, get_step.worker_id,
                                            get_step.generation, v_now, 'get_step', '{running}');
        step_found := NULL;
        result := NULL;
    END IF;
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION zeroth.get_step(uuid, text, bigint, text, text, text) IS
'get_step: the recorded result of a step of a running run, for the live lease (worker_id, generation) only: fence and step read in one snapshot, so an earlier attempt never sees a later attempt''s steps. Returns one row (step_found, result); step_found NULL when fenced out. Raises ZP003 (holder but not running), ZP008. Time: clock_timestamp().';
ALTER FUNCTION zeroth.get_step(uuid, text, bigint, text, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.get_step(uuid, text, bigint, text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.get_step(uuid, text, bigint, text, text, text) TO zeroth_worker;
