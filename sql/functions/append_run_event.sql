-- append_run_event: the live lease holder of a running run appends an event to the run's stream
-- (name, JSON data), numbered after the run's last event. Locks the run row
-- (zeroth._lock_leased_run), reads the clock, then inserts with the fence in the INSERT's
-- predicate: a stale holder, an expired or taken-over lease appends nothing and gets NULL. The
-- number is taken under the row lock, so events commit in number order (no gap a reader could
-- skip). Returns the event id. Notifies zeroth_run_events with the run's key (notify => false:
-- no hint). A run holds at most its deployment's max_run_events events (NULL or no deployment
-- row: 10,000; END not counted): past it the live holder gets ZP014 and nothing is stored.
-- Raises ZP003 (holder but not running), ZP008, ZP014. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.append_run_event(
    run_id       uuid,
    worker_id    text,
    generation   bigint,
    name         text,
    data         jsonb   DEFAULT 'null'::jsonb,
    tenant_id    text    DEFAULT NULL,
    workspace_id text    DEFAULT NULL,
    notify       boolean DEFAULT true)
    RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now    timestamptz;
    v_tenant text := zeroth._scope_tenant(append_run_event.tenant_id, append_run_event.workspace_id);
    v_wskey  text := zeroth._workspace_key(append_run_event.workspace_id);
    v_status zeroth.run_status;
    v_id     bigint;
    v_last   bigint;
    v_max    integer;
BEGIN
    PERFORM zeroth._require_fence(append_run_event.run_id, append_run_event.worker_id,
                                  append_run_event.generation);
    PERFORM zeroth._require_identifier(append_run_event.name, 'name');
    -- The name is an SSE `event:` field and a log line: no line breaks or other control characters.
    PERFORM zeroth._require(append_run_event.name !~ '[[:cntrl:]]', 'name must not hold control characters');
    -- `end` is END's name (the SSE `event: end` that closes a browser's stream): reserved.
    PERFORM zeroth._require(append_run_event.name <> 'end', 'name must not be ''end'' (reserved for END)');
    PERFORM zeroth._require(append_run_event.data IS NOT NULL, 'data must not be NULL (JSON null is ''null''::jsonb)');
    PERFORM zeroth._require(octet_length(append_run_event.data::text) <= 65536,
                            'data may hold at most 64 kB (as JSON text)');
    -- Nested at most 256 levels (an item at level 256, the root being 0, is one too deep): every
    -- reader decodes each event (Python's json.loads stops near 1,000 levels, less the caller's
    -- stack), and an event none can decode would stop every subscriber at it, for ever. Walked
    -- only once the size is known to be bounded.
    PERFORM zeroth._require(NOT jsonb_path_exists(append_run_event.data, 'strict $.**{256}'),
                            'data may nest at most 256 levels deep');
    -- Numbers within a double's range: PostgreSQL prints 1e5000 as its 5001 digits, which
    -- Python's json.loads refuses (more than 4,300 digits) and a browser reads as Infinity.
    PERFORM zeroth._require(NOT jsonb_path_exists(append_run_event.data,
                                'strict $.** ? (@.type() == "number" && (@ >= 1e308 || @ <= -1e308))'),
                            'data numbers must lie strictly between -1e308 and 1e308');
    PERFORM zeroth._require(append_run_event.notify IS NOT NULL, 'notify must not be NULL');

    -- The run row first, then the clock: see zeroth._lock_leased_run. The row lock is held until
    -- commit, so the next append (or the END of zeroth._settle) numbers after this one.
    v_status := zeroth._lock_leased_run(v_tenant, v_wskey, append_run_event.run_id,
                                        append_run_event.worker_id, append_run_event.generation);
    v_now := zeroth._now();
    -- The bound on the run's events (issue 34): the next number is the count of the run's events
    -- plus one (numbered 1, 2, 3… with no gap, END not among them until the run ended), so the
    -- run's deployment's max_run_events (NULL or no row: 10,000) is read only once a run passed
    -- 100 events, the least bound a deployment may set (the OR's first arm spares the probe).
    INSERT INTO zeroth.run_events AS e (tenant_id, workspace_key, run_id, event_id, kind, name, data,
                                        lease_generation, created_at)
    SELECT r.tenant_id, r.workspace_key, r.run_id, n.next_id,
           'event', append_run_event.name, append_run_event.data, r.lease_generation, v_now
      FROM zeroth.runs r
     CROSS JOIN LATERAL (
            SELECT coalesce(max(l.event_id), 0) + 1 AS next_id FROM zeroth.run_events l
             WHERE l.tenant_id = r.tenant_id AND l.workspace_key = r.workspace_key
               AND l.run_id = r.run_id) n
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = append_run_event.run_id
       AND v_status = 'running'
       AND r.lease_worker_id = append_run_event.worker_id
       AND r.lease_generation = append_run_event.generation
       AND r.lease_expires_at >= v_now
       AND (n.next_id <= 100
            OR n.next_id <= coalesce((SELECT d.max_run_events FROM zeroth.deployments d
                                       WHERE d.deployment_ref = r.deployment_ref), 10000))
    RETURNING e.event_id INTO v_id;
    IF v_id IS NULL THEN
        -- The live holder at its run's bound: ZP014, nothing stored. Anyone else (a stale or
        -- foreign holder) learns nothing of the stream: NULL or ZP003, as before.
        SELECT n.last_id, coalesce(d.max_run_events, 10000)
          INTO v_last, v_max
          FROM zeroth.runs r
          LEFT JOIN zeroth.deployments d ON d.deployment_ref = r.deployment_ref
         CROSS JOIN LATERAL (
                SELECT coalesce(max(l.event_id), 0) AS last_id FROM zeroth.run_events l
                 WHERE l.tenant_id = r.tenant_id AND l.workspace_key = r.workspace_key
                   AND l.run_id = r.run_id) n
         WHERE r.tenant_id = v_tenant
           AND r.workspace_key = v_wskey
           AND r.run_id = append_run_event.run_id
           AND v_status = 'running'
           AND r.lease_worker_id = append_run_event.worker_id
           AND r.lease_generation = append_run_event.generation
           AND r.lease_expires_at >= v_now;
        IF v_last IS NOT NULL AND v_last >= v_max THEN
            RAISE EXCEPTION 'run % holds % events, the most its deployment allows (max_run_events)', append_run_event.run_id, v_max
                USING ERRCODE = 'ZP014',
                      HINT = 'a DBA raises the bound with UPDATE zeroth.deployments SET max_run_events = ...';
        END IF;
        PERFORM zeroth._explain_fenced_miss(v_tenant, v_wskey, append_run_event.run_id,
                                            append_run_event.worker_id, append_run_event.generation,
                                            v_now, 'append_run_event', '{running}');
        RETURN NULL;
    END IF;
    IF append_run_event.notify THEN
        PERFORM zeroth._notify_run_events(v_tenant, v_wskey, append_run_event.run_id);
    END IF;
    RETURN v_id;
END
$$;
COMMENT ON FUNCTION zeroth.append_run_event(uuid, text, bigint, text, jsonb, text, text, boolean) IS
'append_run_event: the live lease holder (worker_id, generation) of a running run appends an event (name: at most 200 characters, no control characters, not ''end'' (END''s name); data: JSON, at most 64 kB, nested at most 256 levels deep, numbers strictly between -1e308 and 1e308) to the run''s stream, numbered after its last event under the run''s row lock, so events commit in number order. Returns the event id; NULL when fenced out (stale, expired or taken-over lease). Notifies zeroth_run_events with run_events_key (notify => false: no hint). A run holds at most its deployment''s max_run_events events (zeroth.deployments, a DBA''s; NULL or no row: 10,000; END not counted): past it the live holder gets ZP014 and nothing is stored. Raises ZP003 (holder but not running), ZP008, ZP014 run_events_limit. Time: clock_timestamp().';
ALTER FUNCTION zeroth.append_run_event(uuid, text, bigint, text, jsonb, text, text, boolean) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.append_run_event(uuid, text, bigint, text, jsonb, text, text, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.append_run_event(uuid, text, bigint, text, jsonb, text, text, boolean) TO zeroth_worker;
