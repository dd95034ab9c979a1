-- sql/functions/views/run_attempts.sql: the ended attempts of runs, for readers. Re-applied by
-- every upgrade (sql/README.md).
-- Two parts (issue 30, migration 0022): the rows of zeroth.run_attempt_log (written when the
-- attempt ended, by the settle path or the trigger runs_attempt_history) and the attempt that
-- completed a run at its first claim, which zeroth._settle keeps in the run's own row
-- (completed_worker_id, completed_claimed_at) instead of a log row. Its number, started_at and
-- ended_at are read from the row as the settle path would have recorded them (attempts, the later
-- of started_at and the claim, finished_at); a completed run changes no more through the
-- functions (prune_runs deletes it with its history).
-- security_invoker: the view reads as its caller, so zeroth_reader's row-level security policies
-- on zeroth.run_attempt_log and zeroth.runs (both: the tenant named in zeroth.tenant_id) filter
-- it. A reader listing one run's attempts filters on (tenant_id, workspace_key, run_id): the log's
-- index (run_attempts_run_idx) and the run's primary key.
CREATE OR REPLACE VIEW zeroth.run_attempts WITH (security_invoker = true) AS
SELECT a.tenant_id,
       a.workspace_key,
       a.run_id,
       a.attempt,
       a.lease_generation,
       a.worker_id,
       a.claimed_at,
       a.started_at,
       a.ended_at,
       a.outcome,
       a.error
  FROM zeroth.run_attempt_log a
UNION ALL
SELECT r.tenant_id,
       r.workspace_key,
       r.run_id,
       r.attempts,
       1::bigint,
       r.completed_worker_id,
       r.completed_claimed_at,
       greatest(r.started_at, r.completed_claimed_at),
       r.finished_at,
       'completed'::text,
       NULL::jsonb
  FROM zeroth.runs r
 WHERE r.completed_worker_id IS NOT NULL;
COMMENT ON VIEW zeroth.run_attempts IS 'Attempt history, ended attempts: one row per lease generation of a run (a claim) once it ended, with its holder, attempt number, when it was claimed, started and ended, and how it ended (outcome: completed | failed | dead_lettered | cancelled | recovered | expired | lease_lost | handed_back | released | slept | paused | waited | timed_out; error when it failed). The rows of zeroth.run_attempt_log and the attempt that completed a run at its first claim, kept in the run''s row (zeroth.runs.completed_worker_id: issue 30). Pruned with the run. zeroth_reader reads the rows of the tenant named in zeroth.tenant_id; filter on (tenant_id, workspace_key, run_id) to read one run''s by index.';
ALTER VIEW zeroth.run_attempts OWNER TO zeroth_owner;
REVOKE ALL ON zeroth.run_attempts FROM PUBLIC;
GRANT SELECT ON zeroth.run_attempts TO zeroth_reader;
