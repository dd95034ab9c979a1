-- fire_schedule_now: admin (a DBA, as zeroth_owner): one run of the schedule `name`, now, beside
-- its regular fire times (an operator's "run it now"). The run is enqueued as a fire is (the
-- schedule's deployment, payload, priority, max_attempts; runs.schedule_id; metadata
-- zeroth_schedule with manual true; zeroth._enqueue_schedule_run). idempotency_key (issue 31):
-- the caller's key of this request (a dashboard form, a CLI command); the run is keyed
-- zeroth-schedule:<id>:manual:key:<idempotency_key>, so a repeat (a double click, a retried POST)
-- returns the run the first call made (created false) instead of a second one. Without a key the
-- run is keyed zeroth-schedule:<id>:manual:<now>: each call is its own run. The schedule's cadence
-- is left alone: next_fire_at, last_fire_at (the high-water mark), fire_count, paused and
-- schedule_fires do not change, so no regular fire is skipped or repeated; a paused schedule can be
-- fired by hand. Locks the schedule row (at most 2 s: 55P03), which also makes two calls with one
-- key wait for each other. Raises ZP006, ZP008 (a key empty, over 200 characters or holding a
-- control character), ZP009, ZP011 (the key's run is not this schedule's), 55P03. Notifies
-- zeroth_wakeup (via _enqueue_run). Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.fire_schedule_now(
    name            text,
    tenant_id       text DEFAULT NULL,
    workspace_id    text DEFAULT NULL,
    idempotency_key text DEFAULT NULL)
    RETURNS zeroth.schedule_fire
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    SET lock_timeout = '2s' AS $$
DECLARE
    v_now timestamptz := zeroth._now();
    v_s   zeroth.schedules;
    v_enq zeroth.enqueued_run;
BEGIN
    IF fire_schedule_now.idempotency_key IS NOT NULL THEN
        PERFORM zeroth._require_identifier(fire_schedule_now.idempotency_key, 'idempotency_key');
        PERFORM zeroth._require(fire_schedule_now.idempotency_key !~ '[[:cntrl:]]',
                                'idempotency_key may not hold a control character');
    END IF;
    v_s := zeroth._lock_schedule(fire_schedule_now.name, fire_schedule_now.tenant_id,
                                 fire_schedule_now.workspace_id);
    v_enq := zeroth._enqueue_schedule_run(
        v_s,
        CASE WHEN fire_schedule_now.idempotency_key IS NULL
             THEN 'manual:' || to_char(v_now AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
             ELSE 'manual:key:' || fire_schedule_now.idempotency_key END,
        v_now, true);
    IF NOT v_enq.created AND NOT EXISTS (SELECT 1 FROM zeroth.runs r
                                          WHERE r.tenant_id = v_s.tenant_id
                                            AND r.workspace_key = v_s.workspace_key
                                            AND r.run_id = v_enq.run_id
                                            AND r.schedule_id = v_s.schedule_id) THEN
        -- A run planted under the key (before 0018 reserved the prefix): not this schedule's.
        RAISE EXCEPTION 'the idempotency key of this fire is held by run %, which this schedule did not make',
            v_enq.run_id USING ERRCODE = 'ZP011';
    END IF;
    RETURN ROW(v_s.schedule_id, v_s.tenant_id, v_s.workspace_id, v_s.name, v_s.deployment_ref, v_now,
               v_enq.run_id, v_enq.created, 0, v_s.next_fire_at)::zeroth.schedule_fire;
END
$$;
COMMENT ON FUNCTION zeroth.fire_schedule_now(text, text, text, text) IS
'fire_schedule_now: admin: one run of the schedule now, beside its regular fire times (the schedule''s deployment, payload, priority, max_attempts; runs.schedule_id; metadata zeroth_schedule with manual true). idempotency_key: the caller''s key of this request; the run is keyed zeroth-schedule:<id>:manual:key:<idempotency_key>, so a repeat (a double click, a retried POST) returns the first call''s run with created false; without one the run is keyed zeroth-schedule:<id>:manual:<now> and each call is its own run. Its cadence is unchanged: next_fire_at, last_fire_at, fire_count, paused and schedule_fires stay as they were; a paused schedule may be fired by hand. Locks the schedule row, waiting at most 2 s (lock_timeout). Granted to nobody: a member of zeroth_owner runs it. Returns the fire (fire_at: now; next_due_at: the schedule''s next_fire_at). Raises ZP006 invalid_scope, ZP008 invalid_argument (a key empty, over 200 characters or holding a control character), ZP009 schedule_not_found, ZP011 reserved_key (the key''s run is not this schedule''s), 55P03 lock_not_available. Notifies zeroth_wakeup (as enqueue_run). Time: clock_timestamp().';
ALTER FUNCTION zeroth.fire_schedule_now(text, text, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.fire_schedule_now(text, text, text, text) FROM PUBLIC;
