-- sql/functions/internal/schedules.sql: what the schedule functions share: checking a schedule's
-- timing, its next fire time, and the fire times due in a span.
-- Internal helpers: SECURITY INVOKER, executable by zeroth_owner only (they run inside the
-- SECURITY DEFINER schedule functions). Re-applied by every upgrade (sql/README.md).

-- The canonical name of an IANA time zone (matched without regard to case), ZP008 for anything
-- pg_timezone_names does not list (POSIX strings such as UTC+3 included: their sign reads
-- backwards, and a fixed offset has no daylight saving rules to follow).
CREATE OR REPLACE FUNCTION zeroth._time_zone_name(time_zone text) RETURNS text
    LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_name text;
BEGIN
    IF _time_zone_name.time_zone IS NULL OR _time_zone_name.time_zone = ''
       OR length(_time_zone_name.time_zone) > 100 THEN
        RAISE EXCEPTION 'time_zone must be an IANA time zone name such as Europe/Berlin or UTC'
            USING ERRCODE = 'ZP008';
    END IF;
    SELECT z.name INTO v_name
      FROM pg_catalog.pg_timezone_names z
     WHERE lower(z.name) = lower(_time_zone_name.time_zone)
     ORDER BY z.name = _time_zone_name.time_zone DESC, z.name
     LIMIT 1;
    IF v_name IS NULL THEN
        RAISE EXCEPTION 'unknown time zone "%": use an IANA name such as Europe/Berlin or UTC',
            _time_zone_name.time_zone USING ERRCODE = 'ZP008';
    END IF;
    RETURN v_name;
END
$$;
COMMENT ON FUNCTION zeroth._time_zone_name(text) IS 'Internal: the canonical IANA name of a time zone (ZP008 unless pg_timezone_names lists it).';
ALTER FUNCTION zeroth._time_zone_name(text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._time_zone_name(text) FROM PUBLIC;

-- The first fire time of a schedule strictly after an instant (NULL: none). Interval schedules
-- fire at anchor_at + k * interval_seconds (k >= 0), cron schedules as _cron_next. ZP008 for an
-- infinite instant.
CREATE OR REPLACE FUNCTION zeroth._schedule_next(cron text, interval_seconds integer,
                                                 anchor_at timestamptz, time_zone text,
                                                 after timestamptz)
    RETURNS timestamptz
    LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT (isfinite(_schedule_next.after) AND isfinite(_schedule_next.anchor_at)) THEN
        RAISE EXCEPTION 'a fire time is computed from finite instants, not % (anchor %)',
            _schedule_next.after, _schedule_next.anchor_at USING ERRCODE = 'ZP008';
    END IF;
    IF _schedule_next.cron IS NOT NULL THEN
        RETURN zeroth._cron_next(_schedule_next.cron, _schedule_next.time_zone, _schedule_next.after);
    END IF;
    IF _schedule_next.after < _schedule_next.anchor_at THEN
        RETURN _schedule_next.anchor_at;
    END IF;
    RETURN _schedule_next.anchor_at + make_interval(secs => _schedule_next.interval_seconds
        * (floor(extract(epoch FROM _schedule_next.after - _schedule_next.anchor_at)
                 / _schedule_next.interval_seconds) + 1));
END
$$;
COMMENT ON FUNCTION zeroth._schedule_next(text, integer, timestamptz, text, timestamptz) IS 'Internal: the first fire time of a schedule (cron in its time zone, or anchor + k * interval) strictly after an instant.';
ALTER FUNCTION zeroth._schedule_next(text, integer, timestamptz, text, timestamptz) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._schedule_next(text, integer, timestamptz, text, timestamptz) FROM PUBLIC;

-- The fire times of a schedule in [from_at, up_to]: the `keep` most recent, oldest first, and how
-- many there are in all (total; for a cron schedule with more than 2000 due, a lower bound).
-- Interval schedules are arithmetic. A cron schedule is walked forward from from_at; past 2000
-- fire times (a minute schedule down for a day and a half) the walk starts again over a window
-- before up_to that doubles from one day until it holds `keep` fire times or reaches from_at,
-- so an outage of any length costs a bounded walk. ZP008 for an infinite instant.
CREATE OR REPLACE FUNCTION zeroth._schedule_due(cron text, interval_seconds integer,
                                                anchor_at timestamptz, time_zone text,
                                                from_at timestamptz, up_to timestamptz,
                                                keep integer,
                                                OUT times timestamptz[], OUT total bigint)
    LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_first  bigint;
    v_last   bigint;
    v_at     timestamptz;
    v_window interval := interval '1 day';
    v_start  timestamptz;
    v_count  bigint;
BEGIN
    times := '{}';
    total := 0;
    IF NOT (isfinite(_schedule_due.from_at) AND isfinite(_schedule_due.up_to)
            AND isfinite(_schedule_due.anchor_at)) THEN
        RAISE EXCEPTION 'fire times are walked between finite instants, not % to % (anchor %)',
            _schedule_due.from_at, _schedule_due.up_to, _schedule_due.anchor_at USING ERRCODE = 'ZP008';
    END IF;
    IF _schedule_due.from_at IS NULL OR _schedule_due.from_at > _schedule_due.up_to THEN
        RETURN;
    END IF;
    IF _schedule_due.cron IS NULL THEN
        v_first := greatest(0, ceil(extract(epoch FROM _schedule_due.from_at - _schedule_due.anchor_at)
                                    / _schedule_due.interval_seconds)::bigint);
        v_last := floor(extract(epoch FROM _schedule_due.up_to - _schedule_due.anchor_at)
                        / _schedule_due.interval_seconds)::bigint;
        IF v_last < v_first THEN
            RETURN;
        END IF;
        total := v_last - v_first + 1;
        times := ARRAY(SELECT _schedule_due.anchor_at
                              + make_interval(secs => k * _schedule_due.interval_seconds::double precision)
                         FROM generate_series(greatest(v_first, v_last - _schedule_due.keep + 1), v_last) AS k
                        ORDER BY k);
        RETURN;
    END IF;

    -- The walk from from_at: exact while at most 2000 fire times are due.
    v_at := zeroth._cron_next(_schedule_due.cron, _schedule_due.time_zone,
                              _schedule_due.from_at - interval '1 microsecond');
    WHILE v_at IS NOT NULL AND v_at <= _schedule_due.up_to AND total < 2000 LOOP
        total := total + 1;
        times := (times || v_at)[greatest(1, cardinality(times) + 2 - _schedule_due.keep):];
        v_at := zeroth._cron_next(_schedule_due.cron, _schedule_due.time_zone, v_at);
    END LOOP;
    IF total < 2000 THEN
        RETURN;
    END IF;
    -- More: walk windows before up_to, doubling from one day, until one holds `keep` fire times
    -- (or reaches from_at). A window holds at most twice the last one's count plus one day of
    -- minutes (< 2 * 1000 + 1440), so the 10000 cap is never the reason a walk stops short.
    LOOP
        v_start := greatest(_schedule_due.from_at, _schedule_due.up_to - v_window);
        v_count := 0;
        times := '{}';
        v_at := zeroth._cron_next(_schedule_due.cron, _schedule_due.time_zone,
                                  v_start - interval '1 microsecond');
        WHILE v_at IS NOT NULL AND v_at <= _schedule_due.up_to AND v_count < 10000 LOOP
            v_count := v_count + 1;
            times := (times || v_at)[greatest(1, cardinality(times) + 2 - _schedule_due.keep):];
            v_at := zeroth._cron_next(_schedule_due.cron, _schedule_due.time_zone, v_at);
        END LOOP;
        EXIT WHEN cardinality(times) >= _schedule_due.keep OR v_start = _schedule_due.from_at
                  OR v_count >= 10000;
        v_window := v_window * 2;
    END LOOP;
    total := greatest(total, v_count);
END
$$;
COMMENT ON FUNCTION zeroth._schedule_due(text, integer, timestamptz, text, timestamptz, timestamptz, integer) IS 'Internal: the keep most recent fire times of a schedule in [from_at, up_to], oldest first, and how many there are (a lower bound past 2000 for cron).';
ALTER FUNCTION zeroth._schedule_due(text, integer, timestamptz, text, timestamptz, timestamptz, integer) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._schedule_due(text, integer, timestamptz, text, timestamptz, timestamptz, integer) FROM PUBLIC;

-- Checks a schedule's definition (ZP008 naming what is wrong) and returns the canonical zone.
CREATE OR REPLACE FUNCTION zeroth._require_schedule(
    name text, deployment_ref text, tenant_id text, workspace_id text, cron text,
    interval_seconds integer, time_zone text, payload jsonb, metadata jsonb, priority integer,
    max_attempts integer, missed_fire_policy text, catch_up_limit integer,
    misfire_grace_seconds integer)
    RETURNS text
    LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM zeroth._require_identifier(_require_schedule.name, 'name');
    PERFORM zeroth._require_identifier(_require_schedule.deployment_ref, 'deployment_ref');
    PERFORM zeroth._require_identifier(_require_schedule.tenant_id, 'tenant_id');
    IF _require_schedule.workspace_id IS NOT NULL THEN
        PERFORM zeroth._require_identifier(_require_schedule.workspace_id, 'workspace_id');
    END IF;
    PERFORM zeroth._require((_require_schedule.cron IS NULL) <> (_require_schedule.interval_seconds IS NULL),
                            'a schedule needs exactly one of cron and interval_seconds');
    IF _require_schedule.cron IS NOT NULL THEN
        PERFORM zeroth._cron_parse(_require_schedule.cron);
    END IF;
    PERFORM zeroth._require(_require_schedule.interval_seconds IS NULL
                            OR _require_schedule.interval_seconds BETWEEN 1 AND 31622400,
                            'interval_seconds must be between 1 and 31622400 (366 days)');
    PERFORM zeroth._require(jsonb_typeof(_require_schedule.payload) = 'object', 'payload must be a JSON object');
    PERFORM zeroth._require(jsonb_typeof(_require_schedule.metadata) = 'object', 'metadata must be a JSON object');
    PERFORM zeroth._require(_require_schedule.priority IS NOT NULL, 'priority must not be NULL');
    PERFORM zeroth._require(_require_schedule.max_attempts BETWEEN 1 AND 1000, 'max_attempts must be between 1 and 1000');
    PERFORM zeroth._require(_require_schedule.missed_fire_policy IN ('skip', 'catch_up'),
                            'missed_fire_policy must be skip or catch_up');
    PERFORM zeroth._require(_require_schedule.missed_fire_policy <> 'catch_up'
                            OR _require_schedule.catch_up_limit BETWEEN 1 AND 1000,
                            'missed_fire_policy catch_up needs catch_up_limit between 1 and 1000');
    PERFORM zeroth._require(_require_schedule.missed_fire_policy <> 'skip'
                            OR _require_schedule.catch_up_limit IS NULL,
                            'catch_up_limit needs missed_fire_policy catch_up');
    PERFORM zeroth._require(_require_schedule.misfire_grace_seconds BETWEEN 1 AND 86400,
                            'misfire_grace_seconds must be between 1 and 86400');
    RETURN zeroth._time_zone_name(_require_schedule.time_zone);
END
$$;
COMMENT ON FUNCTION zeroth._require_schedule(text, text, text, text, text, integer, text, jsonb, jsonb, integer, integer, text, integer, integer) IS 'Internal: ZP008 naming what is wrong with a schedule definition; returns the canonical time zone name.';
ALTER FUNCTION zeroth._require_schedule(text, text, text, text, text, integer, text, jsonb, jsonb, integer, integer, text, integer, integer) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._require_schedule(text, text, text, text, text, integer, text, jsonb, jsonb, integer, integer, text, integer, integer) FROM PUBLIC;

-- The schedule named in a scope, locked (FOR UPDATE: a firer holding it is waited for), or
-- ZP009 schedule_not_found (ZP006 for a workspace without a tenant).
CREATE OR REPLACE FUNCTION zeroth._lock_schedule(name text, tenant_id text, workspace_id text)
    RETURNS zeroth.schedules
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_tenant text := zeroth._scope_tenant(_lock_schedule.tenant_id, _lock_schedule.workspace_id);
    v_row    zeroth.schedules;
BEGIN
    IF v_tenant IS NULL THEN
        RAISE EXCEPTION 'a workspace_id needs a tenant_id' USING ERRCODE = 'ZP006';
    END IF;
    PERFORM zeroth._require_identifier(_lock_schedule.name, 'name');
    SELECT s.* INTO v_row
      FROM zeroth.schedules s
     WHERE s.tenant_id = v_tenant
       AND s.workspace_key = zeroth._workspace_key(_lock_schedule.workspace_id)
       AND s.name = _lock_schedule.name
       FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no schedule named "%" in this scope', _lock_schedule.name USING ERRCODE = 'ZP009';
    END IF;
    RETURN v_row;
END
$$;
COMMENT ON FUNCTION zeroth._lock_schedule(text, text, text) IS 'Internal: lock and return the schedule of this name in this scope (ZP009 schedule_not_found, ZP006 invalid_scope).';
ALTER FUNCTION zeroth._lock_schedule(text, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._lock_schedule(text, text, text) FROM PUBLIC;

-- One run of a schedule (issue 31: the enqueue fire_due_schedules and fire_schedule_now share):
-- the schedule's deployment, payload, priority and max_attempts in its scope, runs.schedule_id
-- set, metadata zeroth_schedule {name, schedule_id, fire_at[, manual]} over the schedule's own,
-- keyed zeroth-schedule:<id>:<key_suffix> (a prefix only this internal path may use: callers get
-- ZP011). run_id: the id a new run gets (NULL: a new one). A run already under the key is
-- returned (created false). Notifies zeroth_wakeup (via _enqueue_run).
CREATE OR REPLACE FUNCTION zeroth._enqueue_schedule_run(schedule zeroth.schedules, key_suffix text,
                                                        fire_at timestamptz, manual boolean,
                                                        run_id uuid DEFAULT NULL)
    RETURNS zeroth.enqueued_run
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_mark jsonb := jsonb_build_object('name', (_enqueue_schedule_run.schedule).name,
                                       'schedule_id', (_enqueue_schedule_run.schedule).schedule_id,
                                       'fire_at', _enqueue_schedule_run.fire_at);
BEGIN
    IF _enqueue_schedule_run.manual THEN
        v_mark := v_mark || jsonb_build_object('manual', true);
    END IF;
    RETURN zeroth._enqueue_run(
        deployment_ref  => (_enqueue_schedule_run.schedule).deployment_ref,
        payload         => (_enqueue_schedule_run.schedule).payload,
        tenant_id       => (_enqueue_schedule_run.schedule).tenant_id,
        workspace_id    => (_enqueue_schedule_run.schedule).workspace_id,
        priority        => (_enqueue_schedule_run.schedule).priority,
        max_attempts    => (_enqueue_schedule_run.schedule).max_attempts,
        idempotency_key => 'zeroth-schedule:' || (_enqueue_schedule_run.schedule).schedule_id::text
                           || ':' || _enqueue_schedule_run.key_suffix,
        metadata        => (_enqueue_schedule_run.schedule).metadata
                           || jsonb_build_object('zeroth_schedule', v_mark),
        run_id          => _enqueue_schedule_run.run_id,
        schedule_id     => (_enqueue_schedule_run.schedule).schedule_id);
END
$$;
COMMENT ON FUNCTION zeroth._enqueue_schedule_run(zeroth.schedules, text, timestamptz, boolean, uuid) IS 'Internal: one run of a schedule (its deployment, payload, priority, max_attempts, scope; runs.schedule_id; metadata zeroth_schedule), keyed zeroth-schedule:<id>:<key_suffix>; a run already under the key comes back with created false. Used by fire_due_schedules and fire_schedule_now.';
ALTER FUNCTION zeroth._enqueue_schedule_run(zeroth.schedules, text, timestamptz, boolean, uuid) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._enqueue_schedule_run(zeroth.schedules, text, timestamptz, boolean, uuid) FROM PUBLIC;
