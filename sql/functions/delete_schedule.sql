-- delete_schedule: admin (a DBA, as zeroth_owner): the schedule and its fire records go; the runs
-- it already enqueued stay (they are runs like any other). Locks the schedule row (waits at most
-- 2 s for a firer holding it: 55P03). Returns the deleted schedule's id. Raises ZP006, ZP008,
-- ZP009 schedule_not_found, 55P03. Notifies nothing. Time: none (no decision depends on the clock).
CREATE OR REPLACE FUNCTION zeroth.delete_schedule(
    name         text,
    tenant_id    text DEFAULT NULL,
    workspace_id text DEFAULT NULL)
    RETURNS uuid
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    SET lock_timeout = '2s' AS $$
DECLARE
    v_old zeroth.schedules;
BEGIN
    v_old := zeroth._lock_schedule(delete_schedule.name, delete_schedule.tenant_id, delete_schedule.workspace_id);
    DELETE FROM zeroth.schedules s WHERE s.schedule_id = v_old.schedule_id;
    RETURN v_old.schedule_id;
END
$$;
COMMENT ON FUNCTION zeroth.delete_schedule(text, text, text) IS
'delete_schedule: admin: delete a schedule and its fire records (its runs stay); returns its id. Locks the schedule row, waiting at most 2 s (lock_timeout) for a firer. Raises ZP006 invalid_scope, ZP008 invalid_argument, ZP009 schedule_not_found, 55P03 lock_not_available. Time: none.';
ALTER FUNCTION zeroth.delete_schedule(text, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.delete_schedule(text, text, text) FROM PUBLIC;
