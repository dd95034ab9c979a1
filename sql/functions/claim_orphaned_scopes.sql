-- One scope's claim_orphaned (zeroth._claim_orphaned, isolated or not) as the rows
-- claim_orphaned_scopes returns: the re-leased runs with their scope, and the run_id-NULL row only
-- when it reports saturation or a rate limit.
CREATE OR REPLACE FUNCTION zeroth._claim_orphaned_rows(
    tenant_id text, workspace_key text, deployment_ref text, worker_id text, max_concurrency integer,
    claim_limit integer, lease_seconds double precision, grace_seconds double precision,
    isolated boolean, code_version text DEFAULT NULL)
    RETURNS zeroth.scope_claimed_run[]
    LANGUAGE sql VOLATILE
    BEGIN ATOMIC
        SELECT coalesce(array_agg(ROW(_claim_orphaned_rows.tenant_id,
                                      zeroth._workspace_id(_claim_orphaned_rows.workspace_key),
                                      _claim_orphaned_rows.deployment_ref, o.*)::zeroth.scope_claimed_run),
                        '{}')
          FROM zeroth._claim_orphaned(
                   _claim_orphaned_rows.deployment_ref, _claim_orphaned_rows.worker_id,
                   _claim_orphaned_rows.tenant_id,
                   zeroth._workspace_id(_claim_orphaned_rows.workspace_key),
                   _claim_orphaned_rows.max_concurrency, _claim_orphaned_rows.claim_limit,
                   _claim_orphaned_rows.lease_seconds, _claim_orphaned_rows.grace_seconds,
                   _claim_orphaned_rows.isolated, _claim_orphaned_rows.code_version) AS o
         WHERE o.run_id IS NOT NULL OR o.concurrency_saturated OR o.retry_at IS NOT NULL;
    END;
COMMENT ON FUNCTION zeroth._claim_orphaned_rows(text, text, text, text, integer, integer, double precision, double precision, boolean, text) IS 'Internal: one scope''s claim_orphaned as claim_orphaned_scopes rows (re-leased runs with their scope; the run_id-NULL row only for saturation or a rate limit).';
ALTER FUNCTION zeroth._claim_orphaned_rows(text, text, text, text, integer, integer, double precision, double precision, boolean, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._claim_orphaned_rows(text, text, text, text, integer, integer, double precision, double precision, boolean, text) FROM PUBLIC;

-- claim_orphaned_scopes: claim_orphaned over many deployments and scopes in one call — the
-- recovery half of a fleet worker that claims with claim_and_start_scopes. Scopes: the listed
-- (tenant_ids[i], workspace_ids[i]) × deployment_refs, or with tenant_ids NULL every scope of
-- those deployments that holds a running run (a skip scan of runs_running_idx), visited in a
-- random order, only those with an expired lease. Each scope is claim_orphaned exactly (it ends
-- the orphans nobody may resume, re-leases resumable ones under the scope's limits, paused
-- scopes re-lease nothing); claim_limit is shared: NULL all, 0 end only, else at most that many
-- re-leased in all. Rows: one per re-leased run with its scope, plus one run_id-NULL row per
-- scope where a resumable orphan waits for a free slot or is held back by the scope's rate limit
-- (retry_at). Every argument is checked before any scope is visited: an error one scope's rows
-- raise (a ZP error included) skips that scope with a WARNING, never the others. Locks: as
-- claim_orphaned, per scope.
-- Raises ZP006, ZP008. Notifies zeroth_wakeup for runs it ended. Time: clock_timestamp().
-- lease_seconds NULL (default): the deployment's registered lease (zeroth.deployments; a DBA's, or
-- this login's own registration: zeroth._policy_binds_caller), else 60 s.
-- code_version (issue 34, item 3): as claim_orphaned's, in every scope.
CREATE OR REPLACE FUNCTION zeroth.claim_orphaned_scopes(
    deployment_refs text[],
    worker_id       text,
    tenant_ids      text[]           DEFAULT NULL,
    workspace_ids   text[]           DEFAULT NULL,
    max_concurrency integer          DEFAULT NULL,
    claim_limit     integer          DEFAULT NULL,
    lease_seconds   double precision DEFAULT NULL,
    grace_seconds   double precision DEFAULT 10,
    code_version    text             DEFAULT NULL)
    RETURNS SETOF zeroth.scope_claimed_run
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    SET lock_timeout = '2s'
    SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_now      timestamptz := zeroth._now();
    v_left     integer;
    v_tenants  text[];
    v_wskeys   text[];
    v_deps     text[];
    v_i        integer;
    v_rows     zeroth.scope_claimed_run[];
    v_these    zeroth.scope_claimed_run[];
    v_isolated boolean := false;
    v_state    text;
    v_msg      text;
BEGIN
    -- claim_orphaned checks the rest (worker_id, max_concurrency, lease and grace) per scope;
    -- checked here too, so a bad argument fails before any scope is touched.
    PERFORM zeroth._require_identifier(claim_orphaned_scopes.worker_id, 'worker_id');
    PERFORM zeroth._require(claim_orphaned_scopes.claim_limit IS NULL
                            OR claim_orphaned_scopes.claim_limit BETWEEN 0 AND 1000,
                            'claim_limit must be NULL or between 0 and 1000');
    PERFORM zeroth._require(claim_orphaned_scopes.max_concurrency IS NULL
                            OR claim_orphaned_scopes.max_concurrency BETWEEN 1 AND 10000,
                            'max_concurrency must be NULL or between 1 and 10000');
    IF claim_orphaned_scopes.lease_seconds IS NOT NULL THEN  -- NULL: each deployment's registered lease
        PERFORM zeroth._lease_interval(claim_orphaned_scopes.lease_seconds);
    END IF;
    PERFORM zeroth._grace_interval(claim_orphaned_scopes.grace_seconds);
    PERFORM zeroth._check_code_version(claim_orphaned_scopes.code_version);

    -- The listed scopes first, in a statement of their own: _listed_scopes checks the scope
    -- arguments (ZP006, ZP008), and joined to the runs below it ran only when the plan read it:
    -- a hash semi-join whose side of expired runs was empty (none, or a table the statistics
    -- said was empty after a VACUUM) never did, and a workspace without a tenant was no error.
    SELECT coalesce(array_agg(c.tenant_id), '{}'), coalesce(array_agg(c.workspace_key), '{}'),
           coalesce(array_agg(c.deployment_ref), '{}')
      INTO v_tenants, v_wskeys, v_deps
      FROM zeroth._listed_scopes(claim_orphaned_scopes.deployment_refs,
                                 claim_orphaned_scopes.tenant_ids,
                                 claim_orphaned_scopes.workspace_ids, false) AS c;
    SELECT coalesce(array_agg(x.tenant_id ORDER BY x.o), '{}'), coalesce(array_agg(x.workspace_key ORDER BY x.o), '{}'),
           coalesce(array_agg(x.deployment_ref ORDER BY x.o), '{}')
      INTO v_tenants, v_wskeys, v_deps
      FROM (SELECT c.tenant_id, c.workspace_key, c.deployment_ref, random() AS o
              FROM unnest(v_tenants, v_wskeys, v_deps) AS c(tenant_id, workspace_key, deployment_ref)
             WHERE EXISTS (SELECT 1 FROM zeroth.runs r
                            WHERE r.tenant_id = c.tenant_id AND r.workspace_key = c.workspace_key
                              AND r.deployment_ref = c.deployment_ref
                              AND r.status = 'running' AND r.lease_expires_at < v_now)) AS x;

    -- Every scope in one subtransaction; if one raises (claim_orphaned already ends alone a run
    -- that raises: this is for anything else), the pass is done again with one subtransaction per
    -- scope, so that scope is skipped with a WARNING and the others are recovered (one bad
    -- scope never stops the others). Rows are returned only once the pass that made them
    -- stands.
    LOOP
        BEGIN
            v_rows := '{}';
            v_left := claim_orphaned_scopes.claim_limit;
            FOR v_i IN 1 .. cardinality(v_tenants) LOOP
                EXIT WHEN v_left IS NOT NULL AND v_left = 0 AND claim_orphaned_scopes.claim_limit <> 0;
                IF v_isolated THEN
                    BEGIN
                        v_these := zeroth._claim_orphaned_rows(
                            v_tenants[v_i], v_wskeys[v_i], v_deps[v_i], claim_orphaned_scopes.worker_id,
                            claim_orphaned_scopes.max_concurrency, v_left,
                            claim_orphaned_scopes.lease_seconds, claim_orphaned_scopes.grace_seconds,
                            true, claim_orphaned_scopes.code_version);
                    EXCEPTION WHEN OTHERS THEN
                        -- Every argument was checked above, before any scope: a ZP error here
                        -- comes from this scope's rows (a DBA's INSERT of a run whose tenant_id
                        -- no function accepts), so the scope is skipped like any other error.
                        IF zeroth._transient_sqlstate(SQLSTATE) AND NOT zeroth._lock_timed_out(SQLSTATE) THEN
                            RAISE;  -- a passing condition: the call fails, the next one retries
                        END IF;
                        GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_msg = MESSAGE_TEXT;
                        RAISE WARNING 'zeroth: claim_orphaned of deployment % in tenant % raised % (%); that scope is skipped this pass',
                            v_deps[v_i], v_tenants[v_i], v_state, left(v_msg, 500);
                        v_these := '{}';
                    END;
                ELSE
                    v_these := zeroth._claim_orphaned_rows(
                        v_tenants[v_i], v_wskeys[v_i], v_deps[v_i], claim_orphaned_scopes.worker_id,
                        claim_orphaned_scopes.max_concurrency, v_left,
                        claim_orphaned_scopes.lease_seconds, claim_orphaned_scopes.grace_seconds,
                        false, claim_orphaned_scopes.code_version);
                END IF;
                v_rows := v_rows || v_these;
                IF v_left IS NOT NULL AND claim_orphaned_scopes.claim_limit <> 0 THEN
                    v_left := v_left - (SELECT count(*) FROM unnest(v_these) AS t WHERE t.run_id IS NOT NULL)::integer;
                END IF;
            END LOOP;
            EXIT;
        EXCEPTION WHEN OTHERS THEN
            IF v_isolated OR (zeroth._transient_sqlstate(SQLSTATE) AND NOT zeroth._lock_timed_out(SQLSTATE)) THEN
                RAISE;
            END IF;
            v_isolated := true;
        END;
    END LOOP;
    RETURN QUERY SELECT * FROM unnest(v_rows);
END
$$;
COMMENT ON FUNCTION zeroth.claim_orphaned_scopes(text[], text, text[], text[], integer, integer, double precision, double precision, text) IS
'claim_orphaned_scopes: claim_orphaned over many deployments and scopes in one call. Scopes: (tenant_ids[i], workspace_ids[i]) × deployment_refs, or with tenant_ids NULL every scope of those deployments holding a running run (skip scan of runs_running_idx), in random order, those with an expired lease. Each scope is claim_orphaned exactly (ends the orphans nobody may resume, re-leases resumable ones under the scope''s limits; paused scopes re-lease nothing); claim_limit is shared across scopes (NULL all, 0 end only). Rows: one per re-leased run with its scope, plus one run_id-NULL row per scope where a resumable orphan waits for a slot or its rate limit (retry_at). Arguments are checked before any scope is visited; a scope whose recovery raises anything but a passing condition (a ZP error its rows cause included) is skipped with a WARNING and the others are recovered. Runs under lock_timeout 2 s: a run whose recovery waits longer for a lock (a row someone holds in an open transaction) is left as it was, with a WARNING, for the next pass, and the others are recovered. lease_seconds NULL (the default): the deployment''s registered lease (zeroth.deployments.lease_seconds: a DBA''s, or this login''s own registration), else 60 s. code_version (issue 34): as claim_orphaned''s, in every scope. Raises ZP006, ZP008. Notifies zeroth_wakeup for the runs it ended. Time: clock_timestamp().';
ALTER FUNCTION zeroth.claim_orphaned_scopes(text[], text, text[], text[], integer, integer, double precision, double precision, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.claim_orphaned_scopes(text[], text, text[], text[], integer, integer, double precision, double precision, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.claim_orphaned_scopes(text[], text, text[], text[], integer, integer, double precision, double precision, text) TO zeroth_worker;
