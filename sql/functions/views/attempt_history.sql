-- sql/functions/views/attempt_history.sql: the attempt history of runs, for readers. Re-applied by
-- every upgrade (sql/README.md).
-- Two parts: the ended attempts (the view zeroth.run_attempts, one row each: the rows of
-- zeroth.run_attempt_log, written by the settle path or the trigger runs_attempt_history when the
-- attempt ended, and the attempt that completed a run at its first claim, kept in the run's own
-- row: sql/functions/views/run_attempts.sql) and the open attempt of every run that has a
-- holder, read from its zeroth.runs row (the hot path writes no history row when it claims or
-- starts: sql/functions/internal/attempts.sql). The open attempt's number, claimed_at and
-- started_at are computed as the trigger will record them when it ends.
-- security_invoker: the view reads as its caller, so zeroth_reader's row-level security policies
-- on zeroth.run_attempt_log and zeroth.runs (both: the tenant named in zeroth.tenant_id) filter it.
-- A pruned run's history is gone with it (prune_runs); a reader listing one run's attempts filters
-- on (tenant_id, workspace_key, run_id) and reads the history's index and the run's primary key
-- (zeroth.runs has no index on run_id alone: issue 30).
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
       a.error,
       a.workspace_key
  FROM zeroth.run_attempts a
UNION ALL
SELECT r.tenant_id,
       CASE WHEN r.workspace_key = '' THEN NULL ELSE substr(r.workspace_key, 3) END,
       r.run_id,
       CASE WHEN r.status = 'running' THEN r.attempts ELSE r.attempts + 1 END,
       r.lease_generation,
       r.lease_worker_id,
       r.lease_acquired_at,
       CASE WHEN r.status = 'running' THEN greatest(r.started_at, r.lease_acquired_at) END,
       NULL::timestamptz,
       NULL::text,
       NULL::jsonb,
       r.workspace_key
  FROM zeroth.runs r
 WHERE r.lease_worker_id IS NOT NULL;
COMMENT ON VIEW zeroth.attempt_history IS 'One row per attempt of a run (a lease generation): holder, attempt number, claimed/started/ended at, and how it ended (outcome NULL while open: completed | failed | dead_lettered | cancelled | recovered | expired | lease_lost | handed_back | released | slept | paused | waited; error when failed). Ended attempts come from zeroth.run_attempts (the settle path and the trigger runs_attempt_history write zeroth.run_attempt_log; the attempt that completed a run at its first claim is kept in the run''s row), the open one from the run''s own row in zeroth.runs; pruned with the run. Order by lease_generation; filter on (tenant_id, workspace_key, run_id) to read one run''s by index.';
ALTER VIEW zeroth.attempt_history OWNER TO zeroth_owner;
REVOKE ALL ON zeroth.attempt_history FROM PUBLIC;
GRANT SELECT ON zeroth.attempt_history TO zeroth_reader;
