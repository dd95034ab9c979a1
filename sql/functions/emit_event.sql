-- emit_event: the event `name` of a scope happened, with `payload`. Idempotent, first write wins:
-- the event's row is written once (INSERT … ON CONFLICT on its key, locked, so a concurrent
-- wait_for_event either sees it or is seen); a repeat changes nothing. The first emit makes every
-- run of this scope waiting on the name (wait_reason 'event:' || name) pending, due now. Returns
-- one row (emitted: false for a repeat, woken: runs made pending). Raises ZP006, ZP008; from a
-- REPEATABLE READ or SERIALIZABLE transaction also 40001 when a wait on the name committed after
-- its snapshot (retry it: the retry wakes that run; wait_for_event writes the event's row for this).
-- Notifies zeroth_wakeup per woken scope and deployment. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.emit_event(
    name         text,
    payload      jsonb DEFAULT 'null'::jsonb,
    tenant_id    text  DEFAULT NULL,
    workspace_id text  DEFAULT NULL)
    RETURNS TABLE (emitted boolean, woken integer)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now    timestamptz := zeroth._now();
    v_tenant text := zeroth._scope_tenant(emit_event.tenant_id, emit_event.workspace_id);
    v_wskey  text := zeroth._workspace_key(emit_event.workspace_id);
    v_run    record;
BEGIN
    IF v_tenant IS NULL THEN
        RAISE EXCEPTION 'a workspace_id needs a tenant_id' USING ERRCODE = 'ZP006';
    END IF;
    PERFORM zeroth._require_identifier(emit_event.name, 'name');
    PERFORM zeroth._require(emit_event.payload IS NOT NULL, 'payload must not be NULL (JSON null is ''null''::jsonb)');

    INSERT INTO zeroth.events AS e (tenant_id, workspace_key, name, payload, emitted_at, created_at)
    VALUES (v_tenant, v_wskey, emit_event.name, emit_event.payload, v_now, v_now)
    ON CONFLICT ON CONSTRAINT events_pkey DO UPDATE
       SET payload = excluded.payload, emitted_at = excluded.emitted_at
     WHERE e.emitted_at IS NULL;
    emitted := FOUND;
    woken := 0;
    IF NOT emitted THEN
        RETURN NEXT;  -- emitted before: first write wins, nothing to wake
        RETURN;
    END IF;

    FOR v_run IN
        UPDATE zeroth.runs r
           SET status = 'pending', wait_reason = NULL, run_after = v_now, updated_at = v_now
          FROM zeroth.event_waits w
         WHERE w.tenant_id = v_tenant
           AND w.workspace_key = v_wskey
           AND w.name = emit_event.name
           AND r.tenant_id = w.tenant_id
           AND r.workspace_key = w.workspace_key
           AND r.run_id = w.run_id
           AND r.status = 'waiting'
           AND r.wait_reason = 'event:' || emit_event.name
           AND r.thread_queued_at IS NULL
        RETURNING r.deployment_ref, r.workspace_id
    LOOP
        woken := woken + 1;
        -- Identical payloads fold within the transaction: one NOTIFY per scope and deployment.
        PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_tenant, v_run.workspace_id);
    END LOOP;
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION zeroth.emit_event(text, jsonb, text, text) IS
'emit_event: record the event name of a scope with payload, once (idempotent, first write wins; a repeat returns emitted = false and changes nothing), and make every run of the scope waiting on it (wait_for_event) pending, due now; the payload becomes that wait''s recorded step result when the run replays. Callable from psql. Returns one row (emitted, woken). Raises ZP006 (workspace without tenant), ZP008; from a REPEATABLE READ or SERIALIZABLE transaction 40001 when a wait on the name committed after its snapshot (retry: the retry wakes it). Notifies zeroth_wakeup for each woken scope and deployment. Time: clock_timestamp().';
ALTER FUNCTION zeroth.emit_event(text, jsonb, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.emit_event(text, jsonb, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.emit_event(text, jsonb, text, text) TO zeroth_worker;
