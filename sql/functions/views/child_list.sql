-- sql/functions/views/child_list.sql: the operator view zeroth.child_list. Re-applied by every
-- upgrade (sql/README.md).
-- A parent run's children (start_child_run) with each child's current status: the dashboard's
-- run page links a parent to its children and back (issue 31). Filtered on (tenant_id,
-- workspace_key, parent_run_id) it is a range of child_runs_pkey, each child found by the runs
-- primary key.
-- security_invoker: the view reads as its caller, so zeroth_reader's row-level security
-- policies on zeroth.child_runs and zeroth.runs filter it to one tenant.
CREATE OR REPLACE VIEW zeroth.child_list WITH (security_invoker = true) AS
SELECT c.tenant_id,
       c.workspace_key,
       c.parent_run_id,
       c.step_key,
       c.child_run_id,
       c.deployment_ref,
       c.detached,
       c.created_at,
       coalesce(r.status, c.status) AS status,
       coalesce(r.finished_at, c.finished_at) AS finished_at,
       c.dead_lettered
  FROM zeroth.child_runs c
  LEFT JOIN zeroth.runs r
         ON r.tenant_id = c.tenant_id AND r.workspace_key = c.workspace_key
        AND r.run_id = c.child_run_id;
COMMENT ON VIEW zeroth.child_list IS 'Every child run per parent and step key (start_child_run), with the child''s current status and finish time (its copied outcome once the child row was pruned) and whether it was detached. Filter on (tenant_id, workspace_key, parent_run_id) to use child_runs_pkey.';
ALTER VIEW zeroth.child_list OWNER TO zeroth_owner;
REVOKE ALL ON zeroth.child_list FROM PUBLIC;
GRANT SELECT ON zeroth.child_list TO zeroth_reader;
