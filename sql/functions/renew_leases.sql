-- renew_leases: one call renews all of a worker's leases. run_ids[i] is renewed only while
-- generations[i] is live and held by worker_id (checked again once the row lock is held, as
-- renew_lease does). Returns one row per requested run with the new expiry and whether a cancel
-- was requested, so a worker learns of losses and cancels together — this is also how a worker
-- confirms a zeroth_control notification. A lease is never extended past its attempt's or run's
-- deadline (capped there, issue 34 item 2); a row refused because one passed says sqlstate ZP013
-- (reported, never raised: the other leases renew). Locks: the runs, in run_id order, FOR UPDATE SKIP
-- LOCKED: a row another session holds (an application's request_cancel in an open transaction,
-- an operator) is not waited for, so one busy row cannot make every lease of the worker lapse;
-- its row says renewed NULL (not renewed this time, the lease not lost: try again). Raises ZP008 (arrays of different lengths, NULLs, a repeated run, more than 1000).
-- Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.renew_leases(
    worker_id     text,
    run_ids       uuid[],
    generations   bigint[],
    tenant_id     text             DEFAULT NULL,
    workspace_id  text             DEFAULT NULL,
    lease_seconds double precision DEFAULT 60)
    RETURNS SETOF zeroth.lease_renewal
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    -- JIT off, as in every function that turns a plan node off: a statement that cannot avoid
    -- the node (a LATERAL row lock needs a nested loop) is costed at 1e10 and JIT-compiled at
    -- each execution, 0.3-1.1 s of CPU where the server has LLVM (docs/performance.md, "JIT").
    SET jit = off
    -- The answer pairs each requested run with its renewal: with a generic plan's estimate of
    -- 10 rows on each side a nested loop is the cheapest-looking join, and for 1,000 leases it
    -- compares every request with every renewal (1,000,000 comparisons). Hashed, it is linear.
    -- No statement here joins zeroth.runs (the lock probes it per run, the UPDATE by address).
    SET enable_nestloop = off
    -- The UPDATE reaches the locked rows by their addresses (a TID scan): a plan made on a small
    -- table must not prefer a sequential scan.
    SET enable_seqscan = off
    SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_now     timestamptz := zeroth._now();
    v_expires timestamptz := v_now + zeroth._lease_interval(renew_leases.lease_seconds);
    v_tenant  text := zeroth._scope_tenant(renew_leases.tenant_id, renew_leases.workspace_id);
    v_wskey   text := zeroth._workspace_key(renew_leases.workspace_id);
    v_locked  uuid[];
    v_rows    tid[];
BEGIN
    PERFORM zeroth._require_identifier(renew_leases.worker_id, 'worker_id');
    PERFORM zeroth._require_lease_batch(renew_leases.run_ids, renew_leases.generations);

    -- Lock: one primary-key probe per requested run, in run_id order. A LATERAL sub-select with
    -- a locking clause is never flattened into a join, so no plan can pair the batch with itself
    -- by a filter (the join it replaced compared every run with every other: 1,000,000
    -- comparisons, 0.2 s, for 1,000 leases).
    SELECT coalesce(array_agg(l.run_id), '{}'), coalesce(array_agg(l.ctid), '{}')
      INTO v_locked, v_rows
      FROM (SELECT q.run_id, q.generation
              FROM unnest(renew_leases.run_ids, renew_leases.generations) AS q(run_id, generation)
             ORDER BY q.run_id) q
     CROSS JOIN LATERAL (
            SELECT r.run_id, r.ctid
              FROM zeroth.runs r
             WHERE r.tenant_id = v_tenant
               AND r.workspace_key = v_wskey
               AND r.run_id = q.run_id
               AND r.lease_generation = q.generation
               AND r.lease_worker_id = renew_leases.worker_id
               AND r.lease_expires_at >= zeroth._now()
               FOR UPDATE OF r SKIP LOCKED) l;

    RETURN QUERY
    WITH renewed AS (
        -- The rows locked above, by their addresses (a TID scan; a row this transaction holds
        -- locked cannot move): their generations were checked under the lock, so no join to the
        -- request is needed. Not by (tenant_id, workspace_key, run_id = ANY): a generic plan
        -- made before the first ANALYZE of zeroth.runs (each equality guessed to keep 0.5% of the
        -- rows, so a scope looks like one row) put only the scope in the index condition and
        -- walked every row version of the scope per call on PostgreSQL 15 (issue 30).
        -- IS NOT DISTINCT FROM and array_position test the scope and run as = and = ANY do on
        -- these NOT NULL columns, but are never index conditions.
        UPDATE zeroth.runs r
           -- Never past the attempt's or the run's deadline (issue 34 item 2; NULL: none).
           SET lease_expires_at = least(v_expires, r.attempt_deadline_at, r.run_deadline_at)
         WHERE r.ctid = ANY (v_rows)
           AND (r.tenant_id, r.workspace_key) IS NOT DISTINCT FROM (v_tenant, v_wskey)
           AND array_position(v_locked, r.run_id) IS NOT NULL
           AND r.lease_worker_id = renew_leases.worker_id
           AND r.lease_expires_at >= zeroth._now()
        RETURNING r.run_id, r.lease_generation, r.lease_expires_at, r.cancel_requested_at
    )
    SELECT q.run_id,
           CASE WHEN n.run_id IS NOT NULL THEN true
                -- Only for a run not renewed (CASE reaches it for those alone, so the common
                -- path pays nothing): still this worker's lease by the snapshot, but not locked
                -- above, so another session holds its row: NULL, not lost. OFFSET 0 keeps it a
                -- primary-key probe per run: without it the planner may hash the sub-select
                -- instead, reading every lease of the worker in the scope, and a generic plan made
                -- before the first ANALYZE did (the scope looks like one row; issue 30).
                WHEN NOT q.run_id = ANY (v_locked)
                 AND EXISTS (SELECT 1 FROM zeroth.runs r
                              WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey
                                AND r.run_id = q.run_id AND r.lease_generation = q.generation
                                AND r.lease_worker_id = renew_leases.worker_id
                                AND r.lease_expires_at >= v_now
                             OFFSET 0) THEN NULL
                ELSE false END,
           n.lease_expires_at,
           coalesce(n.cancel_requested_at IS NOT NULL, false),
           -- Not renewed because the holder's attempt or run deadline passed: ZP013 (a probe
           -- made only for a row not renewed; OFFSET 0 as above).
           CASE WHEN n.run_id IS NULL
                 AND EXISTS (SELECT 1 FROM zeroth.runs r
                              WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey
                                AND r.run_id = q.run_id AND r.lease_generation = q.generation
                                AND r.lease_worker_id = renew_leases.worker_id
                                AND r.status = 'running'
                                AND least(r.attempt_deadline_at, r.run_deadline_at) <= v_now
                             OFFSET 0) THEN 'ZP013' END
      FROM unnest(renew_leases.run_ids, renew_leases.generations)
           WITH ORDINALITY AS q(run_id, generation, position)
      LEFT JOIN renewed n ON n.run_id = q.run_id AND n.lease_generation = q.generation
     ORDER BY q.position;
END
$$;
COMMENT ON FUNCTION zeroth.renew_leases(text, uuid[], bigint[], text, text, double precision) IS
'renew_leases: batch renew_lease for one worker; run_ids[i] is renewed only while generations[i] is live and held by worker_id (re-checked under the row lock). Never extends a lease past its attempt''s or run''s deadline (capped there). One row per requested run (renewed, new expiry, cancel_requested, sqlstate: deadline_passed — the code renew_lease raises — when not renewed because the holder''s attempt or run deadline passed, else NULL), in input order: how a worker confirms a cancel notification. Locks runs in run_id order, SKIP LOCKED: a run whose row another session holds gets renewed NULL (not renewed this time, not lost). Raises ZP008 (unequal arrays, NULLs, a repeated run, more than 1000). Time: clock_timestamp().';
ALTER FUNCTION zeroth.renew_leases(text, uuid[], bigint[], text, text, double precision) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.renew_leases(text, uuid[], bigint[], text, text, double precision) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.renew_leases(text, uuid[], bigint[], text, text, double precision) TO zeroth_worker;
