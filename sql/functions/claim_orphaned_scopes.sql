-- claim_orphaned_scopes: claim_orphaned over many deployments and scopes in one call — the
-- recovery half of a fleet worker that claims with claim_and_start_scopes. Scopes: the listed
-- (tenant_ids[i], workspace_ids[i]) × deployment_refs, or with tenant_ids NULL every scope of
-- those deployments that holds a running run (a skip scan of runs_running_idx), visited in a
-- random order, only those with an expired lease. Each scope is claim_orphaned exactly (it ends
-- the orphans nobody may resume, re-leases resumable ones under the scope's limits, paused
-- scopes re-lease nothing); claim_limit is shared: NULL all, 0 end only, else at most that many
-- re-leased in all. Rows: one per re-leased run with its scope, plus one run_id-NULL row per
-- scope where a resumable orphan waits for a free slot or is held back by the scope's rate limit
-- (retry_at). Locks: as claim_orphaned, per scope.
-- Raises ZP006, ZP008. Notifies zeroth_wakeup for runs it ended. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.claim_orphaned_scopes(
    deployment_refs text[],
    worker_id       text,
    tenant_ids      text[]           DEFAULT NULL,
    workspace_ids   text[]           DEFAULT NULL,
    max_concurrency integer          DEFAULT NULL,
    claim_limit     integer          DEFAULT NULL,
    lease_seconds   double precision DEFAULT 60,
    grace_seconds   double precision DEFAULT 10)
    RETURNS SETOF zeroth.scope_claimed_run
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_now   timestamptz := zeroth._now();
    v_left  integer := claim_orphaned_scopes.claim_limit;
    v_scope record;
    v_out   zeroth.scope_claimed_run;
    v_got   integer;
BEGIN
    -- claim_orphaned checks the rest (worker_id, max_concurrency, lease and grace) per scope;
    -- checked here too, so a bad argument fails before any scope is touched.
    PERFORM zeroth._require_identifier(claim_orphaned_scopes.worker_id, 'worker_id');
    PERFORM zeroth._require(claim_orphaned_scopes.claim_limit IS NULL
                            OR claim_orphaned_scopes.claim_limit BETWEEN 0 AND 1000,
                            'claim_limit must be NULL or between 0 and 1000');
    PERFORM zeroth._require(claim_orphaned_scopes.max_concurrency IS NULL
                            OR claim_orphaned_scopes.max_concurrency >= 1,
                            'max_concurrency must be NULL or at least 1');
    PERFORM zeroth._lease_interval(claim_orphaned_scopes.lease_seconds);
    PERFORM zeroth._grace_interval(claim_orphaned_scopes.grace_seconds);

    FOR v_scope IN
        SELECT c.tenant_id, c.workspace_key, c.deployment_ref
          FROM zeroth._listed_scopes(claim_orphaned_scopes.deployment_refs,
                                     claim_orphaned_scopes.tenant_ids,
                                     claim_orphaned_scopes.workspace_ids, false) AS c
         WHERE EXISTS (SELECT 1 FROM zeroth.runs r
                        WHERE r.tenant_id = c.tenant_id AND r.workspace_key = c.workspace_key
                          AND r.deployment_ref = c.deployment_ref
                          AND r.status = 'running' AND r.lease_expires_at < v_now)
         ORDER BY random()
    LOOP
        EXIT WHEN v_left IS NOT NULL AND v_left = 0 AND claim_orphaned_scopes.claim_limit <> 0;
        v_got := 0;
        FOR v_out IN
            SELECT v_scope.tenant_id, zeroth._workspace_id(v_scope.workspace_key),
                   v_scope.deployment_ref, o.*
              FROM zeroth.claim_orphaned(
                       deployment_ref => v_scope.deployment_ref,
                       worker_id => claim_orphaned_scopes.worker_id,
                       tenant_id => v_scope.tenant_id,
                       workspace_id => zeroth._workspace_id(v_scope.workspace_key),
                       max_concurrency => claim_orphaned_scopes.max_concurrency,
                       claim_limit => v_left,
                       lease_seconds => claim_orphaned_scopes.lease_seconds,
                       grace_seconds => claim_orphaned_scopes.grace_seconds) AS o
        LOOP
            IF v_out.run_id IS NOT NULL THEN
                v_got := v_got + 1;
                RETURN NEXT v_out;
            ELSIF v_out.concurrency_saturated OR v_out.retry_at IS NOT NULL THEN
                RETURN NEXT v_out;
            END IF;
        END LOOP;
        IF v_left IS NOT NULL AND claim_orphaned_scopes.claim_limit <> 0 THEN
            v_left := v_left - v_got;
        END IF;
    END LOOP;
END
$$;
COMMENT ON FUNCTION zeroth.claim_orphaned_scopes(text[], text, text[], text[], integer, integer, double precision, double precision) IS
'claim_orphaned_scopes: claim_orphaned over many deployments and scopes in one call. Scopes: (tenant_ids[i], workspace_ids[i]) × deployment_refs, or with tenant_ids NULL every scope of those deployments holding a running run (skip scan of runs_running_idx), in random order, those with an expired lease. Each scope is claim_orphaned exactly (ends the orphans nobody may resume, re-leases resumable ones under the scope''s limits; paused scopes re-lease nothing); claim_limit is shared across scopes (NULL all, 0 end only). Rows: one per re-leased run with its scope, plus one run_id-NULL row per scope where a resumable orphan waits for a slot or its rate limit (retry_at). Raises ZP006, ZP008. Notifies zeroth_wakeup for the runs it ended. Time: clock_timestamp().';
ALTER FUNCTION zeroth.claim_orphaned_scopes(text[], text, text[], text[], integer, integer, double precision, double precision) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.claim_orphaned_scopes(text[], text, text[], text[], integer, integer, double precision, double precision) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.claim_orphaned_scopes(text[], text, text[], text[], integer, integer, double precision, double precision) TO zeroth_worker;
