-- pause_schedule: admin (a DBA, as zeroth_owner): a paused schedule never fires; its fire times
-- pass without a run until resume_schedule. Idempotent (pausing a paused schedule changes
-- nothing). Marks it managed_by 'sql' (a worker's register_schedule never unpauses it). Locks
-- the schedule row (waits at most 2 s for a firer holding it, then 55P03 lock_not_available;
-- once this returns, nothing fires it). Raises ZP006, ZP008, ZP009 schedule_not_found, 55P03. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.pause_schedule(
    name         text,
    tenant_id    text DEFAULT NULL,
    workspace_id text DEFAULT NULL)
    RETURNS zeroth.schedules
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    SET lock_timeout = '2s' AS $$
DECLARE
    v_now timestamptz := zeroth._now();
    v_old zeroth.schedules;
    v_row zeroth.schedules;
BEGIN
    v_old := zeroth._lock_schedule(pause_schedule.name, pause_schedule.tenant_id, pause_schedule.workspace_id);
    UPDATE zeroth.schedules AS s
       SET paused = true, managed_by = 'sql',
           updated_at = CASE WHEN s.paused THEN s.updated_at ELSE v_now END
     WHERE s.schedule_id = v_old.schedule_id
    RETURNING s.* INTO v_row;
    RETURN v_row;
END
$$;
COMMENT ON FUNCTION zeroth.pause_schedule(text, text, text) IS
'pause_schedule: admin: the schedule stops firing (its fire times pass without a run) until resume_schedule; idempotent. Marks it managed_by sql. Locks the schedule row, waiting at most 2 s (lock_timeout) for a firer that holds it. Raises ZP006 invalid_scope, ZP008 invalid_argument, ZP009 schedule_not_found, 55P03 lock_not_available. Time: clock_timestamp().';
ALTER FUNCTION zeroth.pause_schedule(text, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.pause_schedule(text, text, text) FROM PUBLIC;
