-- sql/functions/internal/run_events.sql: the run event stream's opaque NOTIFY key (issue 34,
-- item 1). Internal helpers: SECURITY INVOKER, executable by zeroth_owner only (they run inside
-- the SECURITY DEFINER public functions). Re-applied by every upgrade (sql/README.md).

-- The payload of zeroth_run_events for one run: a key derived from the owner-only secret
-- (zeroth._notify_key), so a listener without EXECUTE on run_events_key learns only that some
-- run's stream moved, never which.
CREATE OR REPLACE FUNCTION zeroth._run_events_key(tenant_id text, workspace_key text, run_id uuid)
    RETURNS text
    LANGUAGE sql STABLE
    RETURN zeroth._notify_key('run_events', ARRAY[tenant_id, workspace_key, run_id::text]);
COMMENT ON FUNCTION zeroth._run_events_key(text, text, uuid) IS 'Internal: the opaque zeroth_run_events payload of a run (32 hex digits of sha256(secret, ''run_events'', scope and run)).';
ALTER FUNCTION zeroth._run_events_key(text, text, uuid) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._run_events_key(text, text, uuid) FROM PUBLIC;

-- A hint that the run's stream moved (an event appended, its END written): NOTIFY
-- zeroth_run_events with the run's key, through zeroth._notify (dropped while the queue is half
-- full: subscribers re-read on their slow poll). Identical payloads fold within a transaction.
CREATE OR REPLACE FUNCTION zeroth._notify_run_events(tenant_id text, workspace_key text, run_id uuid)
    RETURNS void
    LANGUAGE sql VOLATILE
    BEGIN ATOMIC
        SELECT zeroth._notify('zeroth_run_events', zeroth._run_events_key(tenant_id, workspace_key, run_id));
    END;
COMMENT ON FUNCTION zeroth._notify_run_events(text, text, uuid) IS 'Internal: NOTIFY zeroth_run_events with the run''s opaque key (a hint: subscribers re-read from their last event id).';
ALTER FUNCTION zeroth._notify_run_events(text, text, uuid) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._notify_run_events(text, text, uuid) FROM PUBLIC;
