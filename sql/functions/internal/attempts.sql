-- sql/functions/internal/attempts.sql: the attempt history (zeroth.run_attempts), written by the
-- trigger runs_attempt_history on zeroth.runs (sql/functions/triggers.sql), never by a caller.
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
-- generation appears (a claim: claim_pending, claim_and_start[_scopes], claim_orphaned,
-- complete_and_claim, admit_run with a worker), started when the run becomes running under it
-- (start_run), ended by the update that clears its holder, bumps its generation or takes the run
-- out of pending/running (outcome: the rules above). Each step is one UPDATE or INSERT through
-- run_attempts_run_idx; an update finding no open row (an attempt begun before this migration, a
-- DBA's UPDATE) inserts the row instead, so the trigger never raises. The time is the run's new
-- updated_at (the function's own database time), or the clock when an UPDATE left it alone.
CREATE OR REPLACE FUNCTION zeroth._record_attempt() RETURNS trigger
    -- Pinned: a trigger runs with the search_path of whoever updates the row (a DBA included).
    LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_at      timestamptz;
    v_outcome text;
BEGIN
    IF TG_OP = 'INSERT' THEN
        v_at := NEW.updated_at;
    ELSIF NEW.updated_at IS DISTINCT FROM OLD.updated_at THEN
        v_at := NEW.updated_at;
    ELSE
        v_at := zeroth._now();
    END IF;

    -- End the attempt of OLD's lease.
    IF TG_OP = 'UPDATE' AND OLD.lease_worker_id IS NOT NULL
       AND (NEW.lease_worker_id IS NULL
            OR NEW.lease_worker_id <> OLD.lease_worker_id
            OR NEW.lease_generation <> OLD.lease_generation
            OR NEW.status NOT IN ('pending', 'running')
            OR (OLD.status = 'running' AND NEW.status = 'pending')) THEN
        -- Inline (not a function of the two rows): building two runs composites per call cost
        -- more than the rest of the trigger (bench/attempt_history.py).
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
        UPDATE zeroth.run_attempts a
           SET ended_at = v_at,
               outcome = v_outcome,
               error = CASE WHEN v_outcome IN ('failed', 'dead_lettered') OR NEW.status = 'failed'
                            THEN NEW.error END
         WHERE a.tenant_id = OLD.tenant_id AND a.workspace_key = OLD.workspace_key
           AND a.run_id = OLD.run_id AND a.lease_generation = OLD.lease_generation
           AND a.ended_at IS NULL;
        IF NOT FOUND THEN
            INSERT INTO zeroth.run_attempts (tenant_id, workspace_key, run_id, attempt, lease_generation,
                                             worker_id, claimed_at, started_at, ended_at, outcome, error)
            VALUES (OLD.tenant_id, OLD.workspace_key, OLD.run_id, OLD.attempts, OLD.lease_generation,
                    OLD.lease_worker_id, OLD.lease_acquired_at, NULL, v_at, v_outcome,
                    CASE WHEN v_outcome IN ('failed', 'dead_lettered') OR NEW.status = 'failed'
                         THEN NEW.error END);
        END IF;
    END IF;

    IF NEW.lease_worker_id IS NULL THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'INSERT' OR OLD.lease_worker_id IS NULL OR NEW.lease_worker_id <> OLD.lease_worker_id
       OR NEW.lease_generation <> OLD.lease_generation THEN
        -- A claim. A pending one counts its attempt when it starts: record the number it will have.
        INSERT INTO zeroth.run_attempts (tenant_id, workspace_key, run_id, attempt, lease_generation,
                                         worker_id, claimed_at, started_at)
        VALUES (NEW.tenant_id, NEW.workspace_key, NEW.run_id,
                CASE WHEN NEW.status = 'running' THEN NEW.attempts ELSE NEW.attempts + 1 END,
                NEW.lease_generation, NEW.lease_worker_id, NEW.lease_acquired_at,
                CASE WHEN NEW.status = 'running' THEN v_at END);
    ELSIF NEW.status = 'running' AND OLD.status <> 'running' THEN
        -- start_run: the claim of this generation starts.
        UPDATE zeroth.run_attempts a
           SET started_at = v_at, attempt = NEW.attempts
         WHERE a.tenant_id = NEW.tenant_id AND a.workspace_key = NEW.workspace_key
           AND a.run_id = NEW.run_id AND a.lease_generation = NEW.lease_generation
           AND a.ended_at IS NULL;
        IF NOT FOUND THEN
            INSERT INTO zeroth.run_attempts (tenant_id, workspace_key, run_id, attempt, lease_generation,
                                             worker_id, claimed_at, started_at)
            VALUES (NEW.tenant_id, NEW.workspace_key, NEW.run_id, NEW.attempts, NEW.lease_generation,
                    NEW.lease_worker_id, NEW.lease_acquired_at, v_at);
        END IF;
    END IF;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION zeroth._record_attempt() IS 'Internal trigger (runs_attempt_history, runs_attempt_history_insert): keeps zeroth.run_attempts, one row per lease generation of a run: opened by a claim, started by start_run, ended (outcome by the rules of its header) by the update that clears the holder, bumps the generation or ends the run. Never raises on a row it does not expect: it inserts.';
ALTER FUNCTION zeroth._record_attempt() OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._record_attempt() FROM PUBLIC;
