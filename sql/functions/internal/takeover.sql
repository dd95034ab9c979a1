-- sql/functions/internal/takeover.sql: taking over a run whose owner stopped renewing (claim_for_takeover, reconcile_thread_runs, claim_orphaned, and the claims of pending runs for a lapsed claim with no attempt left).
-- Internal helpers: SECURITY INVOKER, executable by zeroth_owner only (they run inside the
-- SECURITY DEFINER public functions). Re-applied by every upgrade (sql/README.md).

-- Seconds until lease + grace runs out, rounded up and at least 1; NULL without a lease. Clamped
-- to the integer range (a far-off timestamp never raises).
CREATE OR REPLACE FUNCTION zeroth._retry_after(lease_expires_at timestamptz, grace interval, at timestamptz) RETURNS integer
    LANGUAGE sql IMMUTABLE
    RETURN CASE WHEN lease_expires_at IS NOT NULL
                THEN least(greatest(1, ceil(extract(epoch FROM lease_expires_at + grace - at))), 2147483647)::integer
           END;
COMMENT ON FUNCTION zeroth._retry_after(timestamptz, interval, timestamptz) IS 'Internal: max(1, ceil(lease_expires_at + grace - at)) in seconds, clamped to the integer range; NULL without a lease.';
ALTER FUNCTION zeroth._retry_after(timestamptz, interval, timestamptz) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._retry_after(timestamptz, interval, timestamptz) FROM PUBLIC;

-- Ends or hands back one run whose owner's lease expired more than grace ago. Never waits: the
-- slot row and then the run row are taken with SKIP LOCKED, so an owner renewing right now wins
-- and the call returns nothing. The expiry is re-checked in the locking predicate. Outcome: a
-- requested cancel → cancelled; a claim that lapsed before start_run (pending) with no attempt
-- left once its own is counted → failed and dead-lettered, stop_reason attempts_exhausted; not
-- resumable → failed with {stop_reason, message}; resumable and out of attempts (a running run)
-- → dead-lettered alike; else → requeued (pending). The interrupted attempt stays counted, and a
-- lapsed unstarted claim is counted here (start_run never counted it): only a hand-back by the
-- live holder gives one back, so a run that kills every worker it lands on — before or after
-- start_run — ends after max_attempts.
CREATE OR REPLACE FUNCTION zeroth._take_over(tenant_id text, workspace_key text, run_id uuid, grace interval, at timestamptz,
                                  stop_reason text, message text)
    RETURNS SETOF zeroth.takeover
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_run    record;
    v_slot   integer;
    v_result zeroth.takeover;
BEGIN
    SELECT r.admission_slot, r.deployment_ref INTO v_run
      FROM zeroth.runs r
     WHERE r.tenant_id = _take_over.tenant_id AND r.workspace_key = _take_over.workspace_key
       AND r.run_id = _take_over.run_id;
    IF v_run.admission_slot IS NOT NULL THEN
        SELECT s.slot_no INTO v_slot
          FROM zeroth.admission_slots s
         WHERE s.tenant_id = _take_over.tenant_id AND s.workspace_key = _take_over.workspace_key
           AND s.deployment_ref = v_run.deployment_ref AND s.slot_no = v_run.admission_slot
           FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN;
        END IF;
    END IF;

    SELECT r.status, r.thread_id, r.lease_worker_id, r.lease_generation, r.lease_expires_at, r.resumable,
           r.cancel_action, r.deployment_ref, r.workspace_id, r.error, r.attempts, r.max_attempts
      INTO v_run
      FROM zeroth.runs r
     WHERE r.tenant_id = _take_over.tenant_id AND r.workspace_key = _take_over.workspace_key
       AND r.run_id = _take_over.run_id
       AND r.status IN ('pending', 'running')
       AND r.lease_worker_id IS NOT NULL
       AND r.lease_expires_at + _take_over.grace < _take_over.at
       FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;

    v_result := ROW(_take_over.run_id, v_run.thread_id,
                    CASE WHEN v_run.cancel_action IS NOT NULL THEN 'cancelled'
                         WHEN v_run.status = 'pending' AND v_run.attempts + 1 >= v_run.max_attempts
                         THEN 'dead_lettered'
                         WHEN NOT v_run.resumable THEN 'failed'
                         WHEN v_run.status = 'running' AND v_run.attempts >= v_run.max_attempts THEN 'dead_lettered'
                         ELSE 'requeued' END,
                    NULL, v_run.lease_worker_id, v_run.lease_generation)::zeroth.takeover;
    UPDATE zeroth.runs r
       SET status = CASE v_result.outcome WHEN 'cancelled' THEN 'cancelled'::zeroth.run_status
                                          WHEN 'requeued' THEN 'pending'::zeroth.run_status
                                          ELSE 'failed'::zeroth.run_status END,
           error = CASE v_result.outcome
                       WHEN 'requeued' THEN r.error
                       WHEN 'dead_lettered' THEN zeroth._stop_error('attempts_exhausted', CASE
                            WHEN r.status = 'pending' THEN format(
                                'worker %s claimed it and never started it (lease expired at %s) on attempt %s of %s; '
                                'a run whose claims lapse every time is not retried again',
                                r.lease_worker_id, r.lease_expires_at, r.attempts + 1, r.max_attempts)
                            ELSE format(
                                'worker %s stopped renewing its lease (expired at %s) on attempt %s of %s; '
                                'a run whose worker dies every time is not retried again',
                                r.lease_worker_id, r.lease_expires_at, r.attempts, r.max_attempts) END,
                            r.lease_worker_id, r.lease_generation, r.error)
                       ELSE zeroth._stop_error(_take_over.stop_reason, coalesce(_take_over.message, format(
                                'run lease expired: worker %s stopped renewing (expired at %s)',
                                r.lease_worker_id, r.lease_expires_at)),
                            r.lease_worker_id, r.lease_generation, r.error) END,
           attempts = r.attempts + CASE WHEN r.status = 'pending' THEN 1 ELSE 0 END,
           dead_lettered_at = CASE WHEN v_result.outcome = 'dead_lettered' THEN _take_over.at ELSE r.dead_lettered_at END,
           finished_at = CASE WHEN v_result.outcome = 'requeued' THEN NULL ELSE _take_over.at END,
           updated_at = _take_over.at,
           lease_worker_id = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
           admission_slot = NULL, recovery_checkpoint_id = NULL
     WHERE r.tenant_id = _take_over.tenant_id AND r.workspace_key = _take_over.workspace_key
       AND r.run_id = _take_over.run_id
    RETURNING r.status INTO v_result.status;
    PERFORM zeroth._free_slot(_take_over.tenant_id, _take_over.workspace_key, _take_over.run_id,
                              v_run.lease_generation);
    -- A requeued run is claimable now; an ended one may have freed a slot or promoted its thread
    -- (the trigger notifies for the promoted run itself).
    PERFORM zeroth._notify_wakeup(v_run.deployment_ref, _take_over.tenant_id, v_run.workspace_id);
    RETURN NEXT v_result;
END
$$;
COMMENT ON FUNCTION zeroth._take_over(text, text, uuid, interval, timestamptz, text, text) IS 'Internal: the takeover of one run whose lease expired past grace (SKIP LOCKED throughout): cancelled | failed | dead_lettered | requeued; a lapsed unstarted claim counts its attempt. Shared by claim_for_takeover, reconcile_thread_runs, claim_orphaned and the claims of pending runs (a spent lapsed claim).';
ALTER FUNCTION zeroth._take_over(text, text, uuid, interval, timestamptz, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._take_over(text, text, uuid, interval, timestamptz, text, text) FROM PUBLIC;
