-- request_cancel_v2: the cancel with five outcomes. cancelled (pending, waiting or queued: at
-- once; a claimed holder is fenced out) | cancel_requested (running, owner's lease + grace not run
-- out: durable flag, first action wins, NOTIFY zeroth_control to the owner's key; retry_after_s
-- says when a retry could take over) | taken_over (running past lease + grace: cancelled here, stop
-- reason recorded, the owner fenced out) | not_cancellable (terminal) | unknown. Locks: slots,
-- then run. Raises ZP003 (an edge a DBA removed from zeroth.run_transitions), ZP008. Notifies zeroth_control, zeroth_wakeup. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.request_cancel_v2(
    run_id        uuid,
    tenant_id     text             DEFAULT NULL,
    workspace_id  text             DEFAULT NULL,
    action        text             DEFAULT 'cancel',
    grace_seconds double precision DEFAULT 10)
    RETURNS zeroth.cancel_result
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now   timestamptz := zeroth._now();
    v_grace interval := zeroth._grace_interval(request_cancel_v2.grace_seconds);
BEGIN
    PERFORM zeroth._require(request_cancel_v2.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require(request_cancel_v2.action IN ('cancel', 'interrupt', 'rollback'),
                            'action must be cancel, interrupt or rollback');
    RETURN zeroth._cancel(zeroth._scope_tenant(request_cancel_v2.tenant_id, request_cancel_v2.workspace_id),
                          zeroth._workspace_key(request_cancel_v2.workspace_id), request_cancel_v2.run_id,
                          request_cancel_v2.action, v_grace, v_now);
END
$$;
COMMENT ON FUNCTION zeroth.request_cancel_v2(uuid, text, text, text, double precision) IS
'request_cancel_v2: cancelled (pending/waiting/queued, at once) | cancel_requested (running, owner''s lease + grace not run out: durable flag, first action wins, NOTIFY zeroth_control with the owner''s key, retry_after_s) | taken_over (running past lease + grace: cancelled with a stop reason, owner fenced out) | not_cancellable | unknown. Raises ZP003 (an edge a DBA removed from zeroth.run_transitions), ZP008. Notifies zeroth_control, zeroth_wakeup. Time: clock_timestamp().';
ALTER FUNCTION zeroth.request_cancel_v2(uuid, text, text, text, double precision) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.request_cancel_v2(uuid, text, text, text, double precision) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.request_cancel_v2(uuid, text, text, text, double precision) TO zeroth_worker;
