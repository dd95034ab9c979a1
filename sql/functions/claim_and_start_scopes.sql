-- claim_and_start_scopes: claim_and_start over many deployments and scopes in one call, fairly.
-- Scopes: the listed (tenant_ids[i], workspace_ids[i]) × deployment_refs, or with tenant_ids NULL
-- every scope of those deployments that holds a pending run (a skip scan: one probe per such
-- scope). Each scope keeps its rules: order priority DESC, run_after, created_at; the
-- max_concurrency of its zeroth.scope_limits row (else the argument) in exact slots; paused
-- scopes are skipped. Fairness: the scopes with due work are visited in a weighted random order
-- (weight from zeroth.scope_limits, default 1) and each first gets its share of batch_size,
-- ceil(batch_size × weight / total weight); what is left goes, in the same order, to scopes that
-- filled their share. Rows: one per claimed run, plus one run_id-NULL row per scope that had due
-- work but no free slot. Locks: per scope, slot rows then run rows, FOR UPDATE SKIP LOCKED.
-- Raises ZP006, ZP008. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.claim_and_start_scopes(
    deployment_refs text[],
    worker_id       text,
    tenant_ids      text[]           DEFAULT NULL,
    workspace_ids   text[]           DEFAULT NULL,
    max_concurrency integer          DEFAULT NULL,
    batch_size      integer          DEFAULT 1,
    lease_seconds   double precision DEFAULT 60)
    RETURNS SETOF zeroth.scope_claimed_run
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_now     timestamptz := zeroth._now();
    v_lease   interval := zeroth._lease_interval(claim_and_start_scopes.lease_seconds);
    v_tenants text[];
    v_wskeys  text[];
    v_depref  text[];
    v_limits  integer[];
    v_weights integer[];
    v_filled  boolean[];
    v_total   integer;
    v_left    integer := claim_and_start_scopes.batch_size;
    v_ask     integer;
    v_got     integer;
    v_out     zeroth.scope_claimed_run;
    v_pass    integer;
    i         integer;
BEGIN
    PERFORM zeroth._require_identifier(claim_and_start_scopes.worker_id, 'worker_id');
    PERFORM zeroth._require(claim_and_start_scopes.batch_size BETWEEN 1 AND 1000,
                            'batch_size must be between 1 and 1000');
    PERFORM zeroth._require(claim_and_start_scopes.max_concurrency IS NULL
                            OR claim_and_start_scopes.max_concurrency >= 1,
                            'max_concurrency must be NULL or at least 1');
    -- The scopes with due work and their limits, in a weighted random order: sorting by
    -- -ln(U) / weight (U uniform in (0, 1]) puts a scope first with probability weight / total.
    WITH candidates AS (
        SELECT * FROM zeroth._listed_scopes(claim_and_start_scopes.deployment_refs,
                                            claim_and_start_scopes.tenant_ids,
                                            claim_and_start_scopes.workspace_ids, true)
    ), due AS (
        SELECT c.tenant_id, c.workspace_key, c.deployment_ref, l.max_concurrency, l.weight,
               -ln(1.0 - random()) / l.weight AS turn
          FROM candidates c
         CROSS JOIN LATERAL zeroth._scope_limit(c.tenant_id, c.workspace_key, c.deployment_ref,
                                                claim_and_start_scopes.max_concurrency) AS l
         WHERE NOT l.paused
           AND zeroth._scope_has_due_run(c.tenant_id, c.workspace_key, c.deployment_ref, v_now)
    )
    SELECT coalesce(array_agg(d.tenant_id ORDER BY d.turn), '{}'),
           coalesce(array_agg(d.workspace_key ORDER BY d.turn), '{}'),
           coalesce(array_agg(d.deployment_ref ORDER BY d.turn), '{}'),
           coalesce(array_agg(d.max_concurrency ORDER BY d.turn), '{}'),
           coalesce(array_agg(d.weight ORDER BY d.turn), '{}'),
           coalesce(sum(d.weight), 0)::integer
      INTO v_tenants, v_wskeys, v_depref, v_limits, v_weights, v_total
      FROM due d;
    v_filled := array_fill(false, ARRAY[cardinality(v_tenants)]);

    -- Pass 1: each scope its share; pass 2: the rest to the scopes that filled theirs.
    FOR v_pass IN 1 .. 2 LOOP
        FOR i IN 1 .. cardinality(v_tenants) LOOP
            EXIT WHEN v_left = 0;
            CONTINUE WHEN v_pass = 2 AND NOT v_filled[i];
            v_ask := CASE WHEN v_pass = 1
                          THEN least(v_left, greatest(1, ceil(claim_and_start_scopes.batch_size::numeric
                                                              * v_weights[i] / v_total)::integer))
                          ELSE v_left END;
            v_got := 0;
            FOR v_out IN
                SELECT v_tenants[i], zeroth._workspace_id(v_wskeys[i]), v_depref[i], c.*
                  FROM zeroth._claim_in_scope(v_tenants[i], v_wskeys[i], v_depref[i],
                                              claim_and_start_scopes.worker_id, v_limits[i], v_ask,
                                              v_now, v_lease, true) AS c
            LOOP
                IF v_out.run_id IS NOT NULL THEN
                    v_got := v_got + 1;
                    RETURN NEXT v_out;
                ELSIF v_out.concurrency_saturated AND v_pass = 1 THEN
                    RETURN NEXT v_out;
                END IF;
            END LOOP;
            v_left := v_left - v_got;
            v_filled[i] := v_got = v_ask;
        END LOOP;
    END LOOP;
END
$$;
COMMENT ON FUNCTION zeroth.claim_and_start_scopes(text[], text, text[], text[], integer, integer, double precision) IS
'claim_and_start_scopes: claim_and_start over many deployments and scopes in one call, fairly. Scopes: (tenant_ids[i], workspace_ids[i]) × deployment_refs, or with tenant_ids NULL every scope of those deployments holding a pending run (skip scan, one probe per such scope). Per scope: priority DESC, run_after, created_at; zeroth.scope_limits max_concurrency (else the argument) in exact slots; paused scopes skipped. Fairness: scopes with due work in a weighted random order (weight from zeroth.scope_limits, default 1), each first gets ceil(batch_size × weight / total weight), the rest goes in the same order to scopes that filled their share. Rows: one per claimed run with its scope, plus one run_id-NULL row per scope that had due work but no free slot. SKIP LOCKED throughout. Raises ZP006, ZP008. Time: clock_timestamp().';
ALTER FUNCTION zeroth.claim_and_start_scopes(text[], text, text[], text[], integer, integer, double precision) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.claim_and_start_scopes(text[], text, text[], text[], integer, integer, double precision) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.claim_and_start_scopes(text[], text, text[], text[], integer, integer, double precision) TO zeroth_worker;
