-- sql/functions/internal/threads.sql: thread admission plumbing: the thread lock, the FIFO queue,
-- promotion, the finished trigger.
-- Internal helpers: SECURITY INVOKER, executable by zeroth_owner only (they run inside the
-- SECURITY DEFINER public functions). Re-applied by every upgrade (sql/README.md).

-- Serialises admissions (and redrives) of one thread: a row lock on the thread's own row of
-- zeroth.thread_locks, inserted on first use. One statement inserts or locks: ON CONFLICT DO
-- UPDATE locks the existing row even though its WHERE false updates nothing. Only sessions that
-- admit to this very thread ever wait for each other (an owner-only table: nobody else can lock
-- it). Under REPEATABLE READ a row another transaction inserted after the snapshot raises 40001.
CREATE OR REPLACE FUNCTION zeroth._lock_thread(tenant_id text, workspace_key text, thread_id text) RETURNS void
    -- (PL/pgSQL for the reason zeroth._notify gives.)
    LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    INSERT INTO zeroth.thread_locks AS l (tenant_id, workspace_key, thread_id)
    VALUES (_lock_thread.tenant_id, _lock_thread.workspace_key, _lock_thread.thread_id)
    ON CONFLICT ON CONSTRAINT thread_locks_pkey DO UPDATE SET thread_id = excluded.thread_id
       WHERE false;
END
$$;
COMMENT ON FUNCTION zeroth._lock_thread(text, text, text) IS 'Internal: lock the thread''s own row of zeroth.thread_locks (inserted on first use) until the transaction ends (admissions, redrive).';
ALTER FUNCTION zeroth._lock_thread(text, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._lock_thread(text, text, text) FROM PUBLIC;

-- Replaced by that row (0009): a thread's stripe of zeroth.lock_stripes was computable and shared
-- with other tenants' threads. Dropped after _lock_thread, whose old body called it.
DROP FUNCTION IF EXISTS zeroth._thread_stripe(text, text, text);

-- The thread_queued_at of a run joining a thread's queue: now, but always after the last queued
-- run, so the queue stays first-in first-out even for runs queued in the same microsecond.
-- Callers hold the thread's lock (_lock_thread), so the max is stable.
CREATE OR REPLACE FUNCTION zeroth._queue_position(tenant_id text, workspace_key text, thread_id text, at timestamptz)
    RETURNS timestamptz
    -- (PL/pgSQL for the reason zeroth._notify gives.)
    LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN greatest(_queue_position.at,
                    (SELECT max(r.thread_queued_at) + interval '1 microsecond'
                       FROM zeroth.runs r
                      WHERE r.tenant_id = _queue_position.tenant_id
                        AND r.workspace_key = _queue_position.workspace_key
                        AND r.thread_id = _queue_position.thread_id
                        AND r.thread_queued_at IS NOT NULL));
END
$$;
COMMENT ON FUNCTION zeroth._queue_position(text, text, text, timestamptz) IS 'Internal: thread_queued_at for a run joining the queue: max(at, last queued + 1 µs), so the queue is FIFO.';
ALTER FUNCTION zeroth._queue_position(text, text, text, timestamptz) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._queue_position(text, text, text, timestamptz) FROM PUBLIC;

-- Promotes the oldest queued run of a thread to pending and wakes workers. Called when the
-- active run ended (trigger) or when an admission finds a queue without an active run. Waits for
-- a row lock on the head (a concurrent cancel of it decides first) and then takes the next one.
CREATE OR REPLACE FUNCTION zeroth._promote_thread_head(tenant_id text, workspace_key text, thread_id text, at timestamptz)
    RETURNS uuid
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_id  uuid;
    v_run record;
BEGIN
    FOR v_attempt IN 1..100 LOOP
        SELECT r.run_id INTO v_id
          FROM zeroth.runs r
         WHERE r.tenant_id = _promote_thread_head.tenant_id
           AND r.workspace_key = _promote_thread_head.workspace_key
           AND r.thread_id = _promote_thread_head.thread_id
           AND r.thread_queued_at IS NOT NULL
         ORDER BY r.thread_queued_at, r.run_id
         LIMIT 1
           FOR UPDATE;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        -- By primary key, the queue mark read from the locked row: named in the predicate, it let
        -- a generic plan made on a small table reach the run through runs_thread_queue_idx and
        -- walk every queued run of the scope (the thread-finished trigger path).
        WITH locked AS MATERIALIZED (
            SELECT r.run_id, r.thread_queued_at
              FROM zeroth.runs r
             WHERE r.tenant_id = _promote_thread_head.tenant_id
               AND r.workspace_key = _promote_thread_head.workspace_key
               AND r.run_id = v_id
               FOR UPDATE OF r
        )
        UPDATE zeroth.runs r
           SET status = 'pending', thread_queued_at = NULL, wait_reason = NULL, updated_at = _promote_thread_head.at
          FROM locked l
         WHERE r.tenant_id = _promote_thread_head.tenant_id
           AND r.workspace_key = _promote_thread_head.workspace_key
           AND r.run_id = v_id
           AND r.run_id = l.run_id
           AND l.thread_queued_at IS NOT NULL
        RETURNING r.deployment_ref, r.workspace_id, r.run_after INTO v_run;
        IF FOUND THEN
            IF v_run.run_after <= _promote_thread_head.at THEN
                PERFORM zeroth._notify_wakeup(v_run.deployment_ref, _promote_thread_head.tenant_id, v_run.workspace_id);
            END IF;
            RETURN v_id;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'the queue of thread % kept changing', thread_id USING ERRCODE = '40001';
END
$$;
COMMENT ON FUNCTION zeroth._promote_thread_head(text, text, text, timestamptz) IS 'Internal: queued head of a thread → pending (FIFO by thread_queued_at); notifies zeroth_wakeup when it is due. Returns the promoted run or NULL.';
ALTER FUNCTION zeroth._promote_thread_head(text, text, text, timestamptz) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._promote_thread_head(text, text, text, timestamptz) FROM PUBLIC;

-- Finds and locks the active run of a thread (its slot rows first, then the run), or returns a
-- row of NULLs when the thread is idle. If the run ends while we wait for its lock, look again.
-- A queue without an active run (left by a REPEATABLE READ caller) is healed by promoting its head.
CREATE OR REPLACE FUNCTION zeroth._lock_thread_active(tenant_id text, workspace_key text, thread_id text, at timestamptz)
    RETURNS zeroth.runs
    LANGUAGE plpgsql VOLATILE
    -- JIT off, as in every function that turns a plan node off: a statement that cannot avoid
    -- the node (a LATERAL row lock needs a nested loop) is costed at 1e10 and JIT-compiled at
    -- each execution, 0.3-1.1 s of CPU where the server has LLVM (docs/performance.md, "JIT").
    SET jit = off
    -- Sequential scans off: the slot and the run are key probes whatever the statistics say (a
    -- cached plan made on tables analyzed while empty read admission_slots whole:
    -- tests/plans/test_generic_plans_all.py, analyzed-while-empty).
    SET enable_seqscan = off
    AS $$
DECLARE
    v_id  uuid;
    v_run zeroth.runs;
BEGIN
    FOR v_attempt IN 1..100 LOOP
        SELECT r.run_id INTO v_id
          FROM zeroth.runs r
         WHERE r.tenant_id = _lock_thread_active.tenant_id
           AND r.workspace_key = _lock_thread_active.workspace_key
           AND r.thread_id = _lock_thread_active.thread_id
           AND r.status IN ('pending', 'running', 'waiting')
           AND r.thread_queued_at IS NULL;
        IF NOT FOUND THEN
            IF zeroth._promote_thread_head(_lock_thread_active.tenant_id, _lock_thread_active.workspace_key,
                                           _lock_thread_active.thread_id, _lock_thread_active.at) IS NULL THEN
                RETURN v_run;
            END IF;
            CONTINUE;
        END IF;
        PERFORM 1 FROM zeroth.admission_slots s
         -- The scope by IS NOT DISTINCT FROM: by admission_slots_run_idx whatever the
         -- statistics (see zeroth._lock_settle).
         WHERE s.run_id = v_id
           AND (s.tenant_id, s.workspace_key) IS NOT DISTINCT FROM
               (_lock_thread_active.tenant_id, _lock_thread_active.workspace_key)
           FOR UPDATE;
        SELECT r.* INTO v_run
          FROM zeroth.runs r
         WHERE r.tenant_id = _lock_thread_active.tenant_id
           AND r.workspace_key = _lock_thread_active.workspace_key
           AND r.run_id = v_id
           AND r.status IN ('pending', 'running', 'waiting')
           AND r.thread_queued_at IS NULL
           FOR UPDATE;
        IF FOUND THEN
            RETURN v_run;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'the active run of thread % kept changing', thread_id USING ERRCODE = '40001';
END
$$;
COMMENT ON FUNCTION zeroth._lock_thread_active(text, text, text, timestamptz) IS 'Internal: lock (slots, then run) and return the active run of a thread, or a NULL row when idle; promotes a stranded queue head.';
ALTER FUNCTION zeroth._lock_thread_active(text, text, text, timestamptz) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._lock_thread_active(text, text, text, timestamptz) FROM PUBLIC;

-- A run joined the queue behind the thread's active run: write the active run's row (a new row
-- version, no column changed). The trigger that promotes the queue when the active run ends reads
-- the queue in the finishing transaction's snapshot; a REPEATABLE READ or SERIALIZABLE transaction
-- whose snapshot is older than the queued run would not see it, and stranded it (waiting, no
-- active run, nothing to promote it until the next admission). With this write such a transaction
-- fails to finish the run with 40001 (could not serialize access) and retries with a snapshot that
-- sees the queue; a READ COMMITTED one waits for the row and then sees it anyway.
CREATE OR REPLACE FUNCTION zeroth._mark_queue_changed(tenant_id text, workspace_key text, run_id uuid) RETURNS void
    -- (PL/pgSQL for the reason zeroth._notify gives.)
    LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    UPDATE zeroth.runs r
       SET updated_at = r.updated_at
     WHERE r.tenant_id = _mark_queue_changed.tenant_id
       AND r.workspace_key = _mark_queue_changed.workspace_key
       AND r.run_id = _mark_queue_changed.run_id;
END
$$;
COMMENT ON FUNCTION zeroth._mark_queue_changed(text, text, uuid) IS 'Internal: write the thread''s active run row (no column changed) when a run joins its queue, so a REPEATABLE READ / SERIALIZABLE finisher with an older snapshot fails with 40001 instead of stranding the queue.';
ALTER FUNCTION zeroth._mark_queue_changed(text, text, uuid) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._mark_queue_changed(text, text, uuid) FROM PUBLIC;

-- Ends the thread's active run → promote its queue; every end of a thread run is announced on
-- zeroth_run_finished with the run's opaque key (join waits on it). The finishing call's own time
-- (updated_at) is used.
CREATE OR REPLACE FUNCTION zeroth._thread_run_finished() RETURNS trigger
    -- Pinned: a trigger runs with the search_path of whoever updates the row, a DBA's manual
    -- UPDATE included, and its body's operators would resolve there.
    LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM zeroth._notify('zeroth_run_finished', zeroth._notify_key(
        'run_finished', ARRAY[NEW.tenant_id, NEW.workspace_key, NEW.run_id::text]));
    IF OLD.thread_queued_at IS NULL THEN
        PERFORM zeroth._promote_thread_head(NEW.tenant_id, NEW.workspace_key, NEW.thread_id, NEW.updated_at);
    END IF;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION zeroth._thread_run_finished() IS 'Internal trigger: a thread run ended → NOTIFY zeroth_run_finished with the run''s opaque key; if it was the active run, promote the queue head.';
ALTER FUNCTION zeroth._thread_run_finished() OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._thread_run_finished() FROM PUBLIC;

CREATE OR REPLACE FUNCTION zeroth._thread_run(r zeroth.runs) RETURNS zeroth.thread_run
    LANGUAGE sql IMMUTABLE
    RETURN ROW(r.run_id, r.thread_id, r.deployment_ref, r.status, r.thread_queued_at IS NOT NULL, r.wait_reason,
               r.attempts, r.max_attempts, r.resumable, r.created_at, r.started_at, r.finished_at, r.updated_at,
               r.lease_worker_id, r.lease_generation, r.lease_expires_at, r.cancel_action, r.cancel_requested_at,
               r.idempotency_key, r.payload, r.metadata, r.output, r.error, r.progress, r.accounting)::zeroth.thread_run;
COMMENT ON FUNCTION zeroth._thread_run(zeroth.runs) IS 'Internal: a runs row as zeroth.thread_run.';
ALTER FUNCTION zeroth._thread_run(zeroth.runs) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._thread_run(zeroth.runs) FROM PUBLIC;
