-- 0022_agent_gaps_and_run_cost: state changes for the work of the session of 2026-12-06: what
-- long agent runs still lacked (run deadlines of waiting runs, stream and version limits; issue
-- 34), the per-run cost of the hot path (issue 30), high availability (issue 35) and the test
-- suite (issue 32).
--
-- Each section below names the issue it answers; the functions that use this state are in
-- sql/functions/ and are re-applied after this file in the same upgrade.
SELECT 1;

-- ===== section: run deadlines of waiting runs, one settle path (issue 34) =====
-- Issue 34 item 2, the gap 0021 left: a run that is waiting (paused, or waiting for an event or
-- its children) or sleeping (pending, not due) past its run deadline was ended only once a claim
-- met it pending and due. The sweep (zeroth.wake_due_waits, run by every RunWorker's orphan
-- sweep) now ends every pending or waiting run nobody holds a live lease on past its run
-- deadline, and the claims' end of a pending one goes through the settle path too
-- (zeroth._settle kind deadline, zeroth._end_past_run_deadline).
--
-- The edge of the state machine a waiting run takes (0021 listed the pending one, 46).
INSERT INTO zeroth.run_transitions (edge_no, from_status, outcome, to_status, label) VALUES
    (47, 'waiting', 'run_timed_out', 'failed', 'the sweep (wake_due_waits) finds a waiting run (paused, or waiting for an event or its children) past its run deadline (settled, stop_reason run_timeout; no attempt ends: the wait gave it back)');
UPDATE zeroth.run_transitions
   SET label = 'a claim or the sweep (wake_due_waits) finds a pending run past its run deadline, due or not (sleeping, in backoff): never started again (settled, stop_reason run_timeout; a lapsed claim''s attempt counted)'
 WHERE edge_no = 46;

-- The runs the sweep looks for: pending or waiting with a run deadline. Partial, so a run without
-- a run timeout (run_deadline_at NULL: every run of a deployment without one, and every run
-- before its first claim) never enters it, nor does a running run: what the hot path pays is the
-- predicate, never an entry. (A status change already makes every update that could enter it a
-- non-HOT one: status is in runs_running_idx.)
CREATE INDEX runs_run_deadline_idx ON zeroth.runs (run_deadline_at)
    WHERE run_deadline_at IS NOT NULL AND status IN ('pending', 'waiting');
COMMENT ON INDEX zeroth.runs_run_deadline_idx IS 'The pending and waiting runs that have a run deadline, by deadline: what zeroth.wake_due_waits reads to end those past it (issue 34 item 2).';

-- zeroth._end_past_run_deadline now says whether it ended the run (boolean, not void): its file
-- creates it again (IF EXISTS: a fresh install creates the functions after the migrations).
DROP FUNCTION IF EXISTS zeroth._end_past_run_deadline(text, text, uuid, timestamptz);


-- ===== section: stream limits and code versions (issue 34) =====
--
-- A run's event stream is bounded in events (each event was bounded at 64 kB, the number was
-- not): deployments.max_run_events (NULL: the default, 10,000), checked by append_run_event under
-- the run's row lock, past it ZP014 and nothing stored. A DBA's column: zeroth_worker has no
-- UPDATE on zeroth.deployments, so no worker raises its own bound.
ALTER TABLE zeroth.deployments
    ADD COLUMN max_run_events integer,
    ADD CONSTRAINT deployments_max_run_events_valid CHECK (
        max_run_events IS NULL OR max_run_events BETWEEN 100 AND 10000000);
COMMENT ON COLUMN zeroth.deployments.max_run_events IS 'Bound on the events one run of the deployment may append to its stream (append_run_event; END is not counted): 100 to 10,000,000; NULL: the default, 10,000. Past it append_run_event raises ZP014 and stores nothing. Set by a DBA (UPDATE zeroth.deployments): no function or worker writes it; read at each append past the 100th event of a run.';

-- zeroth.code_versions was never pruned: prune_runs (called for every tenant) now deletes the
-- versions no run references. "No run references it" is a probe of this index per version; it
-- holds only the runs that carry a version (an unversioned run is never in it).
CREATE INDEX runs_code_version_idx ON zeroth.runs (code_version_id)
    WHERE code_version_id IS NOT NULL;
COMMENT ON INDEX zeroth.runs_code_version_idx IS 'Every run that records a code version, by version (prune_runs: whether any run still references a zeroth.code_versions row). Runs without a version are not in it.';

-- admit_run and start_run take the caller's code_version (trailing, DEFAULT NULL: every call that
-- worked before works the same): an owned admission and a first start record it as a claim does.
-- Their files create the new signatures; the old ones would stay beside them and make calls
-- ambiguous, so they go here (IF EXISTS: a fresh install creates the functions after the
-- migrations).
DROP FUNCTION IF EXISTS zeroth.admit_run(text, text, text, text, jsonb, text, text, double precision, double precision, text, jsonb, uuid, integer, integer, boolean, bigint);
DROP FUNCTION IF EXISTS zeroth.start_run(uuid, text, bigint, text, text);

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
