-- renew_lease: extend a live lease held by (worker_id, generation). An expired lease is never
-- renewed, even when nobody took the run. The row is locked first and the expiry checked against
-- the clock again once the lock is held, so a renewal that waited for the row (a claim retiring
-- the lease's slot, an orphan claim) decides on the time it really writes. generation NULL =
-- owner only (seed compatibility). Slots are not touched: a slot is held through the run's lease.
-- Deadlines (issue 34 item 2): the new expiry is capped at the attempt's and the run's deadline
-- (runs.attempt_deadline_at, run_deadline_at, fixed by the claim; renewing never moves them); a
-- holder whose lease was refused because a deadline passed gets ZP013 deadline_passed.
-- Locks: the run row. Returns false when refused. Raises ZP008, ZP013. Notifies nothing.
-- Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.renew_lease(
    run_id        uuid,
    worker_id     text,
    generation    bigint           DEFAULT NULL,
    tenant_id     text             DEFAULT NULL,
    workspace_id  text             DEFAULT NULL,
    lease_seconds double precision DEFAULT 60)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    -- JIT off, as in every function that turns a plan node off: a statement that cannot avoid
    -- the node (a LATERAL row lock needs a nested loop) is costed at 1e10 and JIT-compiled at
    -- each execution, 0.3-1.1 s of CPU where the server has LLVM (docs/performance.md, "JIT").
    SET jit = off
    -- Sequential scans off: the run is one primary-key probe whatever the statistics say (a
    -- cached plan made on a table analyzed while empty read zeroth.runs whole at each renewal).
    SET enable_seqscan = off AS $$
DECLARE
    v_now     timestamptz := zeroth._now();
    v_expires timestamptz := v_now + zeroth._lease_interval(renew_lease.lease_seconds);
    v_tenant  text := zeroth._scope_tenant(renew_lease.tenant_id, renew_lease.workspace_id);
    v_wskey   text := zeroth._workspace_key(renew_lease.workspace_id);
BEGIN
    PERFORM zeroth._require(renew_lease.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(renew_lease.worker_id, 'worker_id');

    WITH locked AS MATERIALIZED (
        SELECT r.run_id
          FROM zeroth.runs r
         WHERE r.tenant_id = v_tenant
           AND r.workspace_key = v_wskey
           AND r.run_id = renew_lease.run_id
           AND r.lease_worker_id = renew_lease.worker_id
           AND (renew_lease.generation IS NULL OR r.lease_generation = renew_lease.generation)
           AND r.lease_expires_at >= zeroth._now()
           FOR UPDATE OF r
    )
    UPDATE zeroth.runs r
       -- Never past the attempt's or the run's deadline (issue 34 item 2; NULL: none).
       SET lease_expires_at = least(v_expires, r.attempt_deadline_at, r.run_deadline_at)
      FROM locked l
     WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey
       AND r.run_id = renew_lease.run_id AND r.run_id = l.run_id
       AND r.lease_expires_at >= zeroth._now();
    IF FOUND THEN
        RETURN true;
    END IF;
    -- Refused. Because the holder's attempt or run ran out of time (its lease was capped at the
    -- deadline, which has passed): ZP013, so the worker stops the handler and reports a timeout
    -- rather than a lost lease. Read only on this path.
    IF EXISTS (SELECT 1 FROM zeroth.runs r
                WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey
                  AND r.run_id = renew_lease.run_id
                  AND r.status = 'running'
                  AND r.lease_worker_id = renew_lease.worker_id
                  AND (renew_lease.generation IS NULL OR r.lease_generation = renew_lease.generation)
                  AND least(r.attempt_deadline_at, r.run_deadline_at) <= zeroth._now()) THEN
        RAISE EXCEPTION 'run %: its % deadline has passed; the lease cannot be renewed', renew_lease.run_id,
            (SELECT CASE WHEN r.run_deadline_at <= zeroth._now() THEN 'run' ELSE 'attempt' END
               FROM zeroth.runs r
              WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey AND r.run_id = renew_lease.run_id)
            USING ERRCODE = 'ZP013';
    END IF;
    RETURN false;
END
$$;
COMMENT ON FUNCTION zeroth.renew_lease(uuid, text, bigint, text, text, double precision) IS
'renew_lease: extend a live lease held by (worker_id, generation); an expired lease is never renewed, even if untaken (the expiry is re-checked once the row lock is held). generation NULL = owner only. Never extends the lease past the attempt''s or the run''s deadline (capped there; the deadlines are fixed by the claim and no renewal moves them). Returns false when refused; raises ZP013 deadline_passed when refused because the holder''s attempt or run deadline has passed. Raises ZP008, ZP013. Time: clock_timestamp().';
ALTER FUNCTION zeroth.renew_lease(uuid, text, bigint, text, text, double precision) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.renew_lease(uuid, text, bigint, text, text, double precision) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.renew_lease(uuid, text, bigint, text, text, double precision) TO zeroth_worker;
