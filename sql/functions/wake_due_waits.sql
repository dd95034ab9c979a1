-- wake_due_waits: the sweep of runs nobody holds, run by every RunWorker's orphan sweep. First the
-- runs past their run deadline (issue 34 item 2) that are waiting (paused, or waiting for an event
-- or its children) or pending (sleeping, in backoff, or due) with no live lease → failed
-- (stop_reason run_timeout), each through the settle path (zeroth._end_past_run_deadline: edge
-- run_timed_out, an END for a run with events) in a subtransaction of its own (one whose end
-- raises is left as it was with a WARNING; the others are ended); then the event waits whose
-- deadline passed → their runs pending, due now (the replayed wait_for_event then records the
-- timeout); then parents still waiting for children whose wait was met while their row was locked
-- (the wake-up a child's end had to skip, marked in child_waits.met_at: internal/children.sql).
-- Across every scope of the deployments (NULL: every deployment), like claim_orphaned_scopes.
-- Locks: the run rows FOR UPDATE SKIP LOCKED, at most batch_size ended and woken a call; runs
-- under lock_timeout 2 s: a run whose end waits longer for a lock (a row someone holds in an open
-- transaction) is left as it was, with a WARNING, for the next pass, and the others are ended. Returns the number ended and woken (loop until below batch_size). Raises ZP008. Notifies
-- zeroth_wakeup per woken scope (and for a slot an end freed); an ended run's END reaches its
-- stream's subscribers through the settle path. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.wake_due_waits(
    deployment_refs text[]  DEFAULT NULL,
    batch_size      integer DEFAULT 100)
    RETURNS integer
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    -- A run deadline's end goes through the settle path and its triggers, which may wait for a row
    -- (a child's child_runs row its parent's wait_for_children holds in a transaction left open):
    -- at most 2 s, then that run is left for the next pass (zeroth._end_past_run_deadline_isolated)
    -- and the others are ended, as the orphan sweeps do.
    SET lock_timeout = '2s' AS $$
DECLARE
    v_now   timestamptz := zeroth._now();
    v_run   record;
    v_woken integer := 0;
BEGIN
    PERFORM zeroth._require(wake_due_waits.batch_size BETWEEN 1 AND 1000,
                            format('batch_size must be in [1, 1000], got %s', wake_due_waits.batch_size));
    PERFORM zeroth._require(wake_due_waits.deployment_refs IS NULL
                            OR (cardinality(wake_due_waits.deployment_refs) BETWEEN 1 AND 1000
                                AND array_position(wake_due_waits.deployment_refs, NULL) IS NULL),
                            'deployment_refs must be NULL or 1-1000 names without NULL');

    -- The runs past their run deadline (runs_run_deadline_idx: only pending and waiting runs
    -- that have one), read without a lock, then each locked SKIP LOCKED, re-checked and ended
    -- alone. A run whose end raised stays in the scan (left as it was) and is passed over: the
    -- scan goes on to the next until batch_size were ended, so no number of bad runs stops the
    -- others' ends.
    FOR v_run IN
        SELECT r.tenant_id, r.workspace_key, r.run_id
          FROM zeroth.runs r
         WHERE r.run_deadline_at <= v_now
           AND r.run_deadline_at IS NOT NULL
           AND r.status IN ('pending', 'waiting')
           AND (wake_due_waits.deployment_refs IS NULL OR r.deployment_ref = ANY (wake_due_waits.deployment_refs))
         ORDER BY r.run_deadline_at
    LOOP
        IF zeroth._end_past_run_deadline_isolated(v_run.tenant_id, v_run.workspace_key, v_run.run_id, v_now) THEN
            v_woken := v_woken + 1;
            EXIT WHEN v_woken >= wake_due_waits.batch_size;
        END IF;
    END LOOP;
    IF v_woken >= wake_due_waits.batch_size THEN
        RETURN v_woken;
    END IF;

    FOR v_run IN
        WITH due AS (
            SELECT r.tenant_id, r.workspace_key, r.run_id
              FROM zeroth.event_waits w
              JOIN zeroth.runs r
                ON r.tenant_id = w.tenant_id AND r.workspace_key = w.workspace_key AND r.run_id = w.run_id
             WHERE w.timeout_at <= v_now
               AND r.status = 'waiting'
               AND r.wait_reason = 'event:' || w.name
               AND r.thread_queued_at IS NULL
               AND (wake_due_waits.deployment_refs IS NULL OR r.deployment_ref = ANY (wake_due_waits.deployment_refs))
             ORDER BY w.timeout_at
             LIMIT wake_due_waits.batch_size - v_woken
               FOR UPDATE OF r SKIP LOCKED)
        UPDATE zeroth.runs r
           SET status = 'pending', wait_reason = NULL, run_after = v_now, updated_at = v_now
          FROM due
         WHERE r.tenant_id = due.tenant_id AND r.workspace_key = due.workspace_key AND r.run_id = due.run_id
           AND r.status = 'waiting'
        RETURNING r.deployment_ref, r.tenant_id, r.workspace_id
    LOOP
        v_woken := v_woken + 1;
        PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_run.tenant_id, v_run.workspace_id);
    END LOOP;
    IF v_woken >= wake_due_waits.batch_size THEN
        RETURN v_woken;
    END IF;

    -- Parents whose children's wait is met but which are still waiting: a child's end takes the
    -- parent's row SKIP LOCKED (internal/children.sql, lock order) and, when it could not wake
    -- it, marks the wait (met_at): only those are visited (partial index child_waits_met).
    FOR v_run IN
        WITH due AS (
            SELECT r.tenant_id, r.workspace_key, r.run_id
              FROM zeroth.child_waits w
              JOIN zeroth.runs r
                ON r.tenant_id = w.tenant_id AND r.workspace_key = w.workspace_key AND r.run_id = w.parent_run_id
             WHERE w.met_at IS NOT NULL
               AND r.status = 'waiting'
               AND r.wait_reason = 'children:' || w.step_key
               AND r.thread_queued_at IS NULL
               AND (wake_due_waits.deployment_refs IS NULL OR r.deployment_ref = ANY (wake_due_waits.deployment_refs))
             LIMIT wake_due_waits.batch_size - v_woken
               FOR UPDATE OF r SKIP LOCKED)
        UPDATE zeroth.runs r
           SET status = 'pending', wait_reason = NULL, run_after = v_now, updated_at = v_now
          FROM due
         WHERE r.tenant_id = due.tenant_id AND r.workspace_key = due.workspace_key AND r.run_id = due.run_id
           AND r.status = 'waiting'
        RETURNING r.deployment_ref, r.tenant_id, r.workspace_id
    LOOP
        v_woken := v_woken + 1;
        PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_run.tenant_id, v_run.workspace_id);
    END LOOP;
    RETURN v_woken;
END
$$;
COMMENT ON FUNCTION zeroth.wake_due_waits(text[], integer) IS
'wake_due_waits: the sweep of runs nobody holds. First the pending (due or not: sleeping, in backoff) and waiting (paused, or waiting for an event or its children) runs with no live lease past their run deadline → failed, stop_reason run_timeout (issue 34; through the settle path, each alone: one whose end raises is left as it was with a WARNING); then runs waiting on an event past their wait''s deadline → pending, due now (the replayed wait_for_event records timed_out), then parents waiting for children whose wait was met while their row was locked (wait_for_children; the wake-up a child''s end skipped, marked in child_waits.met_at), in every scope of the deployments (NULL: all); run rows FOR UPDATE SKIP LOCKED, at most batch_size (1-1000) ended and woken. Runs under lock_timeout 2 s: a run whose end waits longer for a lock (a row someone holds in an open transaction) is left as it was, with a WARNING, for the next pass, and the others are ended. Returns the number ended and woken. Raises ZP008. Notifies zeroth_wakeup per woken scope (and for a slot an end freed). Time: clock_timestamp().';
ALTER FUNCTION zeroth.wake_due_waits(text[], integer) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.wake_due_waits(text[], integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.wake_due_waits(text[], integer) TO zeroth_worker;
