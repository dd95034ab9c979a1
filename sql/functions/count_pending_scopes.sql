-- count_pending_scopes: count_pending over many deployments and scopes in one call, summed per
-- deployment — a fleet worker's queue-depth gauge. Scopes: the listed (tenant_ids[i],
-- workspace_ids[i]) × deployment_refs, or with tenant_ids NULL every scope of those deployments
-- that holds a pending run (the skip scan of claim_and_start_scopes). One row per distinct
-- deployment, 0 when it has none. Uses runs_claim_pending_idx. No locks. Raises ZP006, ZP008.
-- Time: none.
CREATE OR REPLACE FUNCTION zeroth.count_pending_scopes(
    deployment_refs text[],
    tenant_ids      text[] DEFAULT NULL,
    workspace_ids   text[] DEFAULT NULL)
    RETURNS TABLE (deployment_ref text, pending bigint)
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    BEGIN ATOMIC
        -- The scopes come first: _listed_scopes checks the arguments (an Append runs both).
        SELECT c.deployment_ref, sum(c.pending)::bigint
          FROM (SELECT s.deployment_ref,
                       (SELECT count(*) FROM zeroth.runs r
                         WHERE r.tenant_id = s.tenant_id
                           AND r.workspace_key = s.workspace_key
                           AND r.deployment_ref = s.deployment_ref
                           AND r.status = 'pending') AS pending
                  FROM zeroth._listed_scopes(count_pending_scopes.deployment_refs,
                                             count_pending_scopes.tenant_ids,
                                             count_pending_scopes.workspace_ids, true) AS s
                UNION ALL
                SELECT d.deployment_ref, 0
                  FROM unnest(count_pending_scopes.deployment_refs) AS d(deployment_ref)) c
         GROUP BY c.deployment_ref
         ORDER BY c.deployment_ref;
    END;
COMMENT ON FUNCTION zeroth.count_pending_scopes(text[], text[], text[]) IS
'count_pending_scopes: pending runs per deployment, summed over the listed scopes or (tenant_ids NULL) every scope of the deployments (a fleet worker''s queue-depth gauge); one row per deployment, 0 when none; read only, through runs_claim_pending_idx. Raises ZP006 (a listed workspace without a tenant), ZP008.';
ALTER FUNCTION zeroth.count_pending_scopes(text[], text[], text[]) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.count_pending_scopes(text[], text[], text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.count_pending_scopes(text[], text[], text[]) TO zeroth_worker;
