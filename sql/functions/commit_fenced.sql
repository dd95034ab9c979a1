-- commit_fenced: write allowlisted run columns (output, error, metadata, progress) while holding
-- (worker_id, generation) with a live lease. Lease, fence, status and identity columns are never
-- writable, however spelled (ZP004); any other name is unknown (ZP005). No dynamic SQL: each
-- allowlisted column has its own CASE. An error is stored bounded (zeroth._bounded_error).
-- Returns false when fenced out. Raises ZP004, ZP005, ZP008.
-- Locks: the run row. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.commit_fenced(
    run_id       uuid,
    worker_id    text,
    generation   bigint,
    columns      jsonb,
    tenant_id    text DEFAULT NULL,
    workspace_id text DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_status zeroth.run_status;
    v_now    timestamptz := zeroth._now();
    v_tenant text := zeroth._scope_tenant(commit_fenced.tenant_id, commit_fenced.workspace_id);
    v_wskey  text := zeroth._workspace_key(commit_fenced.workspace_id);
    v_key    text;
    v_name   text;
    v_error  jsonb;
BEGIN
    PERFORM zeroth._require(commit_fenced.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(commit_fenced.worker_id, 'worker_id');
    PERFORM zeroth._require(commit_fenced.generation IS NOT NULL, 'generation must not be NULL');
    PERFORM zeroth._require(jsonb_typeof(commit_fenced.columns) = 'object' AND commit_fenced.columns <> '{}'::jsonb,
                            'columns must be a non-empty JSON object');
    FOR v_key IN SELECT k FROM jsonb_object_keys(commit_fenced.columns) AS k ORDER BY k LOOP
        -- Normalise the way an attacker would hope SQL does: case, quotes, whitespace.
        v_name := lower(btrim(v_key, E' \t\r\n"`'''));
        IF v_name IN ('lease_worker_id', 'lease_generation', 'lease_acquired_at', 'lease_expires_at',
                      'admission_slot', 'recovery_checkpoint_id', 'status', 'run_id', 'tenant_id',
                      'workspace_id', 'workspace_key', 'deployment_ref', 'attempts', 'max_attempts',
                      'created_at', 'updated_at', 'started_at', 'finished_at', 'cancel_action',
                      'cancel_requested_at', 'dead_lettered_at', 'checkpoint_seq', 'run_after',
                      'priority', 'idempotency_key', 'thread_id', 'wait_reason', 'payload') THEN
            RAISE EXCEPTION 'commit_fenced may not write lease, fence, status or identity column %', quote_literal(v_key)
                USING ERRCODE = 'ZP004';
        ELSIF v_key NOT IN ('output', 'error', 'metadata', 'progress') THEN
            RAISE EXCEPTION 'commit_fenced: unknown run column %; writable columns are output, error, metadata, progress',
                quote_literal(v_key) USING ERRCODE = 'ZP005';
        END IF;
    END LOOP;
    PERFORM zeroth._require(NOT commit_fenced.columns ? 'metadata'
                            OR jsonb_typeof(commit_fenced.columns -> 'metadata') = 'object',
                            'metadata must be a JSON object');
    -- An error document is stored bounded, as fail_run's (zeroth._bounded_error), before any lock.
    v_error := zeroth._bounded_error(nullif(commit_fenced.columns -> 'error', 'null'::jsonb));

    -- The run row first, then the clock: see zeroth._lock_leased_run.
    v_status := zeroth._lock_leased_run(v_tenant, v_wskey, commit_fenced.run_id, commit_fenced.worker_id, commit_fenced.generation);
    v_now := zeroth._now();
    UPDATE zeroth.runs r
       SET output   = CASE WHEN commit_fenced.columns ? 'output'
                           THEN nullif(commit_fenced.columns -> 'output', 'null'::jsonb) ELSE r.output END,
           error    = CASE WHEN commit_fenced.columns ? 'error'
                           THEN v_error ELSE r.error END,
           progress = CASE WHEN commit_fenced.columns ? 'progress'
                           THEN nullif(commit_fenced.columns -> 'progress', 'null'::jsonb) ELSE r.progress END,
           metadata = CASE WHEN commit_fenced.columns ? 'metadata'
                           THEN commit_fenced.columns -> 'metadata' ELSE r.metadata END,
           updated_at = v_now
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = commit_fenced.run_id
       AND r.lease_worker_id = commit_fenced.worker_id
       AND r.lease_generation = commit_fenced.generation
       AND r.lease_expires_at >= v_now;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION zeroth.commit_fenced(uuid, text, bigint, jsonb, text, text) IS
'commit_fenced: write allowlisted run columns (output, error, metadata, progress) only while (worker_id, generation) holds a live lease; the fence is in the UPDATE predicate. Lease/fence/status/identity columns raise ZP004 however spelled; other names raise ZP005. An error document is stored bounded as fail_run''s (docs/sql-api.md, "Error documents"). Returns false when fenced out. Raises ZP008. Time: clock_timestamp().';
ALTER FUNCTION zeroth.commit_fenced(uuid, text, bigint, jsonb, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.commit_fenced(uuid, text, bigint, jsonb, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.commit_fenced(uuid, text, bigint, jsonb, text, text) TO zeroth_worker;
