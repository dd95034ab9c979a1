-- claim_and_start_scopes: claim_and_start over many deployments and scopes in one call, fairly.
-- Scopes: the listed (tenant_ids[i], workspace_ids[i]) × deployment_refs, or with tenant_ids NULL
-- every scope of those deployments that holds a pending run (a skip scan: one probe per such
-- scope). Each scope keeps its rules: order priority DESC, run_after, created_at (from the
-- session's claim floor, as claim_pending); the
-- max_concurrency of its zeroth.scope_limits row (else the argument) in exact slots; paused
-- scopes are skipped. Fairness: each of the batch_size places is drawn for a scope with due work
-- with probability weight / total weight (weight from zeroth.scope_limits, default 1), so a
-- backlogged scope's expected share is exactly its weight's at any batch size; what a scope
-- cannot use goes, in a weighted random order, to the scopes that may have more. A scope's
-- rate_limit key caps its starts (rolling window). Rows: one per claimed run, plus one
-- run_id-NULL row per scope that had due work but no free slot, or was held back by its rate
-- limit (retry_at). A lapsed unstarted claim counts as in claim_pending (none left:
-- dead-lettered). Locks: per scope, rate key row, slot rows, run rows, all SKIP LOCKED.
-- Raises ZP006, ZP008. Notifies zeroth_wakeup only for a run it dead-lettered.
-- Time: clock_timestamp().
-- lease_seconds NULL (default): the deployment's registered lease (zeroth.deployments; a DBA's, or
-- this login's own registration: zeroth._policy_binds_caller), else 60 s.
-- code_version (issue 34, item 3): as claim_and_start's, per deployment's version_policy.
CREATE OR REPLACE FUNCTION zeroth.claim_and_start_scopes(
    deployment_refs text[],
    worker_id       text,
    tenant_ids      text[]           DEFAULT NULL,
    workspace_ids   text[]           DEFAULT NULL,
    max_concurrency integer          DEFAULT NULL,
    batch_size      integer          DEFAULT 1,
    lease_seconds   double precision DEFAULT NULL,
    code_version    text             DEFAULT NULL)
    RETURNS SETOF zeroth.scope_claimed_run
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_now     timestamptz := zeroth._now();
    v_lease   interval;
    -- lease_seconds NULL: [lease_seconds, attempt_timeout_seconds, run_timeout_seconds] of each
    -- deployment that has one set, from a row that binds this session (issue 34 item 2: the
    -- timeouts in the lookup that reads the lease; with a lease given, _claim_in_scope reads them
    -- in its locking statement)
    v_policy  jsonb;
    v_tenants text[];
    v_wskeys  text[];
    v_depref  text[];
    v_limits  integer[];
    v_rates   text[];
    v_weights integer[];
    v_filled  boolean[];
    v_tried   boolean[];
    v_quota   integer[];
    v_total   integer;
    v_left    integer := claim_and_start_scopes.batch_size;
    v_ask     integer;
    v_got     integer;
    v_out     zeroth.scope_claimed_run;
    v_pass    integer;
    i         integer;
    v_serves  jsonb;  -- code versions (issue 34): per deployment, the run versions this one may resume
    v_version bigint;  -- and its own version's key (zeroth._declared_code_version)
    v_leased  boolean := false;  -- a run leased (then its version's text is recorded)
BEGIN
    PERFORM zeroth._require_identifier(claim_and_start_scopes.worker_id, 'worker_id');
    v_version := zeroth._declared_code_version(claim_and_start_scopes.code_version);  -- ZP008 if bad
    PERFORM zeroth._require(claim_and_start_scopes.batch_size BETWEEN 1 AND 1000,
                            'batch_size must be between 1 and 1000');
    PERFORM zeroth._require(claim_and_start_scopes.max_concurrency IS NULL
                            OR claim_and_start_scopes.max_concurrency >= 1,
                            'max_concurrency must be NULL or at least 1');
    -- Bounded before the lookups below probe the registry once per name (_listed_scopes checks
    -- the names again, with the scopes): an array of a million names was a million probes, and
    -- as many _version_serves calls, before its ZP008 (25 s of CPU on PostgreSQL 18).
    PERFORM zeroth._require(claim_and_start_scopes.deployment_refs IS NOT NULL
                            AND array_ndims(claim_and_start_scopes.deployment_refs) = 1
                            AND cardinality(claim_and_start_scopes.deployment_refs) BETWEEN 1 AND 100,
                            'deployment_refs must be a one-dimensional array of 1 to 100 deployments');
    IF claim_and_start_scopes.lease_seconds IS NOT NULL THEN
        v_lease := zeroth._lease_interval(claim_and_start_scopes.lease_seconds);
    ELSE  -- one primary-key lookup per deployment named: its lease (else 60 s) and timeouts
        -- One probe per name, not `deployment_ref = ANY (names)`: in this function's generic
        -- plan, PostgreSQL before 17 costs an array of unknown length as 10 index probes, more
        -- than a sequential scan of a registry that was small when the plan was made, and keeps
        -- that scan when the registry has grown (tests/plans/test_deployment_defaults_plan.py).
        -- The LIMIT keeps each probe a subquery of its own (never pulled up into a hash join).
        v_policy := (SELECT coalesce(jsonb_object_agg(d.deployment_ref, jsonb_build_array(
                                d.lease_seconds, d.attempt_timeout_seconds, d.run_timeout_seconds)),
                                     '{}')
                       FROM unnest(claim_and_start_scopes.deployment_refs) AS n(ref)
                       CROSS JOIN LATERAL (
                           SELECT d.deployment_ref, d.lease_seconds, d.attempt_timeout_seconds,
                                  d.run_timeout_seconds
                             FROM zeroth.deployments d
                            WHERE d.deployment_ref = n.ref
                              AND (d.lease_seconds IS NOT NULL
                                   OR d.attempt_timeout_seconds IS NOT NULL
                                   OR d.run_timeout_seconds IS NOT NULL)
                              AND zeroth._policy_binds_caller(d.managed_by, d.registered_by)
                            LIMIT 1) d);
    END IF;
    -- code versions (issue 34, item 3): the deployments whose version_policy is not any (one
    -- primary-key lookup per deployment named); the others filter nothing (a NULL serves).
    -- (One probe per name, as v_policy's above.)
    v_serves := (SELECT jsonb_object_agg(d.deployment_ref,
                                         zeroth._version_serves(d.deployment_ref,
                                                                claim_and_start_scopes.code_version))
                   FROM unnest(claim_and_start_scopes.deployment_refs) AS n(ref)
                   CROSS JOIN LATERAL (
                       SELECT d.deployment_ref FROM zeroth.deployments d
                        WHERE d.deployment_ref = n.ref AND d.version_policy <> 'any'
                        LIMIT 1) d);
    -- The scopes with due work (due runs this worker's version may serve: the claims' filter, so
    -- no place is drawn for a scope whose due runs are all pinned to another version) and their
    -- limits, in a weighted random order: sorting by
    -- -ln(U) / weight (U uniform in (0, 1]) puts a scope first with probability weight / total.
    WITH candidates AS (
        SELECT * FROM zeroth._listed_scopes(claim_and_start_scopes.deployment_refs,
                                            claim_and_start_scopes.tenant_ids,
                                            claim_and_start_scopes.workspace_ids, true)
    ), due AS (
        SELECT c.tenant_id, c.workspace_key, c.deployment_ref, l.max_concurrency, l.weight,
               l.rate_limit,
               -ln(1.0 - random()) / l.weight AS turn
          FROM candidates c
         CROSS JOIN LATERAL zeroth._scope_limit(c.tenant_id, c.workspace_key, c.deployment_ref,
                                                claim_and_start_scopes.max_concurrency) AS l
         WHERE NOT l.paused
           AND zeroth._scope_has_due_run(c.tenant_id, c.workspace_key, c.deployment_ref, v_now,
                                         CASE WHEN v_serves ? c.deployment_ref THEN ARRAY(
                                             SELECT jsonb_array_elements_text(
                                                 v_serves -> c.deployment_ref)::bigint)
                                         END)
    )
    SELECT coalesce(array_agg(d.tenant_id ORDER BY d.turn), '{}'),
           coalesce(array_agg(d.workspace_key ORDER BY d.turn), '{}'),
           coalesce(array_agg(d.deployment_ref ORDER BY d.turn), '{}'),
           coalesce(array_agg(d.max_concurrency ORDER BY d.turn), '{}'),
           coalesce(array_agg(d.weight ORDER BY d.turn), '{}'),
           coalesce(array_agg(d.rate_limit ORDER BY d.turn), '{}'),
           coalesce(sum(d.weight), 0)::integer
      INTO v_tenants, v_wskeys, v_depref, v_limits, v_weights, v_rates, v_total
      FROM due d;
    v_filled := array_fill(false, ARRAY[cardinality(v_tenants)]);
    v_tried := v_filled;
    IF cardinality(v_tenants) = 0 THEN
        RETURN;
    END IF;

    -- The share of each scope: batch_size places, each drawn for scope j with probability
    -- weight[j] / total (width_bucket finds the place's scope among the cumulative weights by
    -- binary search). Multinomial, not rounded: rounding up per scope gave the first scope of
    -- the order more than its weight whenever the batch was small.
    SELECT coalesce(array_agg(coalesce(t.n, 0) ORDER BY s.i), '{}')
      INTO v_quota
      FROM generate_subscripts(v_weights, 1) AS s(i)
      LEFT JOIN (SELECT width_bucket(floor(random() * v_total)::integer,
                                     ARRAY(SELECT coalesce(sum(u.w) OVER (ORDER BY u.i ROWS BETWEEN
                                                  UNBOUNDED PRECEDING AND 1 PRECEDING), 0)::integer
                                             FROM unnest(v_weights) WITH ORDINALITY AS u(w, i)
                                            ORDER BY u.i)) AS i,
                        count(*)::integer AS n
                   FROM generate_series(1, claim_and_start_scopes.batch_size)
                  GROUP BY 1) t ON t.i = s.i;

    -- Pass 1: each scope its places; pass 2: the rest, in the weighted random order, to every
    -- scope not known to be dry (it filled its places, or had none).
    FOR v_pass IN 1 .. 2 LOOP
        FOR i IN 1 .. cardinality(v_tenants) LOOP
            EXIT WHEN v_left = 0;
            IF v_pass = 1 THEN
                CONTINUE WHEN v_quota[i] = 0;
                v_ask := least(v_left, v_quota[i]);
            ELSE
                CONTINUE WHEN v_tried[i] AND NOT v_filled[i];
                v_ask := v_left;
            END IF;
            v_got := 0;
            FOR v_out IN
                SELECT v_tenants[i], zeroth._workspace_id(v_wskeys[i]), v_depref[i], c.*
                  FROM zeroth._claim_in_scope(v_tenants[i], v_wskeys[i], v_depref[i],
                                              claim_and_start_scopes.worker_id, v_limits[i],
                                              v_rates[i], v_ask,
                                              v_now,
                                              coalesce(v_lease, make_interval(secs => coalesce(
                                                  (v_policy -> v_depref[i] ->> 0)::double precision, 60))),
                                              true,
                                              (v_policy -> v_depref[i] ->> 1)::double precision,
                                              (v_policy -> v_depref[i] ->> 2)::double precision,
                                              v_policy IS NOT NULL, v_version,
                                              CASE WHEN v_serves ? v_depref[i] THEN ARRAY(
                                                  SELECT jsonb_array_elements_text(
                                                      v_serves -> v_depref[i])::bigint)
                                              END) AS c
            LOOP
                IF v_out.run_id IS NOT NULL THEN
                    v_got := v_got + 1;
                    v_leased := true;
                    RETURN NEXT v_out;
                ELSIF (v_out.concurrency_saturated AND NOT v_tried[i])
                      OR v_out.retry_at IS NOT NULL THEN
                    RETURN NEXT v_out;
                END IF;
            END LOOP;
            v_left := v_left - v_got;
            v_filled[i] := v_got = v_ask;
            v_tried[i] := true;
        END LOOP;
    END LOOP;
    -- The version's text recorded once a run may have recorded it (a claim that leased nothing
    -- writes nothing to zeroth.code_versions).
    IF v_leased AND claim_and_start_scopes.code_version IS NOT NULL THEN
        PERFORM zeroth._code_version_id(claim_and_start_scopes.code_version);
    END IF;
END
$$;
COMMENT ON FUNCTION zeroth.claim_and_start_scopes(text[], text, text[], text[], integer, integer, double precision, text) IS
'claim_and_start_scopes: claim_and_start over many deployments and scopes in one call, fairly. Scopes: (tenant_ids[i], workspace_ids[i]) × deployment_refs, or with tenant_ids NULL every scope of those deployments holding a pending run (skip scan, one probe per such scope). Per scope: priority DESC, run_after, created_at from the session''s claim floor (as claim_pending); zeroth.scope_limits max_concurrency (else the argument) in exact slots; paused scopes skipped; the zeroth.rate_limits key of its rate_limit caps its starts (rolling window). Fairness: each of the batch_size places is drawn for a scope with due work with probability weight / total weight (weight from zeroth.scope_limits, default 1), so a backlogged scope''s expected share is its weight''s at any batch size; what a scope cannot use goes, in a weighted random order, to the scopes that may have more. Rows: one per claimed run with its scope, plus one run_id-NULL row per scope that had due work but no free slot, or was held back by its rate limit (retry_at: when a start becomes possible). A claim that lapsed before start_run counts its attempt as in claim_pending (none left: dead-lettered, attempts_exhausted). SKIP LOCKED throughout. lease_seconds NULL (the default): the deployment''s registered lease (zeroth.deployments.lease_seconds: a DBA''s, or this login''s own registration), else 60 s. code_version (issue 34): as claim_and_start''s, under each deployment''s version_policy. Raises ZP006, ZP008. Notifies zeroth_wakeup (only for a run it dead-lettered). Time: clock_timestamp().';
ALTER FUNCTION zeroth.claim_and_start_scopes(text[], text, text[], text[], integer, integer, double precision, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.claim_and_start_scopes(text[], text, text[], text[], integer, integer, double precision, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.claim_and_start_scopes(text[], text, text[], text[], integer, integer, double precision, text) TO zeroth_worker;
