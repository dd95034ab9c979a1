-- sql/functions/views/step_list.sql: the operator view zeroth.step_list. Re-applied by every
-- upgrade (sql/README.md).
-- A run's recorded steps (record_step, wait_for_event: the dashboard's run page, issue 17).
-- Filtered on (tenant_id, workspace_key, run_id) it is a range of run_steps_pkey.
-- security_invoker: the view reads as its caller, so zeroth_reader's row-level security
-- policy on zeroth.run_steps (0015) filters it to one tenant.
CREATE OR REPLACE VIEW zeroth.step_list WITH (security_invoker = true) AS
SELECT s.tenant_id,
       s.workspace_key,
       s.run_id,
       s.step_key,
       s.attempt,
       s.lease_generation,
       s.recorded_at,
       s.result
  FROM zeroth.run_steps s;
COMMENT ON VIEW zeroth.step_list IS 'Every recorded step result: its key, the attempt and lease generation that recorded it (first write wins), when, and the result. Filter on (tenant_id, workspace_key, run_id) to use run_steps_pkey.';
ALTER VIEW zeroth.step_list OWNER TO zeroth_owner;
REVOKE ALL ON zeroth.step_list FROM PUBLIC;
GRANT SELECT ON zeroth.step_list TO zeroth_reader;
