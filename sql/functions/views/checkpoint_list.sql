-- sql/functions/views/checkpoint_list.sql: the operator view zeroth.checkpoint_list. Re-applied
-- by every upgrade (sql/README.md).
-- A run's checkpoints in order (the dashboard's run page, issue 17). Filtered on (tenant_id,
-- workspace_key, run_id), which run_list gives, it is a range of checkpoints_run_order_idx.
-- security_invoker: the view reads as its caller, so zeroth_reader's row-level security
-- policy on zeroth.checkpoints filters it to one tenant.
CREATE OR REPLACE VIEW zeroth.checkpoint_list WITH (security_invoker = true) AS
SELECT c.tenant_id,
       c.workspace_key,
       c.run_id,
       c.checkpoint_order,
       c.checkpoint_id,
       c.lease_generation,
       c.created_at,
       c.data
  FROM zeroth.checkpoints c;
COMMENT ON VIEW zeroth.checkpoint_list IS 'Every checkpoint of every run: its order within the run, the lease generation that saved it, when, and its data. Filter on (tenant_id, workspace_key, run_id) to use checkpoints_run_order_idx.';
ALTER VIEW zeroth.checkpoint_list OWNER TO zeroth_owner;
REVOKE ALL ON zeroth.checkpoint_list FROM PUBLIC;
GRANT SELECT ON zeroth.checkpoint_list TO zeroth_reader;
