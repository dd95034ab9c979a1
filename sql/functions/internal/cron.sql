-- sql/functions/internal/cron.sql: cron expressions and fire times, computed in the database.
-- Internal helpers: SECURITY INVOKER, executable by zeroth_owner only (they run inside the
-- SECURITY DEFINER schedule functions). Re-applied by every upgrade (sql/README.md).
--
-- The dialect is standard 5-field cron (minute hour day-of-month month day-of-week): `*`, `a`,
-- `a-b`, `*/n`, `a-b/n` and comma lists of those; month names JAN-DEC and day names SUN-SAT in
-- any case; 0 and 7 are Sunday. As Vixie cron and cronie: when day-of-month and day-of-week are
-- both restricted (neither field starts with `*`) a day matches if EITHER matches, otherwise both
-- must. Anything else (macros such as @hourly, a seconds or year field, `a/n`, out-of-range
-- values, reversed ranges, step 0, empty fields) is refused with ZP008 naming field and token.
--
-- Fire times are instants: the wall-clock times that match, read in the schedule's IANA time
-- zone. A local time that occurs twice (autumn: clocks go back) fires once, at its first
-- occurrence; a local time that does not exist (spring: clocks go forward) fires at the instant
-- the gap ends (as Vixie cron runs such jobs right after the change), so no day loses its run and
-- several skipped times fold into that one instant.

-- One value of a field: a number in lo..hi or one of the field's names (names[1] stands for
-- name_base, names[2] for name_base + 1, ...).
CREATE OR REPLACE FUNCTION zeroth._cron_value(value text, token text, field_name text, lo integer,
                                              hi integer, names text[], name_base integer)
    RETURNS integer
    LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_n integer;
BEGIN
    IF _cron_value.value ~ '^[0-9]{1,6}$' THEN
        v_n := _cron_value.value::integer;
        IF v_n < _cron_value.lo OR v_n > _cron_value.hi THEN
            RAISE EXCEPTION 'cron %: % is out of range %-% (token "%")', _cron_value.field_name,
                v_n, _cron_value.lo, _cron_value.hi, _cron_value.token USING ERRCODE = 'ZP008';
        END IF;
        RETURN v_n;
    END IF;
    v_n := array_position(_cron_value.names, upper(_cron_value.value));
    IF v_n IS NULL THEN
        RAISE EXCEPTION 'cron %: "%" is not a number% (token "%")', _cron_value.field_name,
            _cron_value.value,
            CASE WHEN _cron_value.names IS NULL THEN '' ELSE ' or a name (' || array_to_string(_cron_value.names, ',') || ')' END,
            _cron_value.token USING ERRCODE = 'ZP008';
    END IF;
    RETURN v_n - 1 + _cron_value.name_base;
END
$$;
COMMENT ON FUNCTION zeroth._cron_value(text, text, text, integer, integer, text[], integer) IS 'Internal: one value of a cron field (a number in range or a name), ZP008 naming the field and token otherwise.';
ALTER FUNCTION zeroth._cron_value(text, text, text, integer, integer, text[], integer) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._cron_value(text, text, text, integer, integer, text[], integer) FROM PUBLIC;

-- One field: the sorted set of values it matches.
CREATE OR REPLACE FUNCTION zeroth._cron_field(field text, field_name text, lo integer, hi integer,
                                              names text[], name_base integer)
    RETURNS integer[]
    LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_item  text;
    v_parts text[];
    v_base  text;
    v_step  integer;
    v_a     integer;
    v_b     integer;
    v_out   integer[] := '{}';
BEGIN
    FOREACH v_item IN ARRAY string_to_array(_cron_field.field, ',') LOOP
        IF v_item = '' THEN
            RAISE EXCEPTION 'cron %: empty item in list "%"', _cron_field.field_name, _cron_field.field
                USING ERRCODE = 'ZP008';
        END IF;
        v_parts := string_to_array(v_item, '/');
        v_base := v_parts[1];
        IF cardinality(v_parts) > 2 THEN
            RAISE EXCEPTION 'cron %: more than one step in token "%"', _cron_field.field_name, v_item
                USING ERRCODE = 'ZP008';
        ELSIF cardinality(v_parts) = 2 THEN
            IF v_parts[2] !~ '^[0-9]{1,6}$' THEN
                RAISE EXCEPTION 'cron %: step "%" is not a positive integer (token "%")',
                    _cron_field.field_name, v_parts[2], v_item USING ERRCODE = 'ZP008';
            END IF;
            v_step := v_parts[2]::integer;
            IF v_step = 0 THEN
                RAISE EXCEPTION 'cron %: step 0 (token "%")', _cron_field.field_name, v_item
                    USING ERRCODE = 'ZP008';
            END IF;
            IF v_base <> '*' AND strpos(v_base, '-') = 0 THEN
                RAISE EXCEPTION 'cron %: a step needs * or a range a-b before it (token "%")',
                    _cron_field.field_name, v_item USING ERRCODE = 'ZP008';
            END IF;
        ELSE
            v_step := 1;
        END IF;
        IF v_base = '*' THEN
            v_a := _cron_field.lo;
            v_b := CASE WHEN _cron_field.field_name = 'day-of-week' THEN 6 ELSE _cron_field.hi END;
        ELSIF v_base ~ '^[^-]+-[^-]+$' THEN
            v_a := zeroth._cron_value(split_part(v_base, '-', 1), v_item, _cron_field.field_name,
                                      _cron_field.lo, _cron_field.hi, _cron_field.names, _cron_field.name_base);
            v_b := zeroth._cron_value(split_part(v_base, '-', 2), v_item, _cron_field.field_name,
                                      _cron_field.lo, _cron_field.hi, _cron_field.names, _cron_field.name_base);
            IF v_a > v_b THEN
                RAISE EXCEPTION 'cron %: reversed range (token "%")', _cron_field.field_name, v_item
                    USING ERRCODE = 'ZP008';
            END IF;
        ELSIF strpos(v_base, '-') > 0 OR v_base = '' THEN
            RAISE EXCEPTION 'cron %: malformed token "%"', _cron_field.field_name, v_item
                USING ERRCODE = 'ZP008';
        ELSE
            v_a := zeroth._cron_value(v_base, v_item, _cron_field.field_name, _cron_field.lo,
                                      _cron_field.hi, _cron_field.names, _cron_field.name_base);
            v_b := v_a;
        END IF;
        v_out := v_out || ARRAY(SELECT generate_series(v_a, v_b, v_step));
    END LOOP;
    IF _cron_field.field_name = 'day-of-week' THEN
        -- 7 is Sunday, as 0.
        v_out := ARRAY(SELECT CASE WHEN v = 7 THEN 0 ELSE v END FROM unnest(v_out) AS v);
    END IF;
    RETURN ARRAY(SELECT DISTINCT v FROM unnest(v_out) AS v ORDER BY v);
END
$$;
COMMENT ON FUNCTION zeroth._cron_field(text, text, integer, integer, text[], integer) IS 'Internal: the sorted values one cron field matches (ZP008 naming the field and token when malformed).';
ALTER FUNCTION zeroth._cron_field(text, text, integer, integer, text[], integer) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._cron_field(text, text, integer, integer, text[], integer) FROM PUBLIC;

-- A whole expression: the five value sets, and whether day-of-month / day-of-week start with `*`
-- (the OR rule above). Refuses an expression that can never fire (`0 0 31 2 *`).
CREATE OR REPLACE FUNCTION zeroth._cron_parse(
    cron text,
    OUT minutes integer[], OUT hours integer[], OUT days integer[], OUT months integer[],
    OUT weekdays integer[], OUT days_star boolean, OUT weekdays_star boolean)
    LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_fields text[];
BEGIN
    IF _cron_parse.cron IS NULL OR btrim(_cron_parse.cron) = '' THEN
        RAISE EXCEPTION 'cron expression must not be empty' USING ERRCODE = 'ZP008';
    END IF;
    IF length(_cron_parse.cron) > 500 THEN
        RAISE EXCEPTION 'cron expression must be at most 500 characters' USING ERRCODE = 'ZP008';
    END IF;
    IF left(btrim(_cron_parse.cron), 1) = '@' THEN
        RAISE EXCEPTION 'cron macro "%" is not supported: write the 5 fields (e.g. @hourly is "0 * * * *")',
            btrim(_cron_parse.cron) USING ERRCODE = 'ZP008';
    END IF;
    v_fields := regexp_split_to_array(btrim(_cron_parse.cron), '\s+');
    IF cardinality(v_fields) <> 5 THEN
        RAISE EXCEPTION 'cron expression must have 5 fields (minute hour day-of-month month day-of-week), got % in "%"%',
            cardinality(v_fields), _cron_parse.cron,
            CASE WHEN cardinality(v_fields) > 5 THEN ': seconds and year fields are not supported' ELSE '' END
            USING ERRCODE = 'ZP008';
    END IF;
    minutes := zeroth._cron_field(v_fields[1], 'minute', 0, 59, NULL, 0);
    hours := zeroth._cron_field(v_fields[2], 'hour', 0, 23, NULL, 0);
    days := zeroth._cron_field(v_fields[3], 'day-of-month', 1, 31, NULL, 0);
    months := zeroth._cron_field(v_fields[4], 'month', 1, 12,
        ARRAY['JAN','FEB','MAR','APR','MAY','JUN','JUL','AUG','SEP','OCT','NOV','DEC'], 1);
    weekdays := zeroth._cron_field(v_fields[5], 'day-of-week', 0, 7,
        ARRAY['SUN','MON','TUE','WED','THU','FRI','SAT'], 0);
    days_star := left(v_fields[3], 1) = '*';
    weekdays_star := left(v_fields[5], 1) = '*';
    -- When the day-of-month must match (AND rule), some listed month must have a listed day.
    IF (days_star OR weekdays_star) AND NOT EXISTS (
            SELECT 1 FROM unnest(months) AS m, unnest(days) AS d
             WHERE d <= CASE WHEN m = 2 THEN 29 WHEN m IN (4, 6, 9, 11) THEN 30 ELSE 31 END) THEN
        RAISE EXCEPTION 'cron expression "%" never fires: day-of-month % never occurs in month %',
            _cron_parse.cron, v_fields[3], v_fields[4] USING ERRCODE = 'ZP008';
    END IF;
END
$$;
COMMENT ON FUNCTION zeroth._cron_parse(text) IS 'Internal: parse a standard 5-field cron expression into its value sets (ZP008 naming the field and the bad token; also for an expression that can never fire).';
ALTER FUNCTION zeroth._cron_parse(text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._cron_parse(text) FROM PUBLIC;

-- The instant a wall-clock time of a zone stands for: its first occurrence when it occurs twice,
-- the end of the gap when it does not occur (found by bisection to the second; zone transitions
-- fall on whole seconds).
CREATE OR REPLACE FUNCTION zeroth._local_instant(local_time timestamp, time_zone text)
    RETURNS timestamptz
    LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_pg     timestamptz := _local_instant.local_time AT TIME ZONE _local_instant.time_zone;
    v_best   timestamptz;
    v_c      timestamptz;
    v_probe  timestamptz;
    v_lo     bigint;
    v_hi     bigint;
    v_mid    bigint;
BEGIN
    FOREACH v_probe IN ARRAY ARRAY[v_pg - interval '1 day', v_pg, v_pg + interval '1 day'] LOOP
        -- The offset in effect at the probe, applied to the local time.
        v_c := (_local_instant.local_time
                - ((v_probe AT TIME ZONE _local_instant.time_zone) - (v_probe AT TIME ZONE 'UTC')))
               AT TIME ZONE 'UTC';
        IF (v_c AT TIME ZONE _local_instant.time_zone) = _local_instant.local_time
           AND (v_best IS NULL OR v_c < v_best) THEN
            v_best := v_c;
        END IF;
    END LOOP;
    IF v_best IS NOT NULL THEN
        RETURN v_best;
    END IF;
    -- In a gap: the first instant whose local time is past local_time.
    v_lo := extract(epoch FROM v_pg - interval '26 hours')::bigint;
    v_hi := extract(epoch FROM v_pg)::bigint;
    WHILE v_hi - v_lo > 1 LOOP
        v_mid := (v_lo + v_hi) / 2;
        IF (to_timestamp(v_mid) AT TIME ZONE _local_instant.time_zone) > _local_instant.local_time THEN
            v_hi := v_mid;
        ELSE
            v_lo := v_mid;
        END IF;
    END LOOP;
    RETURN to_timestamp(v_hi);
END
$$;
COMMENT ON FUNCTION zeroth._local_instant(timestamp, text) IS 'Internal: the instant a wall-clock time of a time zone fires at: its first occurrence when clocks go back, the end of the gap when clocks go forward.';
ALTER FUNCTION zeroth._local_instant(timestamp, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._local_instant(timestamp, text) FROM PUBLIC;

-- The first fire time of a cron expression strictly after an instant, or NULL if none within 29
-- years (a day-of-week restriction that no listed 29 February meets); ZP008 for an infinite or
-- NULL instant. Walks candidate days, not
-- minutes: a month that is not listed is passed over whole, and within a matching day the first
-- listed hour and minute is taken from the sorted sets.
CREATE OR REPLACE FUNCTION zeroth._cron_next(cron text, time_zone text, after timestamptz)
    RETURNS timestamptz
    LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_spec   record;
    v_start  timestamp := date_trunc('minute', _cron_next.after AT TIME ZONE _cron_next.time_zone)
                          + interval '1 minute';
    v_day    date := v_start::date;
    v_limit  date := v_start::date + 366 * 29;
    v_first  boolean := true;
    v_h0     integer := extract(hour FROM v_start)::integer;
    v_m0     integer := extract(minute FROM v_start)::integer;
    v_dom    integer;
    v_dow    integer;
    v_h      integer;
    v_m      integer;
    v_at     timestamptz;
BEGIN
    -- An infinite instant would never leave the loop below (infinity + 1 day is infinity).
    IF _cron_next.after IS NULL OR NOT isfinite(_cron_next.after) THEN
        RAISE EXCEPTION 'a fire time is computed after a finite instant, not %', _cron_next.after
            USING ERRCODE = 'ZP008';
    END IF;
    SELECT * INTO v_spec FROM zeroth._cron_parse(_cron_next.cron);
    WHILE v_day <= v_limit LOOP
        IF NOT extract(month FROM v_day)::integer = ANY (v_spec.months) THEN
            v_day := (date_trunc('month', v_day) + interval '1 month')::date;
            v_first := false;
            CONTINUE;
        END IF;
        v_dom := extract(day FROM v_day)::integer;
        v_dow := extract(dow FROM v_day)::integer;
        IF (CASE WHEN v_spec.days_star OR v_spec.weekdays_star
                 THEN v_dom = ANY (v_spec.days) AND v_dow = ANY (v_spec.weekdays)
                 ELSE v_dom = ANY (v_spec.days) OR v_dow = ANY (v_spec.weekdays) END) THEN
            FOREACH v_h IN ARRAY v_spec.hours LOOP
                CONTINUE WHEN v_first AND v_h < v_h0;
                FOREACH v_m IN ARRAY v_spec.minutes LOOP
                    CONTINUE WHEN v_first AND v_h = v_h0 AND v_m < v_m0;
                    v_at := zeroth._local_instant(v_day + make_time(v_h, v_m, 0), _cron_next.time_zone);
                    -- The second pass of an hour the clocks went back over: its times fired
                    -- at their first occurrence.
                    IF v_at > _cron_next.after THEN
                        RETURN v_at;
                    END IF;
                END LOOP;
            END LOOP;
        END IF;
        v_day := v_day + 1;
        v_first := false;
    END LOOP;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION zeroth._cron_next(text, text, timestamptz) IS 'Internal: the first fire time of a cron expression in a time zone strictly after an instant (NULL: none within 29 years; ZP008 for an infinite instant).';
ALTER FUNCTION zeroth._cron_next(text, text, timestamptz) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._cron_next(text, text, timestamptz) FROM PUBLIC;
