-- update_run_progress: the owner merges JSON objects into progress and/or accounting (top-level
-- keys replace, omitted keys are kept) while the run is running. Fenced by (worker_id,
-- generation, live lease). Returns false when fenced out (a terminal run has no lease). Raises
-- ZP003 (holder but not running), ZP008 (not objects, both NULL, over 64 kB). Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.update_run_progress(
    run_id       uuid,
    worker_id    text,
    generation   bigint,
    progress     jsonb DEFAULT NULL,
    accounting   jsonb DEFAULT NULL,
    tenant_id    text  DEFAULT NULL,
    workspace_id text  DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_status zeroth.run_status;
    v_now    timestamptz := zeroth._now();
    v_tenant text := zeroth._scope_tenant(update_run_progress.tenant_id, update_run_progress.workspace_id);
    v_wskey  text := zeroth._workspace_key(update_run_progress.workspace_id);
BEGIN
    PERFORM zeroth._require(update_run_progress.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(update_run_progress.worker_id, 'worker_id');
    PERFORM zeroth._require(update_run_progress.generation IS NOT NULL, 'generation must not be NULL');
    PERFORM zeroth._require(update_run_progress.progress IS NOT NULL OR update_run_progress.accounting IS NOT NULL,
                            'give progress, accounting or both');
    PERFORM zeroth._require(update_run_progress.progress IS NULL OR jsonb_typeof(update_run_progress.progress) = 'object',
                            'progress must be a JSON object');
    PERFORM zeroth._require(update_run_progress.accounting IS NULL
                            OR jsonb_typeof(update_run_progress.accounting) = 'object',
                            'accounting must be a JSON object');
    PERFORM zeroth._require(coalesce(octet_length(update_run_progress.progress::text), 0)
                            + coalesce(octet_length(update_run_progress.accounting::text), 0) <= 65536,
                            'progress and accounting may hold at most 64 kB');

    -- The run row first, then the clock: see zeroth._lock_leased_run.
    v_status := zeroth._lock_leased_run(v_tenant, v_wskey, update_run_progress.run_id, update_run_progress.worker_id, update_run_progress.generation);
    v_now := zeroth._now();
    UPDATE zeroth.runs r
       SET progress = CASE WHEN update_run_progress.progress IS NULL THEN r.progress
                           WHEN jsonb_typeof(r.progress) = 'object' THEN r.progress || update_run_progress.progress
                           ELSE update_run_progress.progress END,
           accounting = CASE WHEN update_run_progress.accounting IS NULL THEN r.accounting
                             ELSE coalesce(r.accounting, '{}'::jsonb) || update_run_progress.accounting END,
           updated_at = v_now
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = update_run_progress.run_id
       AND v_status = 'running'
       AND r.lease_worker_id = update_run_progress.worker_id
       AND r.lease_generation = update_run_progress.generation
       AND r.lease_expires_at >= v_now;
    IF NOT FOUND THEN
        PERFORM zeroth._explain_fenced_miss(v_tenant, v_wskey, update_run_progress.run_id, update_run_progress.worker_id,
                                            update_run_progress.generation, v_now, 'update_run_progress', '{running}');
        RETURN false;
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION zeroth.update_run_progress(uuid, text, bigint, jsonb, jsonb, text, text) IS
'update_run_progress: the lease holder merges JSON objects into progress and/or accounting (top-level keys replace, omitted keys kept) while the run is running; fenced by (worker_id, generation, live lease). Returns false when fenced out. Raises ZP003 (holder but not running), ZP008. Time: clock_timestamp().';
ALTER FUNCTION zeroth.update_run_progress(uuid, text, bigint, jsonb, jsonb, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.update_run_progress(uuid, text, bigint, jsonb, jsonb, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.update_run_progress(uuid, text, bigint, jsonb, jsonb, text, text) TO zeroth_worker;
