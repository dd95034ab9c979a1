-- alter_schedule: admin (a DBA, as zeroth_owner): change a schedule; every argument left NULL
-- keeps its value. A cron replaces an interval and an interval a cron. A change of timing (cron,
-- interval_seconds, time_zone, start_at) sets next_fire_at to the first fire time after now of
-- the new timing. Marks the schedule managed_by 'sql', so no register_schedule (a worker's start)
-- changes it back. Clears last_error. Locks the row (waits at most 2 s for a firer: 55P03).
-- Raises ZP006, ZP008, ZP009 schedule_not_found, 55P03. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.alter_schedule(
    name                  text,
    tenant_id             text        DEFAULT NULL,
    workspace_id          text        DEFAULT NULL,
    deployment_ref        text        DEFAULT NULL,
    cron                  text        DEFAULT NULL,
    interval_seconds      integer     DEFAULT NULL,
    time_zone             text        DEFAULT NULL,
    payload               jsonb       DEFAULT NULL,
    metadata              jsonb       DEFAULT NULL,
    priority              integer     DEFAULT NULL,
    max_attempts          integer     DEFAULT NULL,
    missed_fire_policy    text        DEFAULT NULL,
    catch_up_limit        integer     DEFAULT NULL,
    misfire_grace_seconds integer     DEFAULT NULL,
    start_at              timestamptz DEFAULT NULL)
    RETURNS zeroth.schedules
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    SET lock_timeout = '2s' AS $$
DECLARE
    v_now    timestamptz := zeroth._now();
    v_old    zeroth.schedules;
    v_new    zeroth.schedules;
    v_row    zeroth.schedules;
BEGIN
    PERFORM zeroth._require(alter_schedule.cron IS NULL OR alter_schedule.interval_seconds IS NULL,
                            'a schedule needs exactly one of cron and interval_seconds');
    PERFORM zeroth._require(alter_schedule.start_at IS NULL OR isfinite(alter_schedule.start_at),
                            'start_at must be a finite timestamp');
    v_old := zeroth._lock_schedule(alter_schedule.name, alter_schedule.tenant_id, alter_schedule.workspace_id);
    v_new := v_old;
    v_new.deployment_ref := coalesce(alter_schedule.deployment_ref, v_old.deployment_ref);
    IF alter_schedule.cron IS NOT NULL THEN
        v_new.cron := btrim(alter_schedule.cron);
        v_new.interval_seconds := NULL;
    ELSIF alter_schedule.interval_seconds IS NOT NULL THEN
        v_new.cron := NULL;
        v_new.interval_seconds := alter_schedule.interval_seconds;
    END IF;
    v_new.payload := coalesce(alter_schedule.payload, v_old.payload);
    v_new.metadata := coalesce(alter_schedule.metadata, v_old.metadata);
    v_new.priority := coalesce(alter_schedule.priority, v_old.priority);
    v_new.max_attempts := coalesce(alter_schedule.max_attempts, v_old.max_attempts);
    v_new.missed_fire_policy := coalesce(alter_schedule.missed_fire_policy, v_old.missed_fire_policy);
    v_new.catch_up_limit := CASE WHEN v_new.missed_fire_policy = 'skip' THEN NULL
                                 ELSE coalesce(alter_schedule.catch_up_limit, v_old.catch_up_limit) END;
    PERFORM zeroth._require(alter_schedule.catch_up_limit IS NULL OR v_new.missed_fire_policy = 'catch_up',
                            'catch_up_limit needs missed_fire_policy catch_up');
    v_new.misfire_grace_seconds := coalesce(alter_schedule.misfire_grace_seconds, v_old.misfire_grace_seconds);
    v_new.anchor_at := coalesce(alter_schedule.start_at, v_old.anchor_at);
    v_new.time_zone := zeroth._require_schedule(
        v_new.name, v_new.deployment_ref, v_new.tenant_id, v_new.workspace_id, v_new.cron,
        v_new.interval_seconds, coalesce(alter_schedule.time_zone, v_old.time_zone), v_new.payload,
        v_new.metadata, v_new.priority, v_new.max_attempts, v_new.missed_fire_policy,
        v_new.catch_up_limit, v_new.misfire_grace_seconds);
    IF (v_new.cron, v_new.interval_seconds, v_new.time_zone, v_new.anchor_at)
       IS DISTINCT FROM (v_old.cron, v_old.interval_seconds, v_old.time_zone, v_old.anchor_at) THEN
        v_new.next_fire_at := zeroth._schedule_next(v_new.cron, v_new.interval_seconds, v_new.anchor_at,
                                                    v_new.time_zone,
                                                    greatest(v_now, v_new.anchor_at - interval '1 microsecond'));
    END IF;
    UPDATE zeroth.schedules AS s
       SET deployment_ref = v_new.deployment_ref, cron = v_new.cron,
           interval_seconds = v_new.interval_seconds, time_zone = v_new.time_zone,
           anchor_at = v_new.anchor_at, payload = v_new.payload, metadata = v_new.metadata,
           priority = v_new.priority, max_attempts = v_new.max_attempts,
           missed_fire_policy = v_new.missed_fire_policy, catch_up_limit = v_new.catch_up_limit,
           misfire_grace_seconds = v_new.misfire_grace_seconds, next_fire_at = v_new.next_fire_at,
           managed_by = 'sql', updated_at = v_now, last_error = NULL, last_error_at = NULL
     WHERE s.schedule_id = v_old.schedule_id
    RETURNING s.* INTO v_row;
    RETURN v_row;
END
$$;
COMMENT ON FUNCTION zeroth.alter_schedule(text, text, text, text, text, integer, text, jsonb, jsonb, integer, integer, text, integer, integer, timestamptz) IS
'alter_schedule: admin: change a schedule of a scope (NULL arguments keep their value; a cron replaces an interval and the reverse). A change of timing (cron, interval_seconds, time_zone, start_at) sets next_fire_at to the first fire time after now. Marks it managed_by sql: register_schedule no longer changes it. Clears last_error. Locks the schedule row, waiting at most 2 s (lock_timeout) for a firer. Raises ZP006 invalid_scope, ZP008 invalid_argument, ZP009 schedule_not_found, 55P03 lock_not_available. Time: clock_timestamp().';
ALTER FUNCTION zeroth.alter_schedule(text, text, text, text, text, integer, text, jsonb, jsonb, integer, integer, text, integer, integer, timestamptz) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.alter_schedule(text, text, text, text, text, integer, text, jsonb, jsonb, integer, integer, text, integer, integer, timestamptz) FROM PUBLIC;
