-- sql/functions/internal/cancel.sql: the cancel decision shared by request_cancel(_v2) and admit_run.
-- Internal helpers: SECURITY INVOKER, executable by zeroth_owner only (they run inside the
-- SECURITY DEFINER public functions). Re-applied by every upgrade (sql/README.md).

-- The cancel decision, shared by request_cancel, request_cancel_v2 and admit_run. Locks the run's
-- slots, then the run (a no-op when the caller holds them). pending / waiting / queued → cancelled
-- at once (a claimed but unstarted holder is fenced out: the start barrier). running whose owner's
-- lease + grace has not run out → cancel_requested (durable flag, first action wins, NOTIFY to the
-- owner's key), unless the caller proves it is that owner: its worker id and live generation.
-- running past lease + grace → taken_over: cancelled here with a stop reason, slot freed. The
-- owner's later writes are refused by the fence. The ends go through the settle path
-- (zeroth._settle, kind revoke: lease cleared, slots freed, attempt recorded, wakeup); an edge a
-- DBA removed from zeroth.run_transitions raises ZP003 and changes nothing.
CREATE OR REPLACE FUNCTION zeroth._cancel(tenant_id text, workspace_key text, run_id uuid, action text, grace interval,
                               at timestamptz, caller_worker_id text DEFAULT NULL, caller_generation bigint DEFAULT NULL)
    RETURNS zeroth.cancel_result
    LANGUAGE plpgsql VOLATILE
    -- JIT off, as in every function that turns a plan node off: a statement that cannot avoid
    -- the node (a LATERAL row lock needs a nested loop) is costed at 1e10 and JIT-compiled at
    -- each execution, 0.3-1.1 s of CPU where the server has LLVM (docs/performance.md, "JIT").
    SET jit = off
    -- Sequential scans off: the slot and the run are key probes whatever the statistics say (a
    -- cached plan made on tables analyzed while empty read admission_slots whole:
    -- tests/plans/test_generic_plans_all.py, analyzed-while-empty).
    SET enable_seqscan = off
    AS $$
DECLARE
    v_run    record;
    v_owner  boolean;
    v_slots  tid[];
    v_settle record;
    v_result zeroth.cancel_result;
    v_at     timestamptz;
BEGIN
    v_slots := ARRAY(SELECT s.ctid FROM zeroth.admission_slots s
                      -- The scope by IS NOT DISTINCT FROM: by admission_slots_run_idx whatever the
                      -- statistics (see zeroth._lock_settle).
                      WHERE s.run_id = _cancel.run_id
                        AND (s.tenant_id, s.workspace_key) IS NOT DISTINCT FROM (_cancel.tenant_id, _cancel.workspace_key)
                        FOR UPDATE);
    SELECT r.ctid, r.status, r.lease_worker_id, r.lease_generation, r.lease_expires_at, r.deployment_ref,
           r.workspace_id, r.cancel_action
      INTO v_run
      FROM zeroth.runs r
     WHERE r.tenant_id = _cancel.tenant_id AND r.workspace_key = _cancel.workspace_key AND r.run_id = _cancel.run_id
       FOR UPDATE;
    -- Decide with the clock read under the row lock, not the caller's `at` from before it: a
    -- caller that waited for the row must not count an owner whose lease expired meanwhile.
    v_at := greatest(_cancel.at, zeroth._now());
    v_result.run_id := _cancel.run_id;
    IF NOT FOUND THEN
        v_result.outcome := 'unknown';
        RETURN v_result;
    END IF;
    v_result.lease_worker_id := v_run.lease_worker_id;
    v_result.lease_generation := v_run.lease_generation;
    IF v_run.status IN ('completed', 'failed', 'cancelled') THEN
        v_result.outcome := 'not_cancellable';
        v_result.status := v_run.status;
        v_result.cancel_action := v_run.cancel_action;
        RETURN v_result;
    END IF;

    -- A worker id is only a label: owning the run means holding its live lease generation.
    v_owner := v_run.lease_worker_id = _cancel.caller_worker_id
               AND v_run.lease_generation = _cancel.caller_generation
               AND v_run.lease_expires_at >= v_at;
    IF v_run.status = 'running' AND v_run.lease_expires_at + _cancel.grace >= v_at
       AND v_owner IS NOT TRUE THEN
        UPDATE zeroth.runs r
           SET cancel_requested_at = coalesce(r.cancel_requested_at, v_at),
               cancel_action = coalesce(r.cancel_action, _cancel.action),
               updated_at = v_at
         WHERE r.tenant_id = _cancel.tenant_id AND r.workspace_key = _cancel.workspace_key AND r.run_id = _cancel.run_id
        RETURNING r.cancel_action INTO v_result.cancel_action;
        PERFORM zeroth._notify_control(v_run.lease_worker_id);
        v_result.outcome := 'cancel_requested';
        v_result.status := 'running';
        v_result.retry_after_s := zeroth._retry_after(v_run.lease_expires_at, _cancel.grace, v_at);
        RETURN v_result;
    END IF;

    SELECT st.outcome, st.to_status, st.sqlstate INTO v_settle
      FROM zeroth._settle(_cancel.tenant_id, _cancel.workspace_key, v_run.lease_worker_id,
                          ARRAY[_cancel.run_id], ARRAY[v_run.lease_generation], ARRAY['revoke'],
                          NULL, NULL, ARRAY[_cancel.action], NULL, NULL,
                          ARRAY[v_run.ctid], v_slots, v_at) st;
    PERFORM zeroth._raise_unlisted_edge('request_cancel', _cancel.run_id, v_run.status, v_settle.sqlstate);
    v_result.outcome := CASE WHEN v_settle.outcome = 'takeover_cancelled' THEN 'taken_over' ELSE 'cancelled' END;
    v_result.status := v_settle.to_status;
    v_result.cancel_action := coalesce(v_run.cancel_action, _cancel.action);
    RETURN v_result;
END
$$;
COMMENT ON FUNCTION zeroth._cancel(text, text, uuid, text, interval, timestamptz, text, bigint) IS 'Internal: the cancel decision of request_cancel(_v2) and admit_run: cancelled | cancel_requested | taken_over | not_cancellable | unknown. The caller counts as the owner only with the live (worker id, generation).';
ALTER FUNCTION zeroth._cancel(text, text, uuid, text, interval, timestamptz, text, bigint) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._cancel(text, text, uuid, text, interval, timestamptz, text, bigint) FROM PUBLIC;
