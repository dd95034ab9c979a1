-- resume_schedule: admin (a DBA, as zeroth_owner): a paused schedule fires again; the fire times
-- that passed while it was paused are skipped (a pause is deliberate): next_fire_at becomes the
-- first fire time after now (and after last_fire_at). Clears last_error and marks it managed_by
-- 'sql' (register_schedule no longer changes it). A schedule that is not paused is left as it
-- is. Locks the row (waits at most 2 s for a firer: 55P03). Raises ZP006, ZP008, ZP009
-- schedule_not_found, 55P03. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.resume_schedule(
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
    v_old := zeroth._lock_schedule(resume_schedule.name, resume_schedule.tenant_id, resume_schedule.workspace_id);
    IF NOT v_old.paused THEN
        RETURN v_old;
    END IF;
    UPDATE zeroth.schedules AS s
       SET paused = false, managed_by = 'sql', updated_at = v_now, last_error = NULL, last_error_at = NULL,
           next_fire_at = zeroth._schedule_next(s.cron, s.interval_seconds, s.anchor_at, s.time_zone,
                                                greatest(v_now, s.anchor_at - interval '1 microsecond',
                                                         s.last_fire_at))
     WHERE s.schedule_id = v_old.schedule_id
    RETURNING s.* INTO v_row;
    RETURN v_row;
END
$$;
COMMENT ON FUNCTION zeroth.resume_schedule(text, text, text) IS
'resume_schedule: admin: a paused schedule fires again from the first fire time after now (those that passed while paused are skipped, not missed); clears last_error; marks it managed_by sql (register_schedule no longer changes it); a schedule that is not paused is left as it is. Locks the schedule row, waiting at most 2 s (lock_timeout) for a firer. Raises ZP006 invalid_scope, ZP008 invalid_argument, ZP009 schedule_not_found, 55P03 lock_not_available. Time: clock_timestamp().';
ALTER FUNCTION zeroth.resume_schedule(text, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.resume_schedule(text, text, text) FROM PUBLIC;
