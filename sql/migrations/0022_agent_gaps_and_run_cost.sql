-- 0022_agent_gaps_and_run_cost: state changes for the work of the session of 2026-12-06: what
-- long agent runs still lacked (run deadlines of waiting runs, stream and version limits; issue
-- 34), the per-run cost of the hot path (issue 30), high availability (issue 35) and the test
-- suite (issue 32).
--
-- Each section below names the issue it answers; the functions that use this state are in
-- sql/functions/ and are re-applied after this file in the same upgrade.
SELECT 1;

-- ===== section: run deadlines of waiting runs, one settle path (issue 34) =====

-- ===== section: stream limits and code versions (issue 34) =====

-- ===== section: per-run cost of the hot path (issue 30) =====

-- The attempt that completes a run at its first claim (lease generation 1: most runs) is kept in
-- the run's own row instead of a row of the attempt history: zeroth._settle sets these two
-- columns in the completing UPDATE, which writes the row anyway, and inserts no history row nor
-- its index entry (about 220 bytes of WAL a run, bench/results/2026-12-06-walcut). What readers
-- read is unchanged: the table of ended attempts is renamed zeroth.run_attempt_log (its index,
-- row-level security policy and grant go with it), and zeroth.run_attempts becomes a view
-- (sql/functions/views/run_attempts.sql) with the same columns: the log's rows and the attempts
-- kept in runs rows, each filtered by its table's policy for zeroth_reader. The writers (the settle
-- path, the trigger runs_attempt_history, prune_runs) write the log.
ALTER TABLE zeroth.run_attempts RENAME TO run_attempt_log;
COMMENT ON TABLE zeroth.run_attempt_log IS 'Attempt history, ended attempts, as stored: one row per lease generation of a run (a claim) once it ended, with its holder, attempt number, when it was claimed, started and ended, and how it ended (outcome; error when it failed) — but for the attempt that completed a run at its first claim, kept in the run''s row (zeroth.runs.completed_worker_id). Written when the attempt ends: by the settle path (zeroth._settle) in the settling statement, and by the trigger runs_attempt_history on zeroth.runs for every other end; deleted with the run by prune_runs. Readers read zeroth.run_attempts (every ended attempt) or zeroth.attempt_history (and the open ones), the rows of the tenant named in zeroth.tenant_id.';
ALTER TABLE zeroth.runs
    ADD COLUMN completed_worker_id text,
    ADD COLUMN completed_claimed_at timestamptz;
COMMENT ON COLUMN zeroth.runs.completed_worker_id IS 'The holder of the attempt that completed this run at its first claim (lease generation 1), written by zeroth._settle instead of a zeroth.run_attempt_log row; NULL otherwise (every other ended attempt is a row of the log). The view zeroth.run_attempts shows that attempt from this row: attempt runs.attempts, lease generation 1, claimed at completed_claimed_at, started at the later of started_at and that, ended at finished_at, outcome completed.';
COMMENT ON COLUMN zeroth.runs.completed_claimed_at IS 'When the attempt of completed_worker_id was claimed (its lease_acquired_at); NULL when completed_worker_id is.';

-- ===== section: high availability (issue 35) =====

-- ===== section: test suite (issue 32) =====
