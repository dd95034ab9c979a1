-- register_schedule: an application's schedule, declared when its worker starts (zeroth_worker).
-- Missing: created (managed_by 'app'). Registered by an application before: its definition is
-- updated to this one (next_fire_at recomputed only when the timing changed); paused is never
-- touched. Created or changed by a DBA (managed_by 'sql'): left exactly as it is ("kept"), so a
-- worker restart never undoes a DBA's pause or edit. Locks the schedule row or the name's
-- unique-index entry. Raises ZP006, ZP008. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.register_schedule(
    name                  text,
    deployment_ref        text,
    cron                  text    DEFAULT NULL,
    interval_seconds      integer DEFAULT NULL,
    tenant_id             text    DEFAULT NULL,
    workspace_id          text    DEFAULT NULL,
    time_zone             text    DEFAULT 'UTC',
    payload               jsonb   DEFAULT '{}'::jsonb,
    metadata              jsonb   DEFAULT '{}'::jsonb,
    priority              integer DEFAULT 0,
    max_attempts          integer DEFAULT 3,
    missed_fire_policy    text    DEFAULT 'skip',
    catch_up_limit        integer DEFAULT NULL,
    misfire_grace_seconds integer DEFAULT 60)
    RETURNS TABLE (schedule_id uuid, outcome text, next_fire_at timestamptz, paused boolean)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now    timestamptz := zeroth._now();
    v_tenant text := zeroth._scope_tenant(register_schedule.tenant_id, register_schedule.workspace_id);
    v_wskey  text := zeroth._workspace_key(register_schedule.workspace_id);
    v_zone   text;
    v_cron   text := btrim(register_schedule.cron);
    v_old    zeroth.schedules;
    v_row    zeroth.schedules;
BEGIN
    IF v_tenant IS NULL THEN
        RAISE EXCEPTION 'a workspace_id needs a tenant_id' USING ERRCODE = 'ZP006';
    END IF;
    v_zone := zeroth._require_schedule(register_schedule.name, register_schedule.deployment_ref, v_tenant,
                                       register_schedule.workspace_id, register_schedule.cron,
                                       register_schedule.interval_seconds, register_schedule.time_zone,
                                       register_schedule.payload, register_schedule.metadata,
                                       register_schedule.priority, register_schedule.max_attempts,
                                       register_schedule.missed_fire_policy, register_schedule.catch_up_limit,
                                       register_schedule.misfire_grace_seconds);
    -- Two workers starting at once: the INSERT of one waits for the other's uncommitted name and
    -- then sees it, so each schedule is created once.
    INSERT INTO zeroth.schedules AS s (
        tenant_id, workspace_id, name, deployment_ref, cron, interval_seconds, time_zone, anchor_at,
        payload, metadata, priority, max_attempts, missed_fire_policy, catch_up_limit,
        misfire_grace_seconds, paused, managed_by, next_fire_at, created_at, updated_at)
    VALUES (
        v_tenant, register_schedule.workspace_id, register_schedule.name, register_schedule.deployment_ref,
        v_cron, register_schedule.interval_seconds, v_zone, date_trunc('second', v_now), register_schedule.payload,
        register_schedule.metadata, register_schedule.priority, register_schedule.max_attempts,
        register_schedule.missed_fire_policy, register_schedule.catch_up_limit,
        register_schedule.misfire_grace_seconds, false, 'app',
        zeroth._schedule_next(v_cron, register_schedule.interval_seconds, date_trunc('second', v_now), v_zone, v_now),
        v_now, v_now)
    ON CONFLICT ON CONSTRAINT schedules_name_key DO NOTHING
    RETURNING s.* INTO v_row;
    IF FOUND THEN
        RETURN QUERY SELECT v_row.schedule_id, 'created'::text, v_row.next_fire_at, v_row.paused;
        RETURN;
    END IF;

    SELECT s.* INTO v_old
      FROM zeroth.schedules s
     WHERE s.tenant_id = v_tenant AND s.workspace_key = v_wskey AND s.name = register_schedule.name
       FOR UPDATE;
    IF v_old.managed_by = 'sql' THEN
        RETURN QUERY SELECT v_old.schedule_id, 'kept'::text, v_old.next_fire_at, v_old.paused;
        RETURN;
    END IF;
    IF (v_old.deployment_ref, v_old.cron, v_old.interval_seconds, v_old.time_zone, v_old.payload,
        v_old.metadata, v_old.priority, v_old.max_attempts, v_old.missed_fire_policy,
        v_old.catch_up_limit, v_old.misfire_grace_seconds)
       IS NOT DISTINCT FROM
       (register_schedule.deployment_ref, v_cron, register_schedule.interval_seconds, v_zone,
        register_schedule.payload, register_schedule.metadata, register_schedule.priority,
        register_schedule.max_attempts, register_schedule.missed_fire_policy,
        register_schedule.catch_up_limit, register_schedule.misfire_grace_seconds) THEN
        RETURN QUERY SELECT v_old.schedule_id, 'unchanged'::text, v_old.next_fire_at, v_old.paused;
        RETURN;
    END IF;
    UPDATE zeroth.schedules AS s
       SET deployment_ref = register_schedule.deployment_ref, cron = v_cron,
           interval_seconds = register_schedule.interval_seconds, time_zone = v_zone,
           payload = register_schedule.payload, metadata = register_schedule.metadata,
           priority = register_schedule.priority, max_attempts = register_schedule.max_attempts,
           missed_fire_policy = register_schedule.missed_fire_policy,
           catch_up_limit = register_schedule.catch_up_limit,
           misfire_grace_seconds = register_schedule.misfire_grace_seconds,
           anchor_at = CASE WHEN s.interval_seconds IS NOT DISTINCT FROM register_schedule.interval_seconds
                            THEN s.anchor_at ELSE date_trunc('second', v_now) END,
           next_fire_at = CASE WHEN (s.cron, s.interval_seconds, s.time_zone)
                                    IS NOT DISTINCT FROM (v_cron, register_schedule.interval_seconds, v_zone)
                               THEN s.next_fire_at
                               ELSE zeroth._schedule_next(v_cron, register_schedule.interval_seconds,
                                                          date_trunc('second', v_now), v_zone, v_now) END,
           updated_at = v_now
     WHERE s.schedule_id = v_old.schedule_id
    RETURNING s.* INTO v_row;
    RETURN QUERY SELECT v_row.schedule_id, 'updated'::text, v_row.next_fire_at, v_row.paused;
END
$$;
COMMENT ON FUNCTION zeroth.register_schedule(text, text, text, integer, text, text, text, jsonb, jsonb, integer, integer, text, integer, integer) IS
'register_schedule: an application declares its schedule (a worker''s start): created when missing (managed_by app); an earlier registration is updated to this definition (next_fire_at recomputed only if the timing changed; paused never touched); a schedule a DBA created or changed (managed_by sql) is kept as it is. Outcome created, updated, unchanged or kept. Raises ZP006 invalid_scope, ZP008 invalid_argument. Time: clock_timestamp().';
ALTER FUNCTION zeroth.register_schedule(text, text, text, integer, text, text, text, jsonb, jsonb, integer, integer, text, integer, integer) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.register_schedule(text, text, text, integer, text, text, text, jsonb, jsonb, integer, integer, text, integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.register_schedule(text, text, text, integer, text, text, text, jsonb, jsonb, integer, integer, text, integer, integer) TO zeroth_worker;
