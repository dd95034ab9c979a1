-- sql/functions/internal/attempts.sql: the attempt history (zeroth.run_attempt_log, read through
-- the view zeroth.run_attempts) of the ends made
-- outside the settle path (admin functions, claims that end an old holder's attempt, a DBA's
-- UPDATE), written by the trigger runs_attempt_history on zeroth.runs (sql/functions/triggers.sql),
-- never by a caller. The settle path (zeroth._settle, internal/settle.sql) writes its own ends
-- by the same rules, in its settling statement.
-- Internal: SECURITY INVOKER, executable by zeroth_owner only. Re-applied by every upgrade
-- (sql/README.md).

-- How an attempt ends (outcome), from the runs row before and after the update that ended it
-- (docs/state-machine.md, "Attempt history"). Only the two rows decide, so every function, the
-- batched ones and a DBA's manual UPDATE included, is described alike, and no caller can choose
-- the label. First match wins:
--   completed / cancelled        the new status;
--   dead_lettered                dead_lettered_at set by this update (fail_run, hand-back or
--                                orphan claim out of attempts);
--   recovered                    a running run whose lease had expired (claim_orphaned,
--                                claim_for_takeover, reconcile_thread_runs; after release_lease,
--                                expire_recovery_lease or clear_lease expired it in place);
--   expired                      a claim never started whose lease lapsed (reclaimed or cleared);
--   failed                       the new status failed (fail_run not retryable);
--   waited / paused              waiting: wait_for_event, wait_for_children (wait_reason
--                                event:… / children:…) / pause_run (any other reason);
--   lease_lost                   another holder or generation while the lease was live (a DBA);
--   handed_back / slept / failed running → pending: hand_backs counted / attempt given back
--                                (sleep_run) / neither (fail_run retrying);
--   released                     a claim not started let go (release_lease, clear_lease).
--
-- The trigger function. An attempt is a lease generation of a run: opened when a holder of a new
-- generation appears (a claim), started when the run becomes running under it (start_run), ended
-- by the update that clears its holder, bumps its generation or takes the run out of
-- pending/running. Only the end writes: the trigger's WHEN (sql/functions/triggers.sql) lets
-- through the updates that end OLD's attempt and nothing else, and this function inserts the
-- whole ended attempt, in one INSERT, from OLD's lease columns. The open attempt is OLD's row of
-- zeroth.runs itself (zeroth.attempt_history shows it from there), so claims and start_run write
-- nothing here and no open row is ever looked up or updated. What the open attempt was, from OLD:
--   attempt     OLD.attempts when running (start_run or claim_and_start counted it), else
--               OLD.attempts + 1 (a pending claim counts its attempt when it starts: the number
--               it would have had);
--   claimed_at  OLD.lease_acquired_at (set by every claim);
--   started_at  when running: the later of runs.started_at (set by each pending → running) and
--               the claim (an orphan claim takes a running run over without a new start: its
--               attempt started when it was claimed).
-- The time is the run's new updated_at (the function's own database time), or the clock when an
-- UPDATE left it alone (a DBA's).
CREATE OR REPLACE FUNCTION zeroth._record_attempt() RETURNS trigger
    -- Pinned: a trigger runs with the search_path of whoever updates the row (a DBA included).
    LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_at      timestamptz;
    v_outcome text;
BEGIN
    IF NEW.updated_at IS DISTINCT FROM OLD.updated_at THEN
        v_at := NEW.updated_at;
    ELSE
        v_at := zeroth._now();
    END IF;
    -- Inline (not a function of the two rows): building two runs composites per call cost more
    -- than the rest of the trigger (bench/attempt_history.py).
    v_outcome := CASE
        WHEN NEW.status = 'completed' THEN 'completed'
        WHEN NEW.status = 'cancelled' THEN 'cancelled'
        WHEN NEW.dead_lettered_at IS NOT NULL AND OLD.dead_lettered_at IS NULL THEN 'dead_lettered'
        WHEN OLD.lease_expires_at < v_at THEN
            CASE WHEN OLD.status = 'running' THEN 'recovered' ELSE 'expired' END
        WHEN NEW.status = 'failed' THEN 'failed'
        WHEN NEW.status = 'waiting' THEN
            CASE WHEN NEW.wait_reason LIKE 'event:%' OR NEW.wait_reason LIKE 'children:%'
                 THEN 'waited' ELSE 'paused' END
        WHEN NEW.lease_worker_id IS NOT NULL THEN 'lease_lost'
        WHEN OLD.status = 'running' AND NEW.status = 'pending' THEN
            CASE WHEN NEW.hand_backs > OLD.hand_backs THEN 'handed_back'
                 WHEN NEW.attempts < OLD.attempts THEN 'slept'
                 ELSE 'failed' END
        WHEN OLD.status = 'pending' AND NEW.status = 'pending' THEN 'released'
        ELSE 'lease_lost'
    END;
    INSERT INTO zeroth.run_attempt_log (tenant_id, workspace_key, run_id, attempt, lease_generation,
                                     worker_id, claimed_at, started_at, ended_at, outcome, error)
    VALUES (OLD.tenant_id, OLD.workspace_key, OLD.run_id,
            CASE WHEN OLD.status = 'running' THEN OLD.attempts ELSE OLD.attempts + 1 END,
            OLD.lease_generation, OLD.lease_worker_id, OLD.lease_acquired_at,
            CASE WHEN OLD.status = 'running'
                 THEN greatest(OLD.started_at, OLD.lease_acquired_at) END,
            v_at, v_outcome,
            CASE WHEN v_outcome IN ('failed', 'dead_lettered') OR NEW.status = 'failed'
                 THEN NEW.error END);
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION zeroth._record_attempt() IS 'Internal trigger (runs_attempt_history): inserts the attempt of a run (a lease generation) that the update ends — clears its holder, bumps its generation or ends the run — into zeroth.run_attempt_log, one INSERT from the old runs row, outcome by the rules of its header. Claims and start_run write nothing: the open attempt is the runs row (zeroth.attempt_history). Never raises on a row it does not expect.';
ALTER FUNCTION zeroth._record_attempt() OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._record_attempt() FROM PUBLIC;

-- The attempt a completion at the first claim keeps in the runs row (zeroth._settle:
-- completed_worker_id, completed_claimed_at; issue 30) is read by the view zeroth.run_attempts
-- from that row's status, attempts, started_at and finished_at. No function changes a completed
-- run (prune_runs deletes it), but a DBA's UPDATE may (reopening it by hand, fixing its times):
-- once such an update changed what the view derives, this trigger function writes the attempt,
-- as the view showed it (from OLD), into zeroth.run_attempt_log and clears the two columns of the
-- row, in the same statement, so the history of generation 1 stays what it was whatever happens
-- to the run after. An AFTER trigger (issue 30, WAL per run): a BEFORE ROW UPDATE trigger on
-- zeroth.runs, whatever its WHEN, makes every UPDATE of a run lock the row first to hand the
-- trigger its latest version (a heap LOCK record, 54 bytes of WAL, on every claim and completion
-- that had not locked the row itself). Its own UPDATE (completed_worker_id cleared) fires no
-- trigger again (their WHEN or their column list exclude it). Fires only through the trigger's
-- WHEN (sql/functions/triggers.sql): never on the hot path, which does not update a completed run.
CREATE OR REPLACE FUNCTION zeroth._log_kept_attempt() RETURNS trigger
    -- Pinned: a trigger runs with the search_path of whoever updates the row (a DBA included).
    LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO zeroth.run_attempt_log (tenant_id, workspace_key, run_id, attempt, lease_generation,
                                        worker_id, claimed_at, started_at, ended_at, outcome, error)
    VALUES (OLD.tenant_id, OLD.workspace_key, OLD.run_id, OLD.attempts, 1,
            OLD.completed_worker_id, OLD.completed_claimed_at,
            greatest(OLD.started_at, OLD.completed_claimed_at), OLD.finished_at, 'completed', NULL);
    UPDATE zeroth.runs r
       SET completed_worker_id = NULL, completed_claimed_at = NULL
     WHERE r.run_id = NEW.run_id AND r.tenant_id = NEW.tenant_id
       AND r.workspace_key = NEW.workspace_key;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION zeroth._log_kept_attempt() IS 'Internal trigger (runs_kept_attempt_to_log, AFTER UPDATE): once an UPDATE changed what zeroth.run_attempts derives from a runs row that keeps the attempt of a completion at the first claim (a DBA reopening the run by hand), inserts that attempt as the view showed it (the old row) into zeroth.run_attempt_log and clears completed_worker_id and completed_claimed_at in the row, in the same statement.';
ALTER FUNCTION zeroth._log_kept_attempt() OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._log_kept_attempt() FROM PUBLIC;
