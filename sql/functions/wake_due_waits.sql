-- wake_due_waits: the event waits whose deadline passed → their runs pending, due now (the
-- replayed wait_for_event then records the timeout); then parents still waiting for children whose
-- wait was met while their row was locked (the wake-up a child's end had to skip, marked in
-- child_waits.met_at: internal/children.sql). Across every scope of the deployments (NULL:
-- every deployment), like claim_orphaned_scopes; run by the worker's orphan sweep. Locks: the run
-- rows FOR UPDATE SKIP LOCKED (never waits), at most batch_size a call. Returns the number woken
-- (loop until below batch_size). Raises ZP008. Notifies zeroth_wakeup per woken scope. Time:
-- clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.wake_due_waits(
    deployment_refs text[]  DEFAULT NULL,
    batch_size      integer DEFAULT 100)
    RETURNS integer
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
             LIMIT wake_due_waits.batch_size
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
'wake_due_waits: runs waiting on an event past their wait''s deadline → pending, due now (the replayed wait_for_event records timed_out), then parents waiting for children whose wait was met while their row was locked (wait_for_children; the wake-up a child''s end skipped, marked in child_waits.met_at), in every scope of the deployments (NULL: all); run rows FOR UPDATE SKIP LOCKED, at most batch_size (1-1000). Returns the number woken. Raises ZP008. Notifies zeroth_wakeup per woken scope. Time: clock_timestamp().';
ALTER FUNCTION zeroth.wake_due_waits(text[], integer) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.wake_due_waits(text[], integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.wake_due_waits(text[], integer) TO zeroth_worker;
