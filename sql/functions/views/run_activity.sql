-- sql/functions/views/run_activity.sql: the operator view zeroth.run_activity. Re-applied by
-- every upgrade (sql/README.md).
-- Runs finished per minute over the last hour, per scope: the dashboard's chart (issue 17).
-- The hour is a range of runs_finished_idx (finished_at leading, partial on the finished
-- statuses), so the view reads the last hour's finished runs and nothing older.
-- security_invoker: the view reads as its caller, so zeroth_reader's row-level security
-- policy on zeroth.runs filters it to one tenant.
CREATE OR REPLACE VIEW zeroth.run_activity WITH (security_invoker = true) AS
SELECT date_trunc('minute', r.finished_at) AS minute,
       r.tenant_id,
       r.workspace_id,
       r.deployment_ref,
       count(*) FILTER (WHERE r.status = 'completed') AS completed,
       count(*) FILTER (WHERE r.status = 'failed') AS failed,
       count(*) FILTER (WHERE r.status = 'cancelled') AS cancelled
  FROM zeroth.runs r
 WHERE r.status IN ('completed', 'failed', 'cancelled')
   AND r.finished_at >= date_trunc('minute', clock_timestamp()) - interval '59 minutes'
 GROUP BY date_trunc('minute', r.finished_at), r.tenant_id, r.workspace_id, r.deployment_ref;
COMMENT ON VIEW zeroth.run_activity IS 'Runs completed, failed (dead letters included) and cancelled per minute (date_trunc of finished_at, database clock) and per (tenant, workspace, deployment), over the current minute and the 59 before it. Uses runs_finished_idx.';
ALTER VIEW zeroth.run_activity OWNER TO zeroth_owner;
REVOKE ALL ON zeroth.run_activity FROM PUBLIC;
GRANT SELECT ON zeroth.run_activity TO zeroth_reader;
