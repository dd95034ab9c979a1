-- hand_back_to_pending: running → pending for exactly the live lease (worker_id, generation)
-- (graceful shutdown, contention). The live holder stops the attempt and returns the run to the
-- queue itself, so the attempt is given back — for the first max_attempts hand-backs (hand_backs
-- counts them). After that the attempt stays counted, and a hand-back that finds every attempt
-- used dead-letters the run instead (failed, stop_reason attempts_exhausted): a handler that
-- always outlives the shutdown, or sends its own worker SIGTERM, cannot loop for ever. Still
-- returns true then (the lease was given back). An admin cancel that got there first wins: the run is no
-- longer running, so nothing matches; an expired or cleared lease matches nothing either. Clears
-- the lease and recovery id, frees the slot. Locks: slot, then run. Returns false on no match.
-- Raises ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.hand_back_to_pending(
    run_id       uuid,
    worker_id    text,
    generation   bigint,
    tenant_id    text DEFAULT NULL,
    workspace_id text DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_status zeroth.run_status;
    v_now    timestamptz := zeroth._now();
    v_tenant text := zeroth._scope_tenant(hand_back_to_pending.tenant_id, hand_back_to_pending.workspace_id);
    v_wskey  text := zeroth._workspace_key(hand_back_to_pending.workspace_id);
    v_run    record;
BEGIN
    -- Checks the fence's arguments; the slot, then the run row, then the clock: see
    -- zeroth._lock_lease_end.
    v_status := zeroth._lock_lease_end(v_tenant, v_wskey, hand_back_to_pending.run_id, hand_back_to_pending.worker_id, hand_back_to_pending.generation);
    v_now := zeroth._now();
    -- The first max_attempts hand-backs give the attempt back; after that the attempt stays
    -- counted, and a hand-back that finds no attempt left dead-letters the run.
    UPDATE zeroth.runs r
       SET status = CASE WHEN r.hand_backs >= r.max_attempts AND r.attempts >= r.max_attempts
                         THEN 'failed'::zeroth.run_status ELSE 'pending'::zeroth.run_status END,
           attempts = CASE WHEN r.hand_backs < r.max_attempts THEN greatest(r.attempts - 1, 0)
                           ELSE r.attempts END,
           hand_backs = r.hand_backs + 1,
           error = CASE WHEN r.hand_backs >= r.max_attempts AND r.attempts >= r.max_attempts
                        THEN zeroth._stop_error('attempts_exhausted', format(
                                 'handed back %s times without finishing (attempt %s of %s); a run '
                                 'that never finishes before its worker stops is not retried again',
                                 r.hand_backs + 1, r.attempts, r.max_attempts),
                             r.lease_worker_id, r.lease_generation, r.error)
                        ELSE r.error END,
           dead_lettered_at = CASE WHEN r.hand_backs >= r.max_attempts AND r.attempts >= r.max_attempts
                                   THEN v_now ELSE r.dead_lettered_at END,
           finished_at = CASE WHEN r.hand_backs >= r.max_attempts AND r.attempts >= r.max_attempts
                              THEN v_now END,
           lease_worker_id = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
           admission_slot = NULL, recovery_checkpoint_id = NULL,
           updated_at = v_now
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = hand_back_to_pending.run_id
       AND v_status = 'running'
       AND r.lease_worker_id = hand_back_to_pending.worker_id
       AND r.lease_generation = hand_back_to_pending.generation
       AND r.lease_expires_at >= v_now
    RETURNING r.deployment_ref, r.workspace_id INTO v_run;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM zeroth._free_slot(v_tenant, v_wskey, hand_back_to_pending.run_id, hand_back_to_pending.generation);
    PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_tenant, v_run.workspace_id);
    RETURN true;
END
$$;
COMMENT ON FUNCTION zeroth.hand_back_to_pending(uuid, text, bigint, text, text) IS
'hand_back_to_pending: running → pending for exactly the live lease (worker_id, generation); gives the attempt back for the first max_attempts hand-backs (runs.hand_backs), after that keeps it counted and, when no attempt is left, dead-letters the run instead (failed, stop_reason attempts_exhausted; still returns true); clears the lease, frees the slot. An admin cancel that came first wins (no match); an expired or cleared lease matches nothing. Returns false on no match. Raises ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';
ALTER FUNCTION zeroth.hand_back_to_pending(uuid, text, bigint, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.hand_back_to_pending(uuid, text, bigint, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.hand_back_to_pending(uuid, text, bigint, text, text) TO zeroth_worker;
