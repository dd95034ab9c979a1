-- sql/functions/triggers.sql: the triggers on zeroth.runs. Re-applied by every upgrade (sql/README.md),
-- last: CREATE OR REPLACE TRIGGER holds SHARE ROW EXCLUSIVE on zeroth.runs until the upgrade
-- commits, which blocks every write to runs, so nothing after it may wait for another lock.

-- A thread run ended (any function, any path) → zeroth._thread_run_finished
-- (sql/functions/internal/threads.sql) announces it and promotes the thread's queue head.
CREATE OR REPLACE TRIGGER runs_thread_run_finished
    AFTER UPDATE OF status ON zeroth.runs
    FOR EACH ROW
    WHEN (OLD.thread_id IS NOT NULL
          AND OLD.status IN ('pending', 'running', 'waiting')
          AND NEW.status IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION zeroth._thread_run_finished();

-- A child run ended (any function, any path) → zeroth._child_run_finished
-- (sql/functions/internal/children.sql) copies its outcome and wakes a parent whose wait is met.
-- The WHEN is evaluated before any trigger call is queued: a run that is no child (parent_run_id
-- NULL) pays one NULL test (docs/performance.md, "Child runs").
CREATE OR REPLACE TRIGGER runs_child_run_finished
    AFTER UPDATE OF status ON zeroth.runs
    FOR EACH ROW
    WHEN (NEW.parent_run_id IS NOT NULL
          AND OLD.status IN ('pending', 'running', 'waiting')
          AND NEW.status IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION zeroth._child_run_finished();

-- An ended child run is active again (redrive_run, a DBA) → zeroth._child_run_reopened clears its
-- outcome copy and recounts its waiting parent's waits, so a later wait waits for its next end.
CREATE OR REPLACE TRIGGER runs_child_run_reopened
    AFTER UPDATE OF status ON zeroth.runs
    FOR EACH ROW
    WHEN (NEW.parent_run_id IS NOT NULL
          AND OLD.status IN ('completed', 'failed', 'cancelled')
          AND NEW.status IN ('pending', 'running', 'waiting'))
    EXECUTE FUNCTION zeroth._child_run_reopened();

-- A child run deleted before it ended (a DBA; prune_runs deletes ended runs only) →
-- zeroth._child_run_deleted reports it to its parent as cancelled, so no parent waits forever.
CREATE OR REPLACE TRIGGER runs_child_run_deleted
    AFTER DELETE ON zeroth.runs
    FOR EACH ROW
    WHEN (OLD.parent_run_id IS NOT NULL
          AND OLD.status IN ('pending', 'running', 'waiting'))
    EXECUTE FUNCTION zeroth._child_run_deleted();

-- A run was cancelled (any path) → zeroth._cancel_children cancels its unfinished children that
-- were not started detached, and theirs, one generation at a time from this one call (the calls
-- for the descendants it cancels return at once: no nesting per generation, any depth). Cancels
-- are off the hot path; a run without children pays one probe.
CREATE OR REPLACE TRIGGER runs_cancel_children
    AFTER UPDATE OF status ON zeroth.runs
    FOR EACH ROW
    WHEN (OLD.status IN ('pending', 'running', 'waiting') AND NEW.status = 'cancelled')
    EXECUTE FUNCTION zeroth._cancel_children();

-- The attempt history (zeroth._record_attempt, sql/functions/internal/attempts.sql): only an
-- update that ends an attempt fires it — the run had a holder, and the update clears or changes
-- the holder, bumps the generation or changes the status other than by starting the claim
-- (pending → running). Claims from no holder (claim_pending, claim_and_start, admit_run with a
-- worker), start_run, renewals, progress, checkpoints and commit_fenced pay nothing (the WHEN is
-- evaluated before any call); the open attempt is read from zeroth.runs (zeroth.attempt_history).
-- The settle path (zeroth._settle: every lease-ending function of a worker) writes its ended
-- attempts itself, set-based in the settling statement, and marks the row with the generation it
-- recorded (attempt_recorded_generation = the ended lease_generation), so the most frequent ends
-- call no trigger either. Only that statement sets the mark to the generation that ends; an end
-- made by hand (a DBA's UPDATE, as any role, or an admin function) leaves it older and is
-- recorded here. A row that already carried the mark of the generation it ends (a DBA reopened a
-- recorded generation by hand, no claim in between) is recorded here too, and the settle path
-- leaves that end to the trigger.
CREATE OR REPLACE TRIGGER runs_attempt_history
    AFTER UPDATE OF status, lease_generation, lease_worker_id ON zeroth.runs
    FOR EACH ROW
    WHEN (OLD.lease_worker_id IS NOT NULL
          AND (NEW.lease_worker_id IS DISTINCT FROM OLD.lease_worker_id
               OR NEW.lease_generation IS DISTINCT FROM OLD.lease_generation
               OR (NEW.status IS DISTINCT FROM OLD.status
                   AND NOT (OLD.status = 'pending' AND NEW.status = 'running')))
          -- Skipped only when this very update set the mark to the generation it ends: a row
          -- that already carried it (a DBA reopened a recorded generation by hand) is recorded.
          AND (NEW.attempt_recorded_generation IS DISTINCT FROM OLD.lease_generation
               OR OLD.attempt_recorded_generation IS NOT DISTINCT FROM OLD.lease_generation))
    EXECUTE FUNCTION zeroth._record_attempt();
DROP TRIGGER IF EXISTS runs_attempt_history_insert ON zeroth.runs;

-- The attempt kept in a completed run's row (zeroth._log_kept_attempt,
-- sql/functions/internal/attempts.sql): once an UPDATE changed a value zeroth.run_attempts
-- derives it from (status, attempts, started_at, finished_at, lease_generation), it is moved into
-- zeroth.run_attempt_log (an UPDATE of completed_worker_id itself is a DBA editing the kept
-- attempt: left alone). The hot path never updates a completed run, and the
-- WHEN is false for every row that keeps nothing, so no claim, renewal or completion calls it.
-- AFTER, not BEFORE (issue 30): any BEFORE ROW UPDATE trigger makes every UPDATE of zeroth.runs
-- lock the row first (a heap LOCK record per claim or completion that had not locked it), WHEN
-- or not; the table has none (CREATE OR REPLACE turns the BEFORE trigger of 0022 into this).
CREATE OR REPLACE TRIGGER runs_kept_attempt_to_log
    AFTER UPDATE ON zeroth.runs
    FOR EACH ROW
    WHEN (OLD.completed_worker_id IS NOT NULL
          AND NEW.completed_worker_id IS NOT DISTINCT FROM OLD.completed_worker_id
          AND (NEW.status IS DISTINCT FROM OLD.status
               OR NEW.attempts IS DISTINCT FROM OLD.attempts
               OR NEW.started_at IS DISTINCT FROM OLD.started_at
               OR NEW.finished_at IS DISTINCT FROM OLD.finished_at
               OR NEW.lease_generation IS DISTINCT FROM OLD.lease_generation))
    EXECUTE FUNCTION zeroth._log_kept_attempt();
