-- wait_for_event: the live holder waits for the event `name` of its scope, as step `step_key`.
-- Locks the slot, the run row, then the event's row (created as a channel when missing), so an
-- emit_event can never slip between the check and the wait. Recorded step → its outcome; event
-- emitted (before the wait's deadline) → recorded as the step result, outcome received; deadline
-- passed → outcome timed_out, recorded; else running → waiting (wait_reason 'event:' || name), the
-- lease, slot and attempt given back as pause_run does (a pending cancel request → cancelled).
-- Returns one row (outcome received | timed_out | waiting | cancelled, payload, timeout_at);
-- outcome NULL when fenced out. Raises ZP003, ZP006, ZP008 (also: step_key holds another step's
-- result). Going to waiting writes the event's row (see below). Notifies zeroth_wakeup when a slot was freed. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.wait_for_event(
    run_id          uuid,
    worker_id       text,
    generation      bigint,
    step_key        text,
    name            text,
    timeout_seconds double precision DEFAULT NULL,
    tenant_id       text             DEFAULT NULL,
    workspace_id    text             DEFAULT NULL)
    RETURNS TABLE (outcome text, payload jsonb, timeout_at timestamptz)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_lock    record;
    v_now     timestamptz := zeroth._now();
    v_tenant  text := zeroth._scope_tenant(wait_for_event.tenant_id, wait_for_event.workspace_id);
    v_wskey   text := zeroth._workspace_key(wait_for_event.workspace_id);
    v_max     constant interval := interval '366 days';
    v_attempt integer;
    v_step    jsonb;
    v_event   record;
    v_wait    record;
    v_timeout timestamptz;
    v_left    zeroth.run_status;
BEGIN
    IF v_tenant IS NULL THEN
        RAISE EXCEPTION 'a workspace_id needs a tenant_id' USING ERRCODE = 'ZP006';
    END IF;
    PERFORM zeroth._require_step_key(wait_for_event.step_key);
    PERFORM zeroth._require_step_key_fits(v_tenant, v_wskey, wait_for_event.step_key);
    PERFORM zeroth._require_identifier(wait_for_event.name, 'name');
    PERFORM zeroth._require(wait_for_event.timeout_seconds IS NULL
                            OR (wait_for_event.timeout_seconds <> 'NaN'::float8
                                AND wait_for_event.timeout_seconds >= 0
                                AND wait_for_event.timeout_seconds <= extract(epoch FROM v_max)),
                            format('timeout_seconds must be NULL (no timeout) or in [0, %s], got %s',
                                   extract(epoch FROM v_max), wait_for_event.timeout_seconds));

    -- The settle path's checks and lock (sql/functions/internal/settle.sql): the slot, then the
    -- run row, then the clock.
    PERFORM zeroth._require_fence(wait_for_event.run_id, wait_for_event.worker_id, wait_for_event.generation);
    v_lock := zeroth._lock_settle(v_tenant, v_wskey, wait_for_event.worker_id, ARRAY[wait_for_event.run_id],
                                  ARRAY[wait_for_event.generation]);
    v_now := zeroth._now();
    v_attempt := zeroth._step_holder_attempt(v_tenant, v_wskey, wait_for_event.run_id, wait_for_event.worker_id,
                                             wait_for_event.generation, v_now);
    IF cardinality(v_lock.run_rows) = 0 OR v_attempt IS NULL THEN
        PERFORM zeroth._explain_fenced_miss(v_tenant, v_wskey, wait_for_event.run_id, wait_for_event.worker_id,
                                            wait_for_event.generation, v_now, 'wait_for_event', '{running}');
        RETURN NEXT;  -- one row, outcome NULL: fenced out
        RETURN;
    END IF;

    -- Replayed: the wait's result was recorded by an earlier attempt.
    SELECT s.result INTO v_step FROM zeroth.run_steps s
     WHERE s.tenant_id = v_tenant AND s.workspace_key = v_wskey AND s.run_id = wait_for_event.run_id
       AND s.step_key = wait_for_event.step_key;
    IF FOUND THEN
        -- Only a wait for this very event may answer: a step key holding another step's result
        -- (record_step's, or a wait for another name) would be replayed as this wait's outcome
        -- (another event's payload, or outcome NULL, which says "fenced out").
        IF v_step->>'event' IS DISTINCT FROM wait_for_event.name
           OR coalesce(v_step->>'outcome', '') NOT IN ('received', 'timed_out') THEN
            RAISE EXCEPTION 'step % of run % holds the result of another step, not of a wait for event %',
                quote_literal(wait_for_event.step_key), wait_for_event.run_id, quote_literal(wait_for_event.name)
                USING ERRCODE = 'ZP008';
        END IF;
        outcome := v_step->>'outcome';
        payload := v_step->'payload';
        RETURN NEXT;
        RETURN;
    END IF;

    -- The event's row, locked: an emit_event of this name waits for this call, or this call for it.
    -- A prune_runs that held the row and deleted it (an old event nobody waited on) leaves nothing
    -- to lock once it commits: the row is written again, as a channel (an emit after a prune is a
    -- new event). Bounded: a row pruned again at every try is a 40001 to retry, never a loop.
    FOR v_try IN 1 .. 5 LOOP
        INSERT INTO zeroth.events AS e (tenant_id, workspace_key, name, payload, emitted_at, created_at)
        VALUES (v_tenant, v_wskey, wait_for_event.name, NULL, NULL, v_now)
        ON CONFLICT ON CONSTRAINT events_pkey DO NOTHING;
        SELECT e.payload, e.emitted_at INTO v_event FROM zeroth.events e
         WHERE e.tenant_id = v_tenant AND e.workspace_key = v_wskey AND e.name = wait_for_event.name
           FOR UPDATE;
        EXIT WHEN FOUND;
        IF v_try = 5 THEN
            RAISE EXCEPTION 'the row of event % was deleted under this wait five times', quote_literal(wait_for_event.name)
                USING ERRCODE = '40001';
        END IF;
    END LOOP;

    -- The deadline is set by the first wait of this step and kept by every replay.
    SELECT w.name, w.timeout_at INTO v_wait FROM zeroth.event_waits w
     WHERE w.tenant_id = v_tenant AND w.workspace_key = v_wskey AND w.run_id = wait_for_event.run_id
       AND w.step_key = wait_for_event.step_key;
    IF FOUND AND v_wait.name = wait_for_event.name THEN
        v_timeout := v_wait.timeout_at;
    ELSE
        v_timeout := v_now + make_interval(secs => wait_for_event.timeout_seconds);
    END IF;
    timeout_at := v_timeout;

    IF v_event.emitted_at IS NOT NULL AND (v_timeout IS NULL OR v_event.emitted_at <= v_timeout) THEN
        outcome := 'received';
        payload := v_event.payload;
    ELSIF v_timeout IS NOT NULL AND v_timeout <= v_now THEN
        outcome := 'timed_out';
        payload := NULL;
    END IF;
    IF outcome IS NOT NULL THEN
        INSERT INTO zeroth.run_steps (tenant_id, workspace_key, run_id, step_key, result,
                                      lease_generation, attempt, recorded_at)
        VALUES (v_tenant, v_wskey, wait_for_event.run_id, wait_for_event.step_key,
                jsonb_build_object('outcome', outcome, 'event', wait_for_event.name, 'payload', payload),
                wait_for_event.generation, v_attempt, v_now);
        DELETE FROM zeroth.event_waits w
         WHERE w.tenant_id = v_tenant AND w.workspace_key = v_wskey AND w.run_id = wait_for_event.run_id
           AND w.step_key = wait_for_event.step_key;
        RETURN NEXT;
        RETURN;
    END IF;

    -- Not there yet: the run leaves its worker. A pending cancel request wins (as in sleep_run).
    v_left := zeroth._leave_for_wait(v_tenant, v_wskey, wait_for_event.run_id, wait_for_event.worker_id,
                                     wait_for_event.generation, 'event:' || wait_for_event.name, v_now);
    IF v_left = 'waiting' THEN
        -- A new version of the event's row, not only its lock: an emit_event whose snapshot is
        -- older than this wait (an application's REPEATABLE READ or SERIALIZABLE transaction)
        -- sees neither the wait row nor the run as waiting, so it would record the event and
        -- wake nothing, and no later emit could (first write wins). Updating the row makes that
        -- emit fail with 40001 instead (its ON CONFLICT finds a version its snapshot cannot
        -- see), and its retry wakes the run. A HOT update (no indexed column changes).
        UPDATE zeroth.events e SET created_at = e.created_at
         WHERE e.tenant_id = v_tenant AND e.workspace_key = v_wskey AND e.name = wait_for_event.name;
        INSERT INTO zeroth.event_waits AS w (tenant_id, workspace_key, run_id, step_key, name, timeout_at, created_at)
        VALUES (v_tenant, v_wskey, wait_for_event.run_id, wait_for_event.step_key, wait_for_event.name,
                v_timeout, v_now)
        ON CONFLICT ON CONSTRAINT event_waits_pkey DO UPDATE
           SET name = excluded.name, timeout_at = excluded.timeout_at, created_at = excluded.created_at;
        outcome := 'waiting';
    ELSIF v_left = 'cancelled' THEN  -- NULL: fenced out (outcome NULL), never 'cancelled'
        outcome := 'cancelled';
    END IF;
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION zeroth.wait_for_event(uuid, text, bigint, text, text, double precision, text, text) IS
'wait_for_event: for the live lease (worker_id, generation), wait for the event name of the run''s scope as step step_key. Recorded step → its outcome; event emitted by the deadline → recorded, received; deadline passed → recorded, timed_out; else running → waiting (wait_reason event:name; lease, slot and attempt given back; a pending cancel request → cancelled) until emit_event or wake_due_waits makes it pending. The deadline (database clock + timeout_seconds, at most 366 days) is set by the first wait of the step and kept on replay. Returns one row (outcome received | timed_out | waiting | cancelled, payload, timeout_at); outcome NULL when fenced out. Raises ZP003 (holder but not running), ZP006, ZP008 (also: step_key holds the result of another step or of a wait for another name). Going to waiting writes the event''s row, so an emit_event from an older snapshot (REPEATABLE READ, SERIALIZABLE) fails with 40001 instead of waking nothing. Notifies zeroth_wakeup when a slot was freed. Time: clock_timestamp().';
ALTER FUNCTION zeroth.wait_for_event(uuid, text, bigint, text, text, double precision, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.wait_for_event(uuid, text, bigint, text, text, double precision, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.wait_for_event(uuid, text, bigint, text, text, double precision, text, text) TO zeroth_worker;
