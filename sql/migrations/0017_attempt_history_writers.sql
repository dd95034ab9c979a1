-- 0017_attempt_history_writers: the catalog's description of zeroth.run_attempts says who writes
-- it since the completions record their own ended attempts (issue 16).
--
--   * 0016 described the table as written only by the trigger runs_attempt_history. Since then
--     complete_run, complete_runs and complete_and_claim (through zeroth._complete_locked_runs)
--     insert the attempts they complete in the completing statement, set-based, and the trigger
--     writes every other end (failures, hand-backs, sleeps, waits, recoveries, expiries, cancels,
--     a DBA's update as any role). Only the comment changes: no table, index or grant does.
COMMENT ON TABLE zeroth.run_attempts IS 'Attempt history, ended attempts: one row per lease generation of a run (a claim) once it ended, with its holder, attempt number, when it was claimed, started and ended, and how it ended (outcome; error when it failed). Written when the attempt ends (the open attempt is the runs row): by complete_run and zeroth._complete_locked_runs (complete_runs, complete_and_claim) in the completing statement, and by the trigger runs_attempt_history on zeroth.runs for every other end (a DBA''s completion by hand included); deleted with the run by prune_runs. zeroth_reader reads it through zeroth.attempt_history, the rows of the tenant named in zeroth.tenant_id.';
