-- start_run: pending → running, fenced. Counts an attempt. Idempotent for the holder of a running
-- run (a recovered run is already running), so a worker may call it on every drive.
-- code_version (issue 34): the starter's code version; the first start of a run (started_at NULL)
-- records it (runs.code_version_id, its text in zeroth.code_versions), as a claim_and_start
-- does; a run started before keeps the version it recorded (only a claim its version policy let
-- through leased it). NULL: records nothing new (an owned admission's version stays).
-- Locks: the run row. Returns false when fenced out. Raises ZP008. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.start_run(
    run_id       uuid,
    worker_id    text,
    generation   bigint,
    tenant_id    text DEFAULT NULL,
    workspace_id text DEFAULT NULL,
    code_version text DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_status zeroth.run_status;
    v_now    timestamptz := zeroth._now();
    v_tenant text := zeroth._scope_tenant(start_run.tenant_id, start_run.workspace_id);
    v_wskey  text := zeroth._workspace_key(start_run.workspace_id);
    v_version bigint;
    v_recorded bigint;
BEGIN
    PERFORM zeroth._require(start_run.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(start_run.worker_id, 'worker_id');
    PERFORM zeroth._require(start_run.generation IS NOT NULL, 'generation must not be NULL');
    v_version := zeroth._declared_code_version(start_run.code_version);  -- ZP008 if malformed

    -- The run row first, then the clock: see zeroth._lock_leased_run.
    v_status := zeroth._lock_leased_run(v_tenant, v_wskey, start_run.run_id, start_run.worker_id, start_run.generation);
    v_now := zeroth._now();
    UPDATE zeroth.runs r
       SET status = 'running',
           attempts = CASE WHEN r.status = 'pending' THEN r.attempts + 1 ELSE r.attempts END,
           started_at = CASE WHEN r.status = 'pending' THEN v_now ELSE r.started_at END,
           code_version_id = CASE WHEN r.status = 'pending' AND r.started_at IS NULL
                                       AND v_version IS NOT NULL
                                  THEN v_version ELSE r.code_version_id END,
           updated_at = v_now
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = start_run.run_id
       AND r.lease_worker_id = start_run.worker_id
       AND r.lease_generation = start_run.generation
       AND r.lease_expires_at >= v_now
       AND v_status IN ('pending', 'running')
    RETURNING r.code_version_id INTO v_recorded;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- The version's text, as a claim, only when the run records this version (a run started
    -- before keeps its own: the starter's text would be a row no run references).
    IF v_version IS NOT NULL AND v_status = 'pending' AND v_recorded = v_version THEN
        PERFORM zeroth._code_version_id(start_run.code_version);
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION zeroth.start_run(uuid, text, bigint, text, text, text) IS
'start_run: pending → running for the live lease (worker_id, generation); counts an attempt and sets started_at. Idempotent for the holder of a running run. code_version: the starter''s code version, recorded by a run''s first start (runs.code_version_id, as claim_and_start records it); a run started before keeps its version; NULL records nothing new. Returns false when fenced out. Raises ZP008. Time: clock_timestamp().';
ALTER FUNCTION zeroth.start_run(uuid, text, bigint, text, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.start_run(uuid, text, bigint, text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.start_run(uuid, text, bigint, text, text, text) TO zeroth_worker;
