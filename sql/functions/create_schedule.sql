-- create_schedule: admin (a DBA, as zeroth_owner): new schedule in a scope. Exactly one of cron (5
-- fields, read on the wall clock of time_zone) and interval_seconds (from start_at, default now
-- truncated to the second).
-- No fire time before start_at; the first is the next one after now (next_fire_at). Locks: the
-- name's unique-index entry. Raises ZP006 invalid_scope, ZP008 invalid_argument (a bad
-- expression or zone, a name already taken in the scope). Notifies nothing. Time:
-- clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.create_schedule(
    name                  text,
    deployment_ref        text,
    cron                  text        DEFAULT NULL,
    interval_seconds      integer     DEFAULT NULL,
    tenant_id             text        DEFAULT NULL,
    workspace_id          text        DEFAULT NULL,
    time_zone             text        DEFAULT 'UTC',
    payload               jsonb       DEFAULT '{}'::jsonb,
    metadata              jsonb       DEFAULT '{}'::jsonb,
    priority              integer     DEFAULT 0,
    max_attempts          integer     DEFAULT 3,
    missed_fire_policy    text        DEFAULT 'skip',
    catch_up_limit        integer     DEFAULT NULL,
    misfire_grace_seconds integer     DEFAULT 60,
    start_at              timestamptz DEFAULT NULL,
    paused                boolean     DEFAULT false)
    RETURNS zeroth.schedules
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now    timestamptz := zeroth._now();
    v_tenant text := zeroth._scope_tenant(create_schedule.tenant_id, create_schedule.workspace_id);
    v_zone   text;
    v_anchor timestamptz;
    v_row    zeroth.schedules;
BEGIN
    IF v_tenant IS NULL THEN
        RAISE EXCEPTION 'a workspace_id needs a tenant_id' USING ERRCODE = 'ZP006';
    END IF;
    v_zone := zeroth._require_schedule(create_schedule.name, create_schedule.deployment_ref, v_tenant,
                                       create_schedule.workspace_id, create_schedule.cron,
                                       create_schedule.interval_seconds, create_schedule.time_zone,
                                       create_schedule.payload, create_schedule.metadata,
                                       create_schedule.priority, create_schedule.max_attempts,
                                       create_schedule.missed_fire_policy, create_schedule.catch_up_limit,
                                       create_schedule.misfire_grace_seconds);
    PERFORM zeroth._require(create_schedule.paused IS NOT NULL, 'paused must not be NULL');
    PERFORM zeroth._require(create_schedule.start_at IS NULL OR isfinite(create_schedule.start_at),
                            'start_at must be a finite timestamp');
    v_anchor := coalesce(create_schedule.start_at, date_trunc('second', v_now));
    INSERT INTO zeroth.schedules AS s (
        tenant_id, workspace_id, name, deployment_ref, cron, interval_seconds, time_zone, anchor_at,
        payload, metadata, priority, max_attempts, missed_fire_policy, catch_up_limit,
        misfire_grace_seconds, paused, managed_by, next_fire_at, created_at, updated_at)
    VALUES (
        v_tenant, create_schedule.workspace_id, create_schedule.name, create_schedule.deployment_ref,
        btrim(create_schedule.cron), create_schedule.interval_seconds, v_zone, v_anchor,
        create_schedule.payload, create_schedule.metadata, create_schedule.priority,
        create_schedule.max_attempts, create_schedule.missed_fire_policy,
        create_schedule.catch_up_limit, create_schedule.misfire_grace_seconds,
        create_schedule.paused, 'sql',
        zeroth._schedule_next(btrim(create_schedule.cron), create_schedule.interval_seconds, v_anchor,
                              v_zone, greatest(v_now, v_anchor - interval '1 microsecond')),
        v_now, v_now)
    ON CONFLICT ON CONSTRAINT schedules_name_key DO NOTHING
    RETURNING s.* INTO v_row;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'a schedule named "%" already exists in this scope (alter_schedule changes it)',
            create_schedule.name USING ERRCODE = 'ZP008';
    END IF;
    RETURN v_row;
END
$$;
COMMENT ON FUNCTION zeroth.create_schedule(text, text, text, integer, text, text, text, jsonb, jsonb, integer, integer, text, integer, integer, timestamptz, boolean) IS
'create_schedule: admin: a new schedule of a scope: exactly one of cron (standard 5 fields on the wall clock of time_zone) and interval_seconds (from start_at, default now); each fire time becomes one run of deployment_ref (fire_due_schedules). No fire time before start_at; next_fire_at is the first after now. missed_fire_policy skip (the most recent due fire time only, if late by at most misfire_grace_seconds) or catch_up (the catch_up_limit most recent). Raises ZP006 invalid_scope, ZP008 invalid_argument (bad expression or zone, name taken). Time: clock_timestamp().';
ALTER FUNCTION zeroth.create_schedule(text, text, text, integer, text, text, text, jsonb, jsonb, integer, integer, text, integer, integer, timestamptz, boolean) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.create_schedule(text, text, text, integer, text, text, text, jsonb, jsonb, integer, integer, text, integer, integer, timestamptz, boolean) FROM PUBLIC;
