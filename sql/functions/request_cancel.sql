-- request_cancel: the 0002 contract, on the shared decision with no grace: a running run whose
-- lease expired is cancelled at once (reported as cancelled; the row also records the stop reason
-- taken_over). Returns cancelled | cancel_requested | not_cancellable | unknown. Locks: slots,
-- then run. Raises ZP003 (an edge a DBA removed from zeroth.run_transitions), ZP008. Notifies zeroth_control, zeroth_wakeup. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.request_cancel(
    run_id       uuid,
    tenant_id    text DEFAULT NULL,
    workspace_id text DEFAULT NULL,
    action       text DEFAULT 'cancel')
    RETURNS text
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_outcome text;
BEGIN
    SELECT c.outcome INTO v_outcome
      FROM zeroth.request_cancel_v2(run_id => request_cancel.run_id, tenant_id => request_cancel.tenant_id,
                                    workspace_id => request_cancel.workspace_id, action => request_cancel.action,
                                    grace_seconds => 0) AS c;
    RETURN CASE v_outcome WHEN 'taken_over' THEN 'cancelled' ELSE v_outcome END;
END
$$;
COMMENT ON FUNCTION zeroth.request_cancel(uuid, text, text, text) IS
'request_cancel: returns cancelled (pending, waiting, or running with an expired lease: terminal at once, lease cleared so the old holder''s fenced writes are refused) | cancel_requested (running with a live lease: durable flag, first action wins, NOTIFY zeroth_control to the owner''s key) | not_cancellable (terminal) | unknown (no such run in scope). request_cancel_v2 adds taken_over, a grace and retry_after_s. Raises ZP003 (an edge a DBA removed from zeroth.run_transitions), ZP008. Notifies zeroth_wakeup when an immediate cancel freed a slot. Time: clock_timestamp().';
ALTER FUNCTION zeroth.request_cancel(uuid, text, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.request_cancel(uuid, text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.request_cancel(uuid, text, text, text) TO zeroth_worker;
