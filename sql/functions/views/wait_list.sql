-- sql/functions/views/wait_list.sql: the operator view zeroth.wait_list. Re-applied by every
-- upgrade (sql/README.md).
-- A run's event waits (wait_for_event: the dashboard's run page, issue 17), with whether the
-- event was emitted. A wait is kept until its step result is recorded, so a row here is a wait
-- still open or woken and not yet replayed. Filtered on (tenant_id, workspace_key, run_id) it
-- is a range of event_waits_pkey, and each event a lookup in events_pkey.
-- security_invoker: the view reads as its caller, so zeroth_reader's row-level security
-- policies on zeroth.event_waits and zeroth.events (0015) filter it to one tenant.
CREATE OR REPLACE VIEW zeroth.wait_list WITH (security_invoker = true) AS
SELECT w.tenant_id,
       w.workspace_key,
       w.run_id,
       w.step_key,
       w.name,
       w.created_at,
       w.timeout_at,
       e.emitted_at
  FROM zeroth.event_waits w
  LEFT JOIN zeroth.events e
         ON e.tenant_id = w.tenant_id AND e.workspace_key = w.workspace_key AND e.name = w.name;
COMMENT ON VIEW zeroth.wait_list IS 'Every open event wait: the run, the step key its result will be recorded under, the event name, when the wait began, when it times out (NULL: never) and when the event was emitted (NULL: not yet). Filter on (tenant_id, workspace_key, run_id) to use event_waits_pkey.';
ALTER VIEW zeroth.wait_list OWNER TO zeroth_owner;
REVOKE ALL ON zeroth.wait_list FROM PUBLIC;
GRANT SELECT ON zeroth.wait_list TO zeroth_reader;
