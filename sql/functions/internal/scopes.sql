-- sql/functions/internal/scopes.sql: the limits a scope is claimed under (zeroth.scope_limits),
-- and the scopes that have pending runs (the candidates of a multi-scope claim).
-- Internal helpers: SECURITY INVOKER, executable by zeroth_owner only (they run inside the
-- SECURITY DEFINER public functions). Re-applied by every upgrade (sql/README.md).

-- The limits a claim of one scope works under: the scope's row in zeroth.scope_limits where it
-- has one, else the caller's. max_concurrency NULL is no limit; paused leases nothing; rate_limit
-- names the zeroth.rate_limits key its starts count against (NULL: none). Read on every claim, so
-- a DBA's change applies to the next claim of every worker. (0012 added rate_limit: the old
-- signature, without it, is dropped first.) PL/pgSQL, not SQL: a scalar SQL function with a query
-- is not inlined, and before PostgreSQL 18 it is parsed and planned again at every call (80-100
-- µs of every claim on PostgreSQL 15; issue 30); PL/pgSQL keeps its plan for the session.
DROP FUNCTION IF EXISTS zeroth._scope_limit(text, text, text, integer);
CREATE OR REPLACE FUNCTION zeroth._scope_limit(
    tenant_id text, workspace_key text, deployment_ref text, requested integer,
    OUT max_concurrency integer, OUT paused boolean, OUT weight integer, OUT rate_limit text)
    LANGUAGE plpgsql STABLE AS $$
BEGIN
    SELECT coalesce(l.max_concurrency, _scope_limit.requested),
           coalesce(l.paused, false),
           coalesce(l.weight, 1),
           l.rate_limit
      INTO max_concurrency, paused, weight, rate_limit
      FROM (VALUES (1)) AS one(x)
      LEFT JOIN zeroth.scope_limits l
             ON l.tenant_id = _scope_limit.tenant_id
            AND l.workspace_key = _scope_limit.workspace_key
            AND l.deployment_ref = _scope_limit.deployment_ref;
END
$$;
COMMENT ON FUNCTION zeroth._scope_limit(text, text, text, integer) IS 'Internal: the max_concurrency (the scope''s zeroth.scope_limits row, else the requested one; NULL: no limit), paused flag, weight (default 1) and rate_limit key (NULL: none) a claim of this scope works under.';
ALTER FUNCTION zeroth._scope_limit(text, text, text, integer) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._scope_limit(text, text, text, integer) FROM PUBLIC;

-- The scopes of these deployments that hold a pending run, found by a skip scan of
-- runs_claim_pending_idx (tenant_id, workspace_key, deployment_ref, …) WHERE status = 'pending':
-- one index probe per distinct scope with pending runs (of any deployment: the deployment is the
-- index's third column), never a walk over the pending runs themselves nor over scopes that have
-- none. Reads only; takes no lock.
-- The probes go backwards, from the last scope to the first, and each reads its scope from its
-- tail (the lowest priority, the latest run_after): the dead entries of a dirty table are at the
-- head of their scope (the runs claimed or deleted since the last VACUUM, which while the xmin
-- horizon is pinned no scan may mark dead, so each costs a heap fetch), the newest runs at its
-- tail; a forward probe read every dead entry of the scope before its first live run (200,000 of
-- them: 202,511 entries and 4,603 heap blocks on PostgreSQL 15), a backward one reads from the
-- newest (issue 30). A scope whose runs were all claimed or deleted is still read whole.
CREATE OR REPLACE FUNCTION zeroth._pending_scopes(deployment_refs text[])
    RETURNS TABLE (tenant_id text, workspace_key text, deployment_ref text)
    LANGUAGE sql STABLE
    BEGIN ATOMIC
        WITH RECURSIVE found AS (
            (SELECT r.tenant_id, r.workspace_key, r.deployment_ref
               FROM zeroth.runs r
              WHERE r.status = 'pending'
              ORDER BY r.tenant_id DESC, r.workspace_key DESC, r.deployment_ref DESC
              LIMIT 1)
            UNION ALL
            SELECT n.tenant_id, n.workspace_key, n.deployment_ref
              FROM found f
             CROSS JOIN LATERAL (
                SELECT r.tenant_id, r.workspace_key, r.deployment_ref
                  FROM zeroth.runs r
                 WHERE r.status = 'pending'
                   AND (r.tenant_id, r.workspace_key, r.deployment_ref)
                       < (f.tenant_id, f.workspace_key, f.deployment_ref)
                 ORDER BY r.tenant_id DESC, r.workspace_key DESC, r.deployment_ref DESC
                 LIMIT 1) n
        )
        SELECT f.tenant_id, f.workspace_key, f.deployment_ref
          FROM found f
         WHERE f.deployment_ref = ANY (_pending_scopes.deployment_refs);
    END;
COMMENT ON FUNCTION zeroth._pending_scopes(text[]) IS 'Internal: the (tenant, workspace_key, deployment) scopes of these deployments that hold a pending run, by a skip scan of runs_claim_pending_idx (one probe per scope with pending runs).';
ALTER FUNCTION zeroth._pending_scopes(text[]) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._pending_scopes(text[]) FROM PUBLIC;

-- Whether a scope has a run a claim would take now: pending, due, no live lease, and (code
-- versions, issue 34) one the claimer's version may serve: serves is the claimer's
-- zeroth._version_serves (NULL: every run), the filter of the claims (_claim_in_scope), so a
-- scope whose only due runs are pinned to another version is no candidate (no place of the batch
-- is drawn for it). Reads runs_claim_pending_idx as a claim of this session would (issue 30): from
-- the session's claim floor (zeroth._claim_floor; the levels above and below the floor's priority
-- from their heads), or from the head of the scope when the floor's bound has passed, and each
-- probe stops at the first such run. A full look that finds none keeps a floor at `at` when it
-- passed over a dirty head (as a claim's full scan does: zeroth._claim_floor_after_full_scan), so
-- an empty scope full of dead entries is not walked on every call.
-- (The signature before 0022, without serves, is dropped first; issue 30 made it PL/pgSQL.)
DROP FUNCTION IF EXISTS zeroth._scope_has_due_run(text, text, text, timestamptz);
CREATE OR REPLACE FUNCTION zeroth._scope_has_due_run(tenant_id text, workspace_key text,
                                                     deployment_ref text, at timestamptz,
                                                     serves bigint[] DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_floor record;
    v_began timestamptz := clock_timestamp();
    v_read  bigint;
    v_pages bigint;
    v_found boolean;
BEGIN
    SELECT * INTO v_floor
      FROM zeroth._claim_floor(_scope_has_due_run.tenant_id, _scope_has_due_run.workspace_key,
                               _scope_has_due_run.deployment_ref, _scope_has_due_run.serves,
                               _scope_has_due_run.at);
    IF v_floor.full_scan THEN
        v_read := zeroth._claim_index_entries_read();
        v_pages := zeroth._claim_index_pages_read();
    END IF;
    v_found := EXISTS (
            SELECT 1 FROM zeroth.runs r
             WHERE r.tenant_id = _scope_has_due_run.tenant_id
               AND r.workspace_key = _scope_has_due_run.workspace_key
               AND r.deployment_ref = _scope_has_due_run.deployment_ref
               AND r.status = 'pending'
               AND r.priority > v_floor.priority
               AND r.run_after <= _scope_has_due_run.at
               AND (r.lease_expires_at IS NULL OR r.lease_expires_at < _scope_has_due_run.at)
               AND (_scope_has_due_run.serves IS NULL OR r.started_at IS NULL
                    OR r.code_version_id IS NULL
                    OR r.code_version_id = ANY (_scope_has_due_run.serves)))
        OR EXISTS (
            SELECT 1 FROM zeroth.runs r
             WHERE r.tenant_id = _scope_has_due_run.tenant_id
               AND r.workspace_key = _scope_has_due_run.workspace_key
               AND r.deployment_ref = _scope_has_due_run.deployment_ref
               AND r.status = 'pending'
               AND r.priority = v_floor.priority
               AND (r.run_after, r.created_at) >= (v_floor.run_after, v_floor.created_at)
               AND r.run_after <= _scope_has_due_run.at
               AND (r.lease_expires_at IS NULL OR r.lease_expires_at < _scope_has_due_run.at)
               AND (_scope_has_due_run.serves IS NULL OR r.started_at IS NULL
                    OR r.code_version_id IS NULL
                    OR r.code_version_id = ANY (_scope_has_due_run.serves)))
        OR EXISTS (
            SELECT 1 FROM zeroth.runs r
             WHERE r.tenant_id = _scope_has_due_run.tenant_id
               AND r.workspace_key = _scope_has_due_run.workspace_key
               AND r.deployment_ref = _scope_has_due_run.deployment_ref
               AND r.status = 'pending'
               AND r.priority < v_floor.priority
               AND r.run_after <= _scope_has_due_run.at
               AND (r.lease_expires_at IS NULL OR r.lease_expires_at < _scope_has_due_run.at)
               AND (_scope_has_due_run.serves IS NULL OR r.started_at IS NULL
                    OR r.code_version_id IS NULL
                    OR r.code_version_id = ANY (_scope_has_due_run.serves)));
    IF v_floor.full_scan AND NOT v_found THEN
        PERFORM zeroth._claim_floor_after_full_scan(
            _scope_has_due_run.tenant_id, _scope_has_due_run.workspace_key,
            _scope_has_due_run.deployment_ref, _scope_has_due_run.serves, v_floor.kept_priority,
            NULL, NULL, NULL, NULL, _scope_has_due_run.at,
            zeroth._claim_index_entries_read() - v_read, zeroth._claim_index_pages_read() - v_pages,
            1, clock_timestamp() - v_began);
    END IF;
    RETURN v_found;
END
$$;
COMMENT ON FUNCTION zeroth._scope_has_due_run(text, text, text, timestamptz, bigint[]) IS 'Internal: true when the scope has a pending, due run that holds no live lease and that a claimer whose zeroth._version_serves is serves (NULL: every run) may take (what a claim of this session would take: from its claim floor, or from the head once the floor''s bound passed).';
ALTER FUNCTION zeroth._scope_has_due_run(text, text, text, timestamptz, bigint[]) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._scope_has_due_run(text, text, text, timestamptz, bigint[]) FROM PUBLIC;

-- The scopes of these deployments that hold a running run: a skip scan of runs_running_idx
-- (_pending_scopes's twin: each must name its status as a constant, or a generic plan could not
-- use that status's partial index)
-- (tenant_id, workspace_key, deployment_ref) WHERE status = 'running', one probe per such scope
-- (of any deployment). The candidates of claim_orphaned_scopes. Reads only; takes no lock.
CREATE OR REPLACE FUNCTION zeroth._running_scopes(deployment_refs text[])
    RETURNS TABLE (tenant_id text, workspace_key text, deployment_ref text)
    LANGUAGE sql STABLE
    BEGIN ATOMIC
        WITH RECURSIVE found AS (
            (SELECT r.tenant_id, r.workspace_key, r.deployment_ref
               FROM zeroth.runs r
              WHERE r.status = 'running'
              ORDER BY r.tenant_id, r.workspace_key, r.deployment_ref
              LIMIT 1)
            UNION ALL
            SELECT n.tenant_id, n.workspace_key, n.deployment_ref
              FROM found f
             CROSS JOIN LATERAL (
                SELECT r.tenant_id, r.workspace_key, r.deployment_ref
                  FROM zeroth.runs r
                 WHERE r.status = 'running'
                   AND (r.tenant_id, r.workspace_key, r.deployment_ref)
                       > (f.tenant_id, f.workspace_key, f.deployment_ref)
                 ORDER BY r.tenant_id, r.workspace_key, r.deployment_ref
                 LIMIT 1) n
        )
        SELECT f.tenant_id, f.workspace_key, f.deployment_ref
          FROM found f
         WHERE f.deployment_ref = ANY (_running_scopes.deployment_refs);
    END;
COMMENT ON FUNCTION zeroth._running_scopes(text[]) IS 'Internal: the (tenant, workspace_key, deployment) scopes of these deployments that hold a running run, by a skip scan of runs_running_idx (one probe per such scope).';
ALTER FUNCTION zeroth._running_scopes(text[]) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._running_scopes(text[]) FROM PUBLIC;

-- The arguments every multi-scope function shares, checked once (ZP008; ZP006 for a listed
-- workspace without a tenant), and the candidate scopes they name: the listed (tenant_ids[i],
-- workspace_ids[i]) × deployment_refs, or with tenant_ids NULL the scopes a skip scan finds
-- (pending: _pending_scopes; otherwise running: _running_scopes). Distinct, unordered.
CREATE OR REPLACE FUNCTION zeroth._listed_scopes(deployment_refs text[], tenant_ids text[],
                                                 workspace_ids text[], pending boolean)
    RETURNS TABLE (tenant_id text, workspace_key text, deployment_ref text)
    LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_deps text[];
BEGIN
    PERFORM zeroth._require(_listed_scopes.deployment_refs IS NOT NULL
                            AND array_ndims(_listed_scopes.deployment_refs) = 1
                            AND cardinality(_listed_scopes.deployment_refs) BETWEEN 1 AND 100,
                            'deployment_refs must be a one-dimensional array of 1 to 100 deployments');
    FOR i IN 1 .. cardinality(_listed_scopes.deployment_refs) LOOP
        PERFORM zeroth._require_identifier(_listed_scopes.deployment_refs[i], 'every deployment_ref');
    END LOOP;
    v_deps := ARRAY(SELECT DISTINCT d FROM unnest(_listed_scopes.deployment_refs) AS d);

    IF _listed_scopes.tenant_ids IS NULL THEN
        PERFORM zeroth._require(_listed_scopes.workspace_ids IS NULL,
                                'workspace_ids needs tenant_ids (NULL tenant_ids is every scope)');
        IF _listed_scopes.pending THEN
            RETURN QUERY SELECT p.tenant_id, p.workspace_key, p.deployment_ref
                           FROM zeroth._pending_scopes(v_deps) AS p;
        ELSE
            RETURN QUERY SELECT p.tenant_id, p.workspace_key, p.deployment_ref
                           FROM zeroth._running_scopes(v_deps) AS p;
        END IF;
        RETURN;
    END IF;

    PERFORM zeroth._require(array_ndims(_listed_scopes.tenant_ids) = 1
                            AND cardinality(_listed_scopes.tenant_ids) * cardinality(v_deps)
                                BETWEEN 1 AND 10000,
                            'tenant_ids must be a one-dimensional array, and scopes × deployments at most 10000');
    PERFORM zeroth._require(_listed_scopes.workspace_ids IS NULL
                            OR (array_ndims(_listed_scopes.workspace_ids) = 1
                                AND cardinality(_listed_scopes.workspace_ids)
                                    = cardinality(_listed_scopes.tenant_ids)),
                            'workspace_ids must be NULL or as long as tenant_ids');
    FOR i IN 1 .. cardinality(_listed_scopes.tenant_ids) LOOP
        IF _listed_scopes.tenant_ids[i] IS NULL AND _listed_scopes.workspace_ids[i] IS NOT NULL THEN
            RAISE EXCEPTION 'a workspace_id needs a tenant_id (scope % of tenant_ids)', i
                USING ERRCODE = 'ZP006';
        END IF;
        PERFORM zeroth._require_identifier(coalesce(_listed_scopes.tenant_ids[i], 'default'),
                                           'every tenant_id');
        PERFORM zeroth._require(coalesce(length(_listed_scopes.workspace_ids[i]), 0) <= 200,
                                'every workspace_id must be at most 200 characters');
    END LOOP;
    RETURN QUERY
    SELECT DISTINCT zeroth._scope_tenant(t.tenant_id, t.workspace_id),
                    zeroth._workspace_key(t.workspace_id),
                    d.deployment_ref
      FROM unnest(_listed_scopes.tenant_ids,
                  coalesce(_listed_scopes.workspace_ids,
                           array_fill(NULL::text, ARRAY[cardinality(_listed_scopes.tenant_ids)])))
               AS t(tenant_id, workspace_id)
     CROSS JOIN unnest(v_deps) AS d(deployment_ref);
END
$$;
COMMENT ON FUNCTION zeroth._listed_scopes(text[], text[], text[], boolean) IS 'Internal: check the scope arguments of a multi-scope function (ZP006, ZP008) and return the scopes they name: the listed ones × the deployments, or (tenant_ids NULL) every scope of the deployments with pending (pending true) or running runs.';
ALTER FUNCTION zeroth._listed_scopes(text[], text[], text[], boolean) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._listed_scopes(text[], text[], text[], boolean) FROM PUBLIC;

-- The workspace id a workspace key stands for ('' is the null workspace).
CREATE OR REPLACE FUNCTION zeroth._workspace_id(workspace_key text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN CASE WHEN workspace_key = '' THEN NULL ELSE substr(workspace_key, 3) END;
COMMENT ON FUNCTION zeroth._workspace_id(text) IS 'Internal: the workspace id of a workspace key (the inverse of _workspace_key).';
ALTER FUNCTION zeroth._workspace_id(text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._workspace_id(text) FROM PUBLIC;
