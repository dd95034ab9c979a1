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
