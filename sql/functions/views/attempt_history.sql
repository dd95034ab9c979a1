-- sql/functions/views/attempt_history.sql: the attempt history of runs, for readers. Re-applied by
-- every upgrade (sql/README.md).
-- security_invoker: the view reads as its caller, so zeroth_reader's row-level security policy on
-- zeroth.run_attempts filters it to the tenant named in zeroth.tenant_id. No join to zeroth.runs:
-- a pruned run's history is gone with it (prune_runs), and a reader listing one run's attempts
-- reads the history's index only.
CREATE OR REPLACE VIEW zeroth.attempt_history WITH (security_invoker = true) AS
SELECT a.tenant_id,
       CASE WHEN a.workspace_key = '' THEN NULL ELSE substr(a.workspace_key, 3) END AS workspace_id,
       a.run_id,
       a.attempt,
       a.lease_generation,
       a.worker_id,
       a.claimed_at,
       a.started_at,
       a.ended_at,
       a.outcome,
       a.error
  FROM zeroth.run_attempts a;
COMMENT ON VIEW zeroth.attempt_history IS 'One row per attempt of a run (a lease generation): holder, attempt number, claimed/started/ended at, and how it ended (outcome NULL while open: completed | failed | dead_lettered | cancelled | recovered | expired | lease_lost | handed_back | released | slept | paused | waited; error when failed). Written by the SQL side only (trigger runs_attempt_history); pruned with the run. Order by lease_generation.';
ALTER VIEW zeroth.attempt_history OWNER TO zeroth_owner;
REVOKE ALL ON zeroth.attempt_history FROM PUBLIC;
GRANT SELECT ON zeroth.attempt_history TO zeroth_reader;
