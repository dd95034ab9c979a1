-- fire_due_schedules: turn the due fire times of the schedules of these deployments into runs,
-- exactly once (any worker, a psql loop or pg_cron may call it, as often as it likes). Scopes: the
-- listed (tenant_ids[i], workspace_ids[i]), or with tenant_ids NULL every scope. Locks up to
-- max_schedules due, unpaused rows FOR UPDATE SKIP LOCKED; per schedule the missed-fire policy
-- picks the fire times after last_fire_at (the high-water mark), each recorded in schedule_fires
-- and enqueued (idempotency key from the same pair), at most max_fires in all (the rest next
-- call). A run already under a fire's key counts as that fire only if this schedule made it
-- (runs.schedule_id); else ZP011 pauses the schedule. A schedule whose fire raises is paused with
-- last_error, the others fire. Raises ZP006, ZP008. Notifies zeroth_wakeup (via _enqueue_run).
-- Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.fire_due_schedules(
    deployment_refs text[],
    tenant_ids      text[]  DEFAULT NULL,
    workspace_ids   text[]  DEFAULT NULL,
    max_schedules   integer DEFAULT 100,
    max_fires       integer DEFAULT 1000)
    RETURNS SETOF zeroth.schedule_fire
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now     timestamptz := zeroth._now();
    v_deps    text[];
    v_tenants text[];
    v_wskeys  text[];
    v_s       zeroth.schedules;
    v_due     record;
    v_times   timestamptz[];
    v_skipped bigint;
    v_fire    timestamptz;
    v_run     uuid;
    v_enq     zeroth.enqueued_run;
    v_out     zeroth.schedule_fire[] := '{}';
    v_fired   integer;
    v_next    timestamptz;
    v_rows    zeroth.schedule_fire[];
    v_budget  integer := fire_due_schedules.max_fires;
    v_state   text;
    v_msg     text;
BEGIN
    PERFORM zeroth._require(fire_due_schedules.deployment_refs IS NOT NULL
                            AND array_ndims(fire_due_schedules.deployment_refs) = 1
                            AND cardinality(fire_due_schedules.deployment_refs) BETWEEN 1 AND 100,
                            'deployment_refs must be a one-dimensional array of 1 to 100 deployments');
    FOR i IN 1 .. cardinality(fire_due_schedules.deployment_refs) LOOP
        PERFORM zeroth._require_identifier(fire_due_schedules.deployment_refs[i], 'every deployment_ref');
    END LOOP;
    PERFORM zeroth._require(fire_due_schedules.max_schedules BETWEEN 1 AND 1000,
                            'max_schedules must be between 1 and 1000');
    PERFORM zeroth._require(fire_due_schedules.max_fires BETWEEN 1 AND 10000,
                            'max_fires must be between 1 and 10000');
    v_deps := ARRAY(SELECT DISTINCT d FROM unnest(fire_due_schedules.deployment_refs) AS d);
    IF fire_due_schedules.tenant_ids IS NOT NULL THEN
        -- Checks the listed scopes (ZP006, ZP008) as every multi-scope function does.
        PERFORM 1
           FROM zeroth._listed_scopes(v_deps, fire_due_schedules.tenant_ids,
                                      fire_due_schedules.workspace_ids, true) AS l;
        SELECT array_agg(zeroth._scope_tenant(t.tenant_id, t.workspace_id)),
               array_agg(zeroth._workspace_key(t.workspace_id))
          INTO v_tenants, v_wskeys
          FROM unnest(fire_due_schedules.tenant_ids,
                      coalesce(fire_due_schedules.workspace_ids,
                               array_fill(NULL::text, ARRAY[cardinality(fire_due_schedules.tenant_ids)])))
                   AS t(tenant_id, workspace_id);
    ELSE
        PERFORM zeroth._require(fire_due_schedules.workspace_ids IS NULL,
                                'workspace_ids needs tenant_ids (NULL tenant_ids is every scope)');
    END IF;

        -- Materialised: the due rows are chosen and locked once, before any run is enqueued; a row
    -- another caller holds is skipped, and one it fired and committed meanwhile no longer
    -- qualifies. The columns are those of the locked row (FOR UPDATE returns the newest
    -- committed version, re-checked), never an older version the statement snapshot saw.
    FOR v_s IN
        WITH due AS MATERIALIZED (
            SELECT s.*
              FROM zeroth.schedules s
             WHERE s.deployment_ref = ANY (v_deps)
               AND NOT s.paused
               AND s.next_fire_at IS NOT NULL
               AND s.next_fire_at <= v_now
               AND (v_tenants IS NULL
                    OR (s.tenant_id, s.workspace_key) IN (SELECT t.tenant_id, t.workspace_key
                                                            FROM unnest(v_tenants, v_wskeys) AS t(tenant_id, workspace_key)))
             ORDER BY s.next_fire_at
             LIMIT fire_due_schedules.max_schedules
               FOR UPDATE OF s SKIP LOCKED)
        SELECT d.* FROM due d ORDER BY d.next_fire_at, d.schedule_id
    LOOP
        -- The fire budget of this call is spent: the rest fire next call (their rows stay due).
        EXIT WHEN v_budget <= 0;
        v_rows := '{}';
        -- One subtransaction per schedule: a row that raises (a DBA's manual UPDATE left a cron,
        -- time zone or value the functions refuse) is paused with its error, never failing the
        -- batch of the other schedules.
        BEGIN
            SELECT * INTO v_due
              FROM zeroth._schedule_due(v_s.cron, v_s.interval_seconds, v_s.anchor_at, v_s.time_zone,
                                        -- The high-water mark: a time at or before the newest
                                        -- fired one never fires again, whatever was pruned.
                                        greatest(v_s.next_fire_at, v_s.last_fire_at + interval '1 microsecond'),
                                        v_now,
                                        CASE WHEN v_s.missed_fire_policy = 'catch_up' THEN v_s.catch_up_limit ELSE 1 END);
            v_times := v_due.times;
            v_skipped := v_due.total - cardinality(v_times);
            IF v_s.missed_fire_policy = 'skip' AND cardinality(v_times) = 1
               AND v_now - v_times[1] > make_interval(secs => v_s.misfire_grace_seconds) THEN
                v_times := '{}';
                v_skipped := v_skipped + 1;
            END IF;
            v_next := NULL;
            IF cardinality(v_times) > v_budget THEN
                -- Oldest first up to the budget; next_fire_at stays at the first one not fired.
                v_next := v_times[v_budget + 1];
                v_times := v_times[1:v_budget];
            END IF;
            v_fired := 0;
            FOREACH v_fire IN ARRAY v_times LOOP
                v_run := NULL;
                INSERT INTO zeroth.schedule_fires AS f (schedule_id, fire_at, tenant_id, run_id, fired_at)
                VALUES (v_s.schedule_id, v_fire, v_s.tenant_id, gen_random_uuid(), v_now)
                ON CONFLICT DO NOTHING
                RETURNING f.run_id INTO v_run;
                -- Already fired (the clock stepped back): no second run.
                CONTINUE WHEN v_run IS NULL;
                -- Through the internal path: the only one that may use the reserved key prefix
                -- and mark the run with its schedule (runs.schedule_id).
                v_enq := zeroth._enqueue_schedule_run(
                    v_s, to_char(v_fire AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                    v_fire, false, v_run);
                IF v_enq.run_id <> v_run THEN
                    -- A run holds this fire time's key (its fire record was pruned). It is this
                    -- fire only if this schedule's firer made it: a run planted under the key
                    -- (before 0018 reserved the prefix) must not pass for the fire. Raising here
                    -- pauses the schedule with the error (below) instead of firing nothing.
                    IF NOT EXISTS (SELECT 1 FROM zeroth.runs r
                                    WHERE r.tenant_id = v_s.tenant_id
                                      AND r.workspace_key = v_s.workspace_key
                                      AND r.run_id = v_enq.run_id
                                      AND r.schedule_id = v_s.schedule_id) THEN
                        RAISE EXCEPTION 'the idempotency key of fire time % is held by run %, which this schedule did not make; delete or re-key that run, then resume_schedule',
                            v_fire, v_enq.run_id USING ERRCODE = 'ZP011';
                    END IF;
                    -- The firer's own run of this fire time: record that one.
                    UPDATE zeroth.schedule_fires f SET run_id = v_enq.run_id
                     WHERE f.schedule_id = v_s.schedule_id AND f.fire_at = v_fire;
                END IF;
                v_fired := v_fired + 1;
                v_rows := v_rows || ROW(v_s.schedule_id, v_s.tenant_id, v_s.workspace_id, v_s.name,
                                        v_s.deployment_ref, v_fire, v_enq.run_id, v_enq.created,
                                        v_skipped, NULL)::zeroth.schedule_fire;
            END LOOP;
            v_next := coalesce(v_next, zeroth._schedule_next(v_s.cron, v_s.interval_seconds, v_s.anchor_at,
                                                             v_s.time_zone,
                                                             greatest(v_now, v_s.last_fire_at,
                                                                      v_times[cardinality(v_times)])));
            UPDATE zeroth.schedules AS s
               SET next_fire_at = v_next,
                   last_fire_at = CASE WHEN cardinality(v_times) > 0
                                       THEN greatest(s.last_fire_at, v_times[cardinality(v_times)])
                                       ELSE s.last_fire_at END,
                   fire_count = s.fire_count + v_fired,
                   skipped_count = s.skipped_count + v_skipped,
                   updated_at = v_now
             WHERE s.schedule_id = v_s.schedule_id;
            -- Keep a week of fire records (last_fire_at guards older fire times).
            DELETE FROM zeroth.schedule_fires f
             WHERE f.schedule_id = v_s.schedule_id AND f.fire_at < v_now - interval '7 days';
            v_out := v_out || v_rows;
            v_budget := v_budget - cardinality(v_times);
        EXCEPTION WHEN OTHERS THEN
            -- Nothing of this schedule's fire is kept (the subtransaction rolled back). Paused, not
            -- moved on: the row is wrong and would raise at every call; a DBA fixes it and
            -- resume_schedule (list_schedules shows last_error).
            GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_msg = MESSAGE_TEXT;
            -- A transient failure (serialization, deadlock, lock timeout, resources, shutdown)
            -- says nothing about the row: the call fails as it would have, the row stays due.
            IF left(v_state, 2) IN ('40', '53', '57', '58') OR v_state = '55P03' THEN
                RAISE;
            END IF;
            UPDATE zeroth.schedules AS s
               SET paused = true,
                   last_error = left(v_state || ': ' || v_msg, 1000),
                   last_error_at = v_now,
                   updated_at = v_now
             WHERE s.schedule_id = v_s.schedule_id;
        END;
    END LOOP;

    v_next := (SELECT min(s.next_fire_at)
                 FROM zeroth.schedules s
                WHERE s.deployment_ref = ANY (v_deps)
                  AND NOT s.paused
                  AND s.next_fire_at IS NOT NULL
                  AND (v_tenants IS NULL
                       OR (s.tenant_id, s.workspace_key) IN (SELECT t.tenant_id, t.workspace_key
                                                               FROM unnest(v_tenants, v_wskeys) AS t(tenant_id, workspace_key))));
    IF cardinality(v_out) = 0 THEN
        RETURN NEXT ROW(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, v_next)::zeroth.schedule_fire;
        RETURN;
    END IF;
    RETURN QUERY SELECT o.schedule_id, o.tenant_id, o.workspace_id, o.name, o.deployment_ref, o.fire_at,
                        o.run_id, o.created, o.skipped, v_next
                   FROM unnest(v_out) AS o;
END
$$;
COMMENT ON FUNCTION zeroth.fire_due_schedules(text[], text[], text[], integer, integer) IS
'fire_due_schedules: the due fire times of the schedules of these deployments (listed scopes, or tenant_ids NULL: every scope) become runs, exactly once: up to max_schedules due unpaused schedules locked FOR UPDATE SKIP LOCKED; the missed-fire policy picks the fire times after last_fire_at, the high-water mark (skip: the most recent if late by at most misfire_grace_seconds; catch_up: the catch_up_limit most recent); each is recorded in schedule_fires (primary key schedule + fire time) and enqueued (idempotency key zeroth-schedule:<id>:<fire time>, a prefix no caller may use; metadata zeroth_schedule; runs.schedule_id); a run already under that key counts as the fire only if this schedule made it (runs.schedule_id), else the schedule is paused with last_error ZP011; next_fire_at moves past now. At most max_fires runs per call (the rest stay due for the next call). A schedule whose fire raises (a row a manual UPDATE broke) is paused with last_error and the others fire. Rows: one per fire, or one with schedule_id NULL; next_due_at = the earliest next fire time served. Raises ZP006 invalid_scope, ZP008 invalid_argument. Notifies zeroth_wakeup (as enqueue_run). Time: clock_timestamp().';
ALTER FUNCTION zeroth.fire_due_schedules(text[], text[], text[], integer, integer) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.fire_due_schedules(text[], text[], text[], integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.fire_due_schedules(text[], text[], text[], integer, integer) TO zeroth_worker;
