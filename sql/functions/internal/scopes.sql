-- sql/functions/internal/scopes.sql: the limits a scope is claimed under (zeroth.scope_limits),
-- and the scopes that have pending runs (the candidates of a multi-scope claim).
-- Internal helpers: SECURITY INVOKER, executable by zeroth_owner only (they run inside the
-- SECURITY DEFINER public functions). Re-applied by every upgrade (sql/README.md).

-- The limits a claim of one scope works under: the scope's row in zeroth.scope_limits where it
-- has one, else the caller's. max_concurrency NULL is no limit; paused leases nothing. Read on
-- every claim, so a DBA's change applies to the next claim of every worker.
CREATE OR REPLACE FUNCTION zeroth._scope_limit(
    tenant_id text, workspace_key text, deployment_ref text, requested integer,
    OUT max_concurrency integer, OUT paused boolean, OUT weight integer)
    LANGUAGE sql STABLE
    BEGIN ATOMIC
        SELECT coalesce(l.max_concurrency, _scope_limit.requested),
               coalesce(l.paused, false),
               coalesce(l.weight, 1)
          FROM (VALUES (1)) AS one(x)
          LEFT JOIN zeroth.scope_limits l
                 ON l.tenant_id = _scope_limit.tenant_id
                AND l.workspace_key = _scope_limit.workspace_key
                AND l.deployment_ref = _scope_limit.deployment_ref;
    END;
COMMENT ON FUNCTION zeroth._scope_limit(text, text, text, integer) IS 'Internal: the max_concurrency (the scope''s zeroth.scope_limits row, else the requested one; NULL: no limit), paused flag and weight (default 1) a claim of this scope works under.';
ALTER FUNCTION zeroth._scope_limit(text, text, text, integer) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._scope_limit(text, text, text, integer) FROM PUBLIC;

-- The scopes of these deployments that hold a pending run, found by a skip scan of
-- runs_claim_pending_idx (tenant_id, workspace_key, deployment_ref, …) WHERE status = 'pending':
-- one index probe per distinct scope with pending runs (of any deployment: the deployment is the
-- index's third column), never a walk over the pending runs themselves nor over scopes that have
-- none. Reads only; takes no lock.
CREATE OR REPLACE FUNCTION zeroth._pending_scopes(deployment_refs text[])
    RETURNS TABLE (tenant_id text, workspace_key text, deployment_ref text)
    LANGUAGE sql STABLE
    BEGIN ATOMIC
        WITH RECURSIVE found AS (
            (SELECT r.tenant_id, r.workspace_key, r.deployment_ref
               FROM zeroth.runs r
              WHERE r.status = 'pending'
              ORDER BY r.tenant_id, r.workspace_key, r.deployment_ref
              LIMIT 1)
            UNION ALL
            SELECT n.tenant_id, n.workspace_key, n.deployment_ref
              FROM found f
             CROSS JOIN LATERAL (
                SELECT r.tenant_id, r.workspace_key, r.deployment_ref
                  FROM zeroth.runs r
                 WHERE r.status = 'pending'
                   AND (r.tenant_id, r.workspace_key, r.deployment_ref)
                       > (f.tenant_id, f.workspace_key, f.deployment_ref)
                 ORDER BY r.tenant_id, r.workspace_key, r.deployment_ref
                 LIMIT 1) n
        )
        SELECT f.tenant_id, f.workspace_key, f.deployment_ref
          FROM found f
         WHERE f.deployment_ref = ANY (_pending_scopes.deployment_refs);
    END;
COMMENT ON FUNCTION zeroth._pending_scopes(text[]) IS 'Internal: the (tenant, workspace_key, deployment) scopes of these deployments that hold a pending run, by a skip scan of runs_claim_pending_idx (one probe per scope with pending runs).';
ALTER FUNCTION zeroth._pending_scopes(text[]) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._pending_scopes(text[]) FROM PUBLIC;

-- Whether a scope has a run a claim would take now: pending, due, no live lease. One probe of
-- runs_claim_pending_idx that stops at the first such run.
CREATE OR REPLACE FUNCTION zeroth._scope_has_due_run(tenant_id text, workspace_key text,
                                                     deployment_ref text, at timestamptz)
    RETURNS boolean
    LANGUAGE sql STABLE
    RETURN EXISTS (
        SELECT 1 FROM zeroth.runs r
         WHERE r.tenant_id = _scope_has_due_run.tenant_id
           AND r.workspace_key = _scope_has_due_run.workspace_key
           AND r.deployment_ref = _scope_has_due_run.deployment_ref
           AND r.status = 'pending'
           AND r.run_after <= _scope_has_due_run.at
           AND (r.lease_expires_at IS NULL OR r.lease_expires_at < _scope_has_due_run.at));
COMMENT ON FUNCTION zeroth._scope_has_due_run(text, text, text, timestamptz) IS 'Internal: true when the scope has a pending, due run that holds no live lease (what a claim would take).';
ALTER FUNCTION zeroth._scope_has_due_run(text, text, text, timestamptz) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._scope_has_due_run(text, text, text, timestamptz) FROM PUBLIC;
