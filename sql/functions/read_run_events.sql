-- read_run_events: a run's events after event id `after`, in order, at most max_events, then
-- END once the run has ended: the stored END (kind 'end', written by zeroth._settle for a run
-- that has events) or, for a run ended with none stored (it emitted nothing, or another path
-- ended it), one made here from its terminal status, numbered after its last event. A reader
-- already past the END gets the END again, so a reconnect learns the run ended. A run not found
-- in this scope (never created, another scope's, pruned) reads as END with status NULL and
-- outcome 'not_found'. Locks nothing; notifies nothing. Raises ZP006, ZP008.
CREATE OR REPLACE FUNCTION zeroth.read_run_events(
    run_id       uuid,
    after        bigint  DEFAULT 0,
    max_events   integer DEFAULT 100,
    tenant_id    text    DEFAULT NULL,
    workspace_id text    DEFAULT NULL)
    RETURNS TABLE (event_id bigint, kind text, name text, data jsonb, lease_generation bigint,
                   created_at timestamptz)
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_tenant  text := zeroth._scope_tenant(read_run_events.tenant_id, read_run_events.workspace_id);
    v_wskey   text := zeroth._workspace_key(read_run_events.workspace_id);
    v_run     record;
    v_last    bigint;
    v_count   bigint;
BEGIN
    IF v_tenant IS NULL THEN
        RAISE EXCEPTION 'a workspace_id needs a tenant_id' USING ERRCODE = 'ZP006';
    END IF;
    PERFORM zeroth._require(read_run_events.run_id IS NOT NULL, 'run_id must not be NULL');
    -- (below the largest bigint: an END is numbered after + 1 for a run not found)
    PERFORM zeroth._require(read_run_events.after IS NOT NULL AND read_run_events.after >= 0
                            AND read_run_events.after < 9223372036854775807,
                            'after must be an event id >= 0 and below 9223372036854775807');
    PERFORM zeroth._require(read_run_events.max_events BETWEEN 1 AND 1000,
                            'max_events must be between 1 and 1000');

    -- The run's status and its last event. STABLE: every statement here reads the one snapshot
    -- of the call. An append commits only while it holds the run's row with a live lease, so a
    -- run seen ended in that snapshot has all its events up to v_last.
    SELECT r.status, r.dead_lettered_at, r.finished_at, r.lease_generation,
           l.event_id AS last_id, l.kind AS last_kind
      INTO v_run
      FROM zeroth.runs r
      LEFT JOIN LATERAL (
            SELECT e.event_id, e.kind FROM zeroth.run_events e
             WHERE e.tenant_id = r.tenant_id AND e.workspace_key = r.workspace_key
               AND e.run_id = r.run_id
             ORDER BY e.event_id DESC LIMIT 1) l ON true
     WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey AND r.run_id = read_run_events.run_id;
    IF NOT FOUND THEN
        RETURN QUERY SELECT read_run_events.after + 1, 'end'::text, 'end'::text,
                            jsonb_build_object('status', NULL, 'outcome', 'not_found'),
                            NULL::bigint, NULL::timestamptz;
        RETURN;
    END IF;
    v_last := coalesce(v_run.last_id, 0);

    RETURN QUERY
    SELECT e.event_id, e.kind, e.name, e.data, e.lease_generation, e.created_at
      FROM zeroth.run_events e
     WHERE e.tenant_id = v_tenant AND e.workspace_key = v_wskey AND e.run_id = read_run_events.run_id
       AND e.event_id > read_run_events.after AND e.event_id <= v_last
     ORDER BY e.event_id
     LIMIT read_run_events.max_events;
    GET DIAGNOSTICS v_count = ROW_COUNT;

    -- END: only once the run has ended and this batch reached its last event.
    -- Event ids are 1..v_last without a gap, so the batch reached the last event when after +
    -- the rows returned is v_last or more.
    IF v_run.status NOT IN ('completed', 'failed', 'cancelled')
       OR read_run_events.after + v_count < v_last
       OR v_count >= read_run_events.max_events THEN
        RETURN;
    END IF;
    IF v_run.last_kind = 'end' THEN
        -- A stored END, already in this batch unless the reader was past it.
        IF read_run_events.after >= v_last THEN
            RETURN QUERY
            SELECT e.event_id, e.kind, e.name, e.data, e.lease_generation, e.created_at
              FROM zeroth.run_events e
             WHERE e.tenant_id = v_tenant AND e.workspace_key = v_wskey
               AND e.run_id = read_run_events.run_id AND e.event_id = v_last;
        END IF;
        RETURN;
    END IF;
    RETURN QUERY SELECT v_last + 1, 'end'::text, 'end'::text,
                        jsonb_build_object('status', v_run.status,
                                           'outcome', CASE WHEN v_run.dead_lettered_at IS NOT NULL
                                                           THEN 'dead_lettered'
                                                           ELSE v_run.status::text END),
                        v_run.lease_generation, v_run.finished_at;
END
$$;
COMMENT ON FUNCTION zeroth.read_run_events(uuid, bigint, integer, text, text) IS
'read_run_events: the run''s events with event_id > after, in order, at most max_events (1..1000), then END (kind ''end'', data {status, outcome}) once the run has ended and the batch reached its last event: the END stored by the settle path, or one made from the terminal status (numbered after the last event) for a run ended with none stored. A reader past the END gets it again; a run not found in this scope (never created, another scope''s, pruned) reads as END with status NULL and outcome ''not_found''. Locks nothing; notifies nothing. Raises ZP006, ZP008.';
ALTER FUNCTION zeroth.read_run_events(uuid, bigint, integer, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.read_run_events(uuid, bigint, integer, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.read_run_events(uuid, bigint, integer, text, text) TO zeroth_worker;
