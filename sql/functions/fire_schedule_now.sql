-- fire_schedule_now: admin (a DBA, as zeroth_owner): one run of the schedule `name`, now, beside
-- its regular fire times (an operator's "run it now"). The run is enqueued as a fire is (the
-- schedule's deployment, payload, priority, max_attempts; runs.schedule_id; metadata
-- zeroth_schedule with manual true), keyed zeroth-schedule:<id>:manual:<now>. The schedule's
-- cadence is left alone: next_fire_at, last_fire_at (the high-water mark), fire_count, paused and
-- schedule_fires do not change, so no regular fire is skipped or repeated; a paused schedule can be
-- fired by hand. Locks the schedule row (at most 2 s: 55P03). Raises ZP006, ZP008, ZP009, 55P03.
-- Notifies zeroth_wakeup (via _enqueue_run). Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.fire_schedule_now(
    name         text,
    tenant_id    text DEFAULT NULL,
    workspace_id text DEFAULT NULL)
    RETURNS zeroth.schedule_fire
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    SET lock_timeout = '2s' AS $$
DECLARE
    v_now timestamptz := zeroth._now();
    v_s   zeroth.schedules;
    v_enq zeroth.enqueued_run;
BEGIN
    v_s := zeroth._lock_schedule(fire_schedule_now.name, fire_schedule_now.tenant_id,
                                 fire_schedule_now.workspace_id);
    v_enq := zeroth._enqueue_run(
        deployment_ref  => v_s.deployment_ref,
        payload         => v_s.payload,
        tenant_id       => v_s.tenant_id,
        workspace_id    => v_s.workspace_id,
        priority        => v_s.priority,
        max_attempts    => v_s.max_attempts,
        idempotency_key => 'zeroth-schedule:' || v_s.schedule_id::text || ':manual:'
                           || to_char(v_now AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        metadata        => v_s.metadata || jsonb_build_object('zeroth_schedule', jsonb_build_object(
                               'name', v_s.name, 'schedule_id', v_s.schedule_id, 'fire_at', v_now,
                               'manual', true)),
        schedule_id     => v_s.schedule_id);
    RETURN ROW(v_s.schedule_id, v_s.tenant_id, v_s.workspace_id, v_s.name, v_s.deployment_ref, v_now,
               v_enq.run_id, v_enq.created, 0, v_s.next_fire_at)::zeroth.schedule_fire;
END
$$;
COMMENT ON FUNCTION zeroth.fire_schedule_now(text, text, text) IS
'fire_schedule_now: admin: one run of the schedule now, beside its regular fire times (the schedule''s deployment, payload, priority, max_attempts; runs.schedule_id; metadata zeroth_schedule with manual true; idempotency key zeroth-schedule:<id>:manual:<now>). Its cadence is unchanged: next_fire_at, last_fire_at, fire_count, paused and schedule_fires stay as they were; a paused schedule may be fired by hand. Locks the schedule row, waiting at most 2 s (lock_timeout). Granted to nobody: a member of zeroth_owner runs it. Returns the fire (fire_at: now; next_due_at: the schedule''s next_fire_at). Raises ZP006 invalid_scope, ZP008 invalid_argument, ZP009 schedule_not_found, 55P03 lock_not_available. Notifies zeroth_wakeup (as enqueue_run). Time: clock_timestamp().';
ALTER FUNCTION zeroth.fire_schedule_now(text, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.fire_schedule_now(text, text, text) FROM PUBLIC;
