-- 0004_threads: one active run per thread, admission strategies, cancel outcomes with takeover,
-- progress and accounting (deer-flow parity, docs/threads.md).
--
-- The active run of a thread is its run in status pending, running or waiting that is not queued
-- (thread_queued_at IS NULL). waiting counts: a paused run still owns the thread's state and will
-- resume from its checkpoint, so letting another run in would make resume_run either fail or
-- interleave two runs on one thread. The partial unique index runs_thread_active_idx keeps at most
-- one active run per (tenant, workspace, thread) across every process.
--
-- A queued run (strategy enqueue, or an interrupt waiting for a live owner to stop) is status
-- waiting with thread_queued_at set. claim_pending never sees it (its index holds pending rows
-- only), so the claim stays O(claimed rows). When the active run ends by any path (complete_run,
-- fail_run, cancel_run, request_cancel, takeover), trigger runs_thread_run_finished promotes the
-- oldest queued run to pending in the same transaction and notifies zeroth_wakeup and
-- zeroth_run_finished.
--
-- Lock order, extending 0002's: the thread's advisory lock (admissions and redrive only), then
-- admission_slots, then the active run, then queued runs. Finishing functions never take the
-- advisory lock (slot, run, then the queued head in the trigger), so no cycle can form.
-- Call these functions at READ COMMITTED (the default): a REPEATABLE READ snapshot cannot see a
-- run queued after it began (admissions then fail with 40001 rather than strand anything, and an
-- admission promotes a queued run whose thread has no active run).

-- ---------------------------------------------------------------------------------------------
-- Columns, de-duplication of existing active thread runs, indexes
-- ---------------------------------------------------------------------------------------------

ALTER TABLE zeroth.runs
    ADD COLUMN thread_queued_at timestamptz,
    ADD COLUMN resumable boolean NOT NULL DEFAULT true,
    ADD COLUMN accounting jsonb,
    ADD CONSTRAINT runs_thread_queue_waits CHECK (thread_queued_at IS NULL OR (status = 'waiting' AND thread_id IS NOT NULL)),
    ADD CONSTRAINT runs_accounting_object CHECK (accounting IS NULL OR jsonb_typeof(accounting) = 'object');
COMMENT ON COLUMN zeroth.runs.thread_queued_at IS 'Set while the run waits behind the active run of its thread (status waiting); the queue is ordered by it. Cleared when the run is promoted to pending or cancelled.';
COMMENT ON COLUMN zeroth.runs.resumable IS 'When its owner dies: true = another worker re-executes it (claim_orphaned, claim_for_takeover hands it back); false = claim_for_takeover / reconcile_thread_runs end it as failed with a stop reason (deer-flow). admit_run defaults to false for admit-and-own runs.';
COMMENT ON COLUMN zeroth.runs.accounting IS 'Caller-defined JSON object (token and message counts, …) merged by update_run_progress.';

-- Before 0004 a thread_id was only a label, so a database may hold several active runs of one
-- thread. Keep one per thread (running first, then waiting, then pending; oldest first). Other
-- pending runs join the thread's queue in creation order: they never ran, nothing is lost. Other
-- running or waiting runs end as failed with stop_reason thread_dedupe (their owners' later
-- writes are fenced out, as with a takeover).
WITH ranked AS (
    SELECT r.tenant_id, r.workspace_key, r.run_id, r.status,
           row_number() OVER (PARTITION BY r.tenant_id, r.workspace_key, r.thread_id
                              ORDER BY r.status = 'running' DESC, r.status = 'waiting' DESC,
                                       r.created_at, r.run_id) AS n
      FROM zeroth.runs r
     WHERE r.thread_id IS NOT NULL AND r.status IN ('pending', 'running', 'waiting')
), extra AS (
    SELECT k.tenant_id, k.workspace_key, k.run_id, k.status FROM ranked k WHERE k.n > 1
), freed AS (
    UPDATE zeroth.admission_slots s
       SET run_id = NULL, lease_worker_id = NULL, lease_generation = NULL, lease_expires_at = NULL
      FROM extra x
     WHERE s.run_id = x.run_id AND s.tenant_id = x.tenant_id AND s.workspace_key = x.workspace_key
    RETURNING s.slot_no
)
UPDATE zeroth.runs r
   SET status = CASE WHEN x.status = 'pending' THEN 'waiting'::zeroth.run_status ELSE 'failed'::zeroth.run_status END,
       thread_queued_at = CASE WHEN x.status = 'pending' THEN r.created_at END,
       wait_reason = CASE WHEN x.status = 'pending' THEN 'thread_queue' END,
       finished_at = CASE WHEN x.status = 'pending' THEN NULL ELSE clock_timestamp() END,
       error = CASE WHEN x.status = 'pending' THEN r.error
                    ELSE jsonb_build_object('stop_reason', 'thread_dedupe', 'message',
                        'another run of this thread was kept when one active run per thread became enforced (migration 0004)',
                        'previous_error', r.error) END,
       updated_at = clock_timestamp(),
       lease_worker_id = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
       admission_slot = NULL, recovery_checkpoint_id = NULL
  FROM extra x
 WHERE r.tenant_id = x.tenant_id AND r.workspace_key = x.workspace_key AND r.run_id = x.run_id;

CREATE UNIQUE INDEX runs_thread_active_idx ON zeroth.runs (tenant_id, workspace_key, thread_id)
    WHERE thread_id IS NOT NULL AND status IN ('pending', 'running', 'waiting') AND thread_queued_at IS NULL;
COMMENT ON INDEX zeroth.runs_thread_active_idx IS 'At most one active (pending, running or waiting, not queued) run per thread, across all processes.';

CREATE INDEX runs_thread_queue_idx ON zeroth.runs (tenant_id, workspace_key, thread_id, thread_queued_at, run_id)
    WHERE thread_queued_at IS NOT NULL;

CREATE INDEX runs_thread_idx ON zeroth.runs (tenant_id, workspace_key, thread_id, created_at DESC, run_id DESC)
    WHERE thread_id IS NOT NULL;

-- ---------------------------------------------------------------------------------------------
-- Result types
-- ---------------------------------------------------------------------------------------------

CREATE TYPE zeroth.admission AS (
    outcome          text,
    run_id           uuid,
    status           zeroth.run_status,
    lease_generation bigint,
    lease_expires_at timestamptz,
    active_run_id    uuid,
    retry_after_s    integer,
    displaced        jsonb
);
COMMENT ON TYPE zeroth.admission IS 'Result of admit_run. outcome: admitted | queued | busy | reused. lease_* are set when the caller holds the run (admit-and-own); active_run_id and retry_after_s name the run the thread waits for (busy, queued); displaced lists the runs an interrupt/rollback cancelled or asked to stop: [{run_id, outcome, worker_id, lease_generation}].';

CREATE TYPE zeroth.cancel_result AS (
    outcome          text,
    run_id           uuid,
    status           zeroth.run_status,
    cancel_action    text,
    lease_worker_id  text,
    lease_generation bigint,
    retry_after_s    integer
);
COMMENT ON TYPE zeroth.cancel_result IS 'Result of request_cancel_v2. outcome: cancelled | cancel_requested | taken_over | not_cancellable | unknown; status after the call; the winning cancel_action; the owner asked to stop or displaced; retry_after_s = seconds until the owner''s lease + grace runs out (a cancel retried then takes over).';

CREATE TYPE zeroth.takeover AS (
    run_id              uuid,
    thread_id           text,
    outcome             text,
    status              zeroth.run_status,
    previous_worker_id  text,
    previous_generation bigint
);
COMMENT ON TYPE zeroth.takeover IS 'A run claimed by claim_for_takeover / reconcile_thread_runs. outcome: failed (not resumable) | cancelled (a cancel was requested) | requeued (resumable: back to pending for another worker).';

CREATE TYPE zeroth.thread_run AS (
    run_id              uuid,
    thread_id           text,
    deployment_ref      text,
    status              zeroth.run_status,
    queued              boolean,
    wait_reason         text,
    attempts            integer,
    max_attempts        integer,
    resumable           boolean,
    created_at          timestamptz,
    started_at          timestamptz,
    finished_at         timestamptz,
    updated_at          timestamptz,
    lease_worker_id     text,
    lease_generation    bigint,
    lease_expires_at    timestamptz,
    cancel_action       text,
    cancel_requested_at timestamptz,
    idempotency_key     text,
    payload             jsonb,
    metadata            jsonb,
    output              jsonb,
    error               jsonb,
    progress            jsonb,
    accounting          jsonb
);
COMMENT ON TYPE zeroth.thread_run IS 'A run as list_thread_runs / get_thread_run report it; queued = waiting behind the active run of its thread.';

-- ---------------------------------------------------------------------------------------------
-- Internal helpers
-- ---------------------------------------------------------------------------------------------

CREATE FUNCTION zeroth._grace_interval(grace_seconds double precision) RETURNS interval
    LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF grace_seconds IS NULL OR grace_seconds = 'NaN'::float8 OR grace_seconds < 0 OR grace_seconds > 86400 THEN
        RAISE EXCEPTION 'grace_seconds must be in [0, 86400], got %', coalesce(grace_seconds::text, 'NULL')
            USING ERRCODE = 'ZP008';
    END IF;
    RETURN make_interval(secs => grace_seconds);
END
$$;
COMMENT ON FUNCTION zeroth._grace_interval(double precision) IS 'Internal: validates a takeover grace in seconds (ZP008 unless 0 <= s <= 86400).';

-- Seconds until lease + grace runs out, rounded up and at least 1 (a floor, not a poll
-- interval); NULL without a lease. Database time, so the HTTP layer does no clock arithmetic.
-- Clamped to the integer range (a far-off or infinite timestamp never raises).
CREATE FUNCTION zeroth._retry_after(lease_expires_at timestamptz, grace interval, at timestamptz) RETURNS integer
    LANGUAGE sql IMMUTABLE
    RETURN CASE WHEN lease_expires_at IS NOT NULL
                THEN least(greatest(1, ceil(extract(epoch FROM lease_expires_at + grace - at))), 2147483647)::integer
           END;
COMMENT ON FUNCTION zeroth._retry_after(timestamptz, interval, timestamptz) IS 'Internal: max(1, ceil(lease_expires_at + grace - at)) in seconds, clamped to the integer range; NULL without a lease.';

CREATE FUNCTION zeroth._stop_error(stop_reason text, message text, worker_id text, generation bigint, previous jsonb)
    RETURNS jsonb
    LANGUAGE sql IMMUTABLE
    RETURN jsonb_build_object('stop_reason', stop_reason, 'message', message, 'worker_id', worker_id,
                              'lease_generation', generation)
           || CASE WHEN previous IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('previous_error', previous) END;
COMMENT ON FUNCTION zeroth._stop_error(text, text, text, bigint, jsonb) IS 'Internal: the error document of a run ended by someone other than its owner ({stop_reason, message, worker_id, lease_generation[, previous_error]}).';

-- Serialises admissions (and redrives) of one thread. Two-key advisory locks live apart from the
-- one-key lock of migrations; a hash collision only makes two threads wait for each other.
CREATE FUNCTION zeroth._lock_thread(tenant_id text, workspace_key text, thread_id text) RETURNS void
    LANGUAGE sql VOLATILE
    BEGIN ATOMIC
        SELECT pg_advisory_xact_lock(1516464242, hashtext(tenant_id || chr(31) || workspace_key || chr(31) || thread_id));
    END;
COMMENT ON FUNCTION zeroth._lock_thread(text, text, text) IS 'Internal: transaction advisory lock on one thread (admissions, redrive).';

-- The thread_queued_at of a run joining a thread's queue: now, but always after the last queued
-- run, so the queue stays first-in first-out even for runs queued in the same microsecond (or
-- under one now_override). Callers hold the thread's advisory lock, so the max is stable.
CREATE FUNCTION zeroth._queue_position(tenant_id text, workspace_key text, thread_id text, at timestamptz)
    RETURNS timestamptz
    LANGUAGE sql STABLE
    RETURN greatest(at, (SELECT max(r.thread_queued_at) + interval '1 microsecond'
                           FROM zeroth.runs r
                          WHERE r.tenant_id = _queue_position.tenant_id
                            AND r.workspace_key = _queue_position.workspace_key
                            AND r.thread_id = _queue_position.thread_id
                            AND r.thread_queued_at IS NOT NULL));
COMMENT ON FUNCTION zeroth._queue_position(text, text, text, timestamptz) IS 'Internal: thread_queued_at for a run joining the queue: max(at, last queued + 1 µs), so the queue is FIFO.';

-- Promotes the oldest queued run of a thread to pending and wakes workers. Called when the
-- active run ended (trigger) or when an admission finds a queue without an active run. Waits for
-- a row lock on the head (a concurrent cancel of it decides first) and then takes the next one.
CREATE FUNCTION zeroth._promote_thread_head(tenant_id text, workspace_key text, thread_id text, at timestamptz)
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
        UPDATE zeroth.runs r
           SET status = 'pending', thread_queued_at = NULL, wait_reason = NULL, updated_at = _promote_thread_head.at
         WHERE r.tenant_id = _promote_thread_head.tenant_id
           AND r.workspace_key = _promote_thread_head.workspace_key
           AND r.run_id = v_id
           AND r.thread_queued_at IS NOT NULL
        RETURNING r.deployment_ref, r.workspace_id INTO v_run;
        IF FOUND THEN
            PERFORM zeroth._notify_wakeup(v_run.deployment_ref, _promote_thread_head.tenant_id, v_run.workspace_id);
            RETURN v_id;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'the queue of thread % kept changing', thread_id USING ERRCODE = '40001';
END
$$;
COMMENT ON FUNCTION zeroth._promote_thread_head(text, text, text, timestamptz) IS 'Internal: queued head of a thread → pending (FIFO by thread_queued_at); notifies zeroth_wakeup. Returns the promoted run or NULL.';

-- Finds and locks the active run of a thread (its slot rows first, then the run), or returns a
-- row of NULLs when the thread is idle. If the run ends while we wait for its lock, look again.
-- A queue without an active run (left by a REPEATABLE READ caller) is healed by promoting its head.
CREATE FUNCTION zeroth._lock_thread_active(tenant_id text, workspace_key text, thread_id text, at timestamptz)
    RETURNS zeroth.runs
    LANGUAGE plpgsql VOLATILE AS $$
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
         WHERE s.run_id = v_id AND s.tenant_id = _lock_thread_active.tenant_id
           AND s.workspace_key = _lock_thread_active.workspace_key
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

-- The cancel decision, shared by request_cancel, request_cancel_v2 and admit_run. Locks the run's
-- slots, then the run (a no-op when the caller holds them). pending / waiting / queued → cancelled
-- at once (a claimed but unstarted holder is fenced out: the start barrier). running whose owner's
-- lease + grace has not run out → cancel_requested (durable flag, first action wins, NOTIFY to the
-- owner), unless the caller is that owner. running past lease + grace → taken_over: cancelled here
-- with a stop reason, slot freed. The owner's later writes are refused by the fence.
CREATE FUNCTION zeroth._cancel(tenant_id text, workspace_key text, run_id uuid, action text, grace interval,
                               at timestamptz, caller_worker_id text DEFAULT NULL)
    RETURNS zeroth.cancel_result
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_run    record;
    v_freed  boolean;
    v_result zeroth.cancel_result;
BEGIN
    PERFORM 1 FROM zeroth.admission_slots s
     WHERE s.run_id = _cancel.run_id AND s.tenant_id = _cancel.tenant_id AND s.workspace_key = _cancel.workspace_key
       FOR UPDATE;
    SELECT r.status, r.lease_worker_id, r.lease_generation, r.lease_expires_at, r.deployment_ref,
           r.workspace_id, r.cancel_action
      INTO v_run
      FROM zeroth.runs r
     WHERE r.tenant_id = _cancel.tenant_id AND r.workspace_key = _cancel.workspace_key AND r.run_id = _cancel.run_id
       FOR UPDATE;
    v_result.run_id := _cancel.run_id;
    IF NOT FOUND THEN
        v_result.outcome := 'unknown';
        RETURN v_result;
    END IF;
    v_result.lease_worker_id := v_run.lease_worker_id;
    v_result.lease_generation := v_run.lease_generation;
    IF v_run.status IN ('completed', 'failed', 'cancelled') THEN
        v_result.outcome := 'not_cancellable';
        v_result.status := v_run.status;
        v_result.cancel_action := v_run.cancel_action;
        RETURN v_result;
    END IF;

    IF v_run.status = 'running' AND v_run.lease_expires_at + _cancel.grace >= _cancel.at
       AND v_run.lease_worker_id IS DISTINCT FROM _cancel.caller_worker_id THEN
        UPDATE zeroth.runs r
           SET cancel_requested_at = coalesce(r.cancel_requested_at, _cancel.at),
               cancel_action = coalesce(r.cancel_action, _cancel.action),
               updated_at = _cancel.at
         WHERE r.tenant_id = _cancel.tenant_id AND r.workspace_key = _cancel.workspace_key AND r.run_id = _cancel.run_id
        RETURNING r.cancel_action INTO v_result.cancel_action;
        PERFORM pg_notify('zeroth_control', json_build_object(
            'type', 'cancel', 'run_id', _cancel.run_id, 'worker_id', v_run.lease_worker_id,
            'lease_generation', v_run.lease_generation)::text);
        v_result.outcome := 'cancel_requested';
        v_result.status := 'running';
        v_result.retry_after_s := zeroth._retry_after(v_run.lease_expires_at, _cancel.grace, _cancel.at);
        RETURN v_result;
    END IF;

    UPDATE zeroth.admission_slots s
       SET run_id = NULL, lease_worker_id = NULL, lease_generation = NULL, lease_expires_at = NULL
     WHERE s.run_id = _cancel.run_id AND s.tenant_id = _cancel.tenant_id AND s.workspace_key = _cancel.workspace_key;
    v_freed := FOUND;
    v_result.outcome := CASE WHEN v_run.status = 'running'
                              AND v_run.lease_worker_id IS DISTINCT FROM _cancel.caller_worker_id
                             THEN 'taken_over' ELSE 'cancelled' END;
    UPDATE zeroth.runs r
       SET status = 'cancelled',
           cancel_requested_at = coalesce(r.cancel_requested_at, _cancel.at),
           cancel_action = coalesce(r.cancel_action, _cancel.action),
           error = CASE WHEN v_result.outcome = 'taken_over'
                        THEN zeroth._stop_error('taken_over', format(
                                 'cancelled after worker %s stopped renewing its lease (expired at %s)',
                                 r.lease_worker_id, r.lease_expires_at), r.lease_worker_id, r.lease_generation, r.error)
                        ELSE r.error END,
           wait_reason = NULL,
           thread_queued_at = NULL,
           finished_at = _cancel.at,
           updated_at = _cancel.at,
           lease_worker_id = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
           admission_slot = NULL, recovery_checkpoint_id = NULL
     WHERE r.tenant_id = _cancel.tenant_id AND r.workspace_key = _cancel.workspace_key AND r.run_id = _cancel.run_id
    RETURNING r.status, r.cancel_action INTO v_result.status, v_result.cancel_action;
    IF v_freed THEN
        PERFORM zeroth._notify_wakeup(v_run.deployment_ref, _cancel.tenant_id, v_run.workspace_id);
    END IF;
    RETURN v_result;
END
$$;
COMMENT ON FUNCTION zeroth._cancel(text, text, uuid, text, interval, timestamptz, text) IS 'Internal: the cancel decision of request_cancel(_v2) and admit_run: cancelled | cancel_requested | taken_over | not_cancellable | unknown.';

-- Ends or hands back one run whose owner's lease expired more than grace ago. Never waits: the
-- slot row and then the run row are taken with SKIP LOCKED, so an owner renewing right now wins
-- and the call returns nothing. The expiry is re-checked in the locking predicate.
CREATE FUNCTION zeroth._take_over(tenant_id text, workspace_key text, run_id uuid, grace interval, at timestamptz,
                                  stop_reason text, message text)
    RETURNS SETOF zeroth.takeover
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_run    record;
    v_slot   integer;
    v_result zeroth.takeover;
BEGIN
    SELECT r.admission_slot, r.deployment_ref INTO v_run
      FROM zeroth.runs r
     WHERE r.tenant_id = _take_over.tenant_id AND r.workspace_key = _take_over.workspace_key
       AND r.run_id = _take_over.run_id;
    IF v_run.admission_slot IS NOT NULL THEN
        SELECT s.slot_no INTO v_slot
          FROM zeroth.admission_slots s
         WHERE s.tenant_id = _take_over.tenant_id AND s.workspace_key = _take_over.workspace_key
           AND s.deployment_ref = v_run.deployment_ref AND s.slot_no = v_run.admission_slot
           FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN;
        END IF;
    END IF;

    SELECT r.status, r.thread_id, r.lease_worker_id, r.lease_generation, r.lease_expires_at, r.resumable,
           r.cancel_action, r.deployment_ref, r.workspace_id, r.error
      INTO v_run
      FROM zeroth.runs r
     WHERE r.tenant_id = _take_over.tenant_id AND r.workspace_key = _take_over.workspace_key
       AND r.run_id = _take_over.run_id
       AND r.status IN ('pending', 'running')
       AND r.lease_worker_id IS NOT NULL
       AND r.lease_expires_at + _take_over.grace < _take_over.at
       FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;

    PERFORM zeroth._free_slot(_take_over.tenant_id, _take_over.workspace_key, _take_over.run_id,
                              v_run.lease_worker_id, v_run.lease_generation);
    v_result := ROW(_take_over.run_id, v_run.thread_id,
                    CASE WHEN v_run.cancel_action IS NOT NULL THEN 'cancelled'
                         WHEN v_run.resumable THEN 'requeued' ELSE 'failed' END,
                    NULL, v_run.lease_worker_id, v_run.lease_generation)::zeroth.takeover;
    UPDATE zeroth.runs r
       SET status = CASE v_result.outcome WHEN 'cancelled' THEN 'cancelled'::zeroth.run_status
                                          WHEN 'failed' THEN 'failed'::zeroth.run_status
                                          ELSE 'pending'::zeroth.run_status END,
           -- A hand-back gives the interrupted attempt back, as hand_back_to_pending does.
           attempts = CASE WHEN v_result.outcome = 'requeued' AND r.status = 'running'
                           THEN greatest(r.attempts - 1, 0) ELSE r.attempts END,
           error = CASE WHEN v_result.outcome = 'requeued' THEN r.error
                        ELSE zeroth._stop_error(_take_over.stop_reason, coalesce(_take_over.message, format(
                                 'run lease expired: worker %s stopped renewing (expired at %s)',
                                 r.lease_worker_id, r.lease_expires_at)),
                             r.lease_worker_id, r.lease_generation, r.error) END,
           finished_at = CASE WHEN v_result.outcome = 'requeued' THEN NULL ELSE _take_over.at END,
           updated_at = _take_over.at,
           lease_worker_id = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
           admission_slot = NULL, recovery_checkpoint_id = NULL
     WHERE r.tenant_id = _take_over.tenant_id AND r.workspace_key = _take_over.workspace_key
       AND r.run_id = _take_over.run_id
    RETURNING r.status INTO v_result.status;
    PERFORM zeroth._notify_wakeup(v_run.deployment_ref, _take_over.tenant_id, v_run.workspace_id);
    RETURN NEXT v_result;
END
$$;
COMMENT ON FUNCTION zeroth._take_over(text, text, uuid, interval, timestamptz, text, text) IS 'Internal: the takeover of one run whose lease expired past grace (SKIP LOCKED throughout), shared by claim_for_takeover and reconcile_thread_runs.';

-- An existing run that an admission must return instead of creating one: same idempotency key
-- (tenant, workspace, deployment) or same caller-chosen run_id. strict: it must belong to this
-- thread (admit_run), else ZP008. The lease is reported only to its holder.
CREATE FUNCTION zeroth._admission_reuse(tenant_id text, workspace_key text, deployment_ref text, thread_id text,
                                        idempotency_key text, run_id uuid, worker_id text, strict boolean)
    RETURNS zeroth.admission
    LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_run    record;
    v_result zeroth.admission;
BEGIN
    IF _admission_reuse.idempotency_key IS NULL AND _admission_reuse.run_id IS NULL THEN
        RETURN v_result;
    END IF;
    SELECT r.run_id, r.thread_id, r.status, r.lease_worker_id, r.lease_generation, r.lease_expires_at INTO v_run
      FROM zeroth.runs r
     WHERE r.tenant_id = _admission_reuse.tenant_id
       AND r.workspace_key = _admission_reuse.workspace_key
       AND ((_admission_reuse.idempotency_key IS NOT NULL
             AND r.deployment_ref = _admission_reuse.deployment_ref
             AND r.idempotency_key = _admission_reuse.idempotency_key)
            OR r.run_id = _admission_reuse.run_id)
     ORDER BY (r.run_id = _admission_reuse.run_id) IS TRUE DESC
     LIMIT 1;
    IF NOT FOUND THEN
        RETURN v_result;
    END IF;
    IF _admission_reuse.strict AND v_run.thread_id IS DISTINCT FROM _admission_reuse.thread_id THEN
        RAISE EXCEPTION 'run % (same idempotency key or run_id) belongs to thread %, not %',
            v_run.run_id, coalesce(quote_literal(v_run.thread_id), 'none'), quote_literal(_admission_reuse.thread_id)
            USING ERRCODE = 'ZP008';
    END IF;
    v_result := ROW('reused', v_run.run_id, v_run.status, NULL, NULL, NULL, NULL, '[]'::jsonb)::zeroth.admission;
    IF v_run.lease_worker_id = _admission_reuse.worker_id THEN
        v_result.lease_generation := v_run.lease_generation;
        v_result.lease_expires_at := v_run.lease_expires_at;
    END IF;
    RETURN v_result;
END
$$;
COMMENT ON FUNCTION zeroth._admission_reuse(text, text, text, text, text, uuid, text, boolean) IS 'Internal: the run an admission returns as reused (same idempotency key or run_id), or a NULL outcome.';

-- interrupt / rollback: the new run supersedes the thread's queue and its active run. Locks the
-- active run (slots, then run), then the queue; cancels the queued runs first, so ending the
-- active run promotes nothing, then the active run (_cancel: at once, taken over, or — a live
-- other owner — asked to stop). Returns [{run_id, outcome, worker_id, lease_generation}].
CREATE FUNCTION zeroth._displace(tenant_id text, workspace_key text, thread_id text, action text, grace interval,
                                 at timestamptz, worker_id text)
    RETURNS jsonb
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_active    zeroth.runs := zeroth._lock_thread_active(_displace.tenant_id, _displace.workspace_key,
                                                          _displace.thread_id, _displace.at);
    v_queued    uuid;
    v_cancel    zeroth.cancel_result;
    v_displaced jsonb := '[]'::jsonb;
BEGIN
    IF v_active.run_id IS NULL THEN
        RETURN v_displaced;
    END IF;
    FOR v_queued IN
        SELECT r.run_id FROM zeroth.runs r
         WHERE r.tenant_id = _displace.tenant_id AND r.workspace_key = _displace.workspace_key
           AND r.thread_id = _displace.thread_id AND r.thread_queued_at IS NOT NULL
         ORDER BY r.thread_queued_at, r.run_id
           FOR UPDATE
    LOOP
        v_cancel := zeroth._cancel(_displace.tenant_id, _displace.workspace_key, v_queued, _displace.action,
                                   _displace.grace, _displace.at, _displace.worker_id);
        v_displaced := v_displaced || jsonb_build_array(jsonb_build_object(
            'run_id', v_cancel.run_id, 'outcome', v_cancel.outcome, 'worker_id', NULL, 'lease_generation', NULL));
    END LOOP;
    v_cancel := zeroth._cancel(_displace.tenant_id, _displace.workspace_key, v_active.run_id, _displace.action,
                               _displace.grace, _displace.at, _displace.worker_id);
    RETURN v_displaced || jsonb_build_array(jsonb_build_object(
        'run_id', v_cancel.run_id, 'outcome', v_cancel.outcome, 'worker_id', v_cancel.lease_worker_id,
        'lease_generation', v_cancel.lease_generation));
END
$$;
COMMENT ON FUNCTION zeroth._displace(text, text, text, text, interval, timestamptz, text) IS 'Internal: interrupt / rollback of a thread: cancel its queue, then cancel (or ask the live owner to stop) its active run; returns the displaced runs.';

-- The admission proper, shared by admit_run (after _displace) and enqueue_run: an idle thread
-- admits (leased to worker_id when given), a busy one answers busy (reject) or queues the run
-- (enqueue). Serialised per thread by the advisory lock; the unique index is the backstop
-- (ON CONFLICT DO NOTHING, then look again). displaced is passed through to the result.
CREATE FUNCTION zeroth._admit(
    tenant_id text, workspace_id text, deployment_ref text, thread_id text, queue_when_busy boolean,
    worker_id text, payload jsonb, metadata jsonb, priority integer, run_after timestamptz, max_attempts integer,
    idempotency_key text, run_id uuid, resumable boolean, lease interval, grace interval, at timestamptz,
    strict boolean, displaced jsonb DEFAULT '[]'::jsonb)
    RETURNS zeroth.admission
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_wskey  text := zeroth._workspace_key(_admit.workspace_id);
    v_result zeroth.admission;
    v_active zeroth.runs;
    v_queue  boolean;
    v_owned  boolean;
    v_new    record;
BEGIN
    -- A retried admission needs no lock.
    v_result := zeroth._admission_reuse(_admit.tenant_id, v_wskey, _admit.deployment_ref, _admit.thread_id,
                                        _admit.idempotency_key, _admit.run_id, _admit.worker_id, _admit.strict);
    IF v_result.outcome IS NOT NULL THEN
        RETURN v_result;
    END IF;
    PERFORM zeroth._lock_thread(_admit.tenant_id, v_wskey, _admit.thread_id);

    FOR v_attempt IN 1..100 LOOP
        v_active := zeroth._lock_thread_active(_admit.tenant_id, v_wskey, _admit.thread_id, _admit.at);
        v_queue := v_active.run_id IS NOT NULL;
        IF v_queue AND NOT _admit.queue_when_busy THEN
            RETURN ROW('busy', NULL, NULL, NULL, NULL, v_active.run_id,
                       zeroth._retry_after(v_active.lease_expires_at, _admit.grace, _admit.at),
                       _admit.displaced)::zeroth.admission;
        END IF;

        v_owned := _admit.worker_id IS NOT NULL AND NOT v_queue;
        INSERT INTO zeroth.runs AS r (
            run_id, tenant_id, workspace_id, deployment_ref, thread_id, status, wait_reason, thread_queued_at,
            priority, run_after, max_attempts, created_at, updated_at, payload, metadata, idempotency_key,
            resumable, lease_worker_id, lease_acquired_at, lease_expires_at, lease_generation)
        VALUES (
            coalesce(_admit.run_id, gen_random_uuid()), _admit.tenant_id, _admit.workspace_id, _admit.deployment_ref,
            _admit.thread_id,
            CASE WHEN v_queue THEN 'waiting'::zeroth.run_status ELSE 'pending'::zeroth.run_status END,
            CASE WHEN v_queue THEN 'thread_queue' END,
            CASE WHEN v_queue THEN zeroth._queue_position(_admit.tenant_id, v_wskey, _admit.thread_id, _admit.at) END,
            _admit.priority, coalesce(_admit.run_after, _admit.at), _admit.max_attempts, _admit.at, _admit.at,
            _admit.payload, _admit.metadata, _admit.idempotency_key, _admit.resumable,
            CASE WHEN v_owned THEN _admit.worker_id END,
            CASE WHEN v_owned THEN _admit.at END,
            CASE WHEN v_owned THEN _admit.at + _admit.lease END,
            CASE WHEN v_owned THEN 1 ELSE 0 END)
        ON CONFLICT DO NOTHING
        RETURNING r.run_id, r.status, r.lease_generation, r.lease_expires_at INTO v_new;
        IF FOUND THEN
            IF NOT v_queue AND NOT v_owned THEN
                PERFORM zeroth._notify_wakeup(_admit.deployment_ref, _admit.tenant_id, _admit.workspace_id);
            END IF;
            RETURN ROW(CASE WHEN v_queue THEN 'queued' ELSE 'admitted' END, v_new.run_id, v_new.status,
                       CASE WHEN v_owned THEN v_new.lease_generation END, v_new.lease_expires_at,
                       v_active.run_id, zeroth._retry_after(v_active.lease_expires_at, _admit.grace, _admit.at),
                       _admit.displaced)::zeroth.admission;
        END IF;
        -- A unique index said no: the same key or run_id arrived concurrently, or an active run
        -- appeared (only a finishing run's promotion can do that): look again.
        v_result := zeroth._admission_reuse(_admit.tenant_id, v_wskey, _admit.deployment_ref, _admit.thread_id,
                                            _admit.idempotency_key, _admit.run_id, _admit.worker_id, _admit.strict);
        IF v_result.outcome IS NOT NULL THEN
            RETURN v_result;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'the active run of thread % kept changing', thread_id USING ERRCODE = '40001';
END
$$;
COMMENT ON FUNCTION zeroth._admit(text, text, text, text, boolean, text, jsonb, jsonb, integer, timestamptz, integer, text, uuid, boolean, interval, interval, timestamptz, boolean, jsonb) IS 'Internal: the admission of admit_run and of enqueue_run with a thread_id: admitted, queued, busy or reused.';

-- Ends the thread's active run → promote its queue; every end of a thread run is announced on
-- zeroth_run_finished (join waits on it). The finishing call's own time (updated_at) is used, so
-- now_override carries through.
CREATE FUNCTION zeroth._thread_run_finished() RETURNS trigger
    LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_notify('zeroth_run_finished', json_build_object(
        'run_id', NEW.run_id, 'thread_id', left(NEW.thread_id, 200), 'status', NEW.status,
        'tenant_id', NEW.tenant_id, 'workspace_id', NEW.workspace_id)::text);
    IF OLD.thread_queued_at IS NULL THEN
        PERFORM zeroth._promote_thread_head(NEW.tenant_id, NEW.workspace_key, NEW.thread_id, NEW.updated_at);
    END IF;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION zeroth._thread_run_finished() IS 'Internal trigger: a thread run ended → NOTIFY zeroth_run_finished {run_id, thread_id, status, tenant_id, workspace_id}; if it was the active run, promote the queue head.';

CREATE TRIGGER runs_thread_run_finished
    AFTER UPDATE OF status ON zeroth.runs
    FOR EACH ROW
    WHEN (OLD.thread_id IS NOT NULL
          AND OLD.status IN ('pending', 'running', 'waiting')
          AND NEW.status IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION zeroth._thread_run_finished();

-- ---------------------------------------------------------------------------------------------
-- Admission
-- ---------------------------------------------------------------------------------------------

-- admit_run: create a run for a thread; with worker_id (admit-and-own) lease it to the caller at
-- generation 1 in the same statement (status pending: claim_pending skips it while the lease
-- lives; the caller starts it with start_run). Strategy when the thread has an active run:
-- reject → busy; enqueue → queued behind it; interrupt / rollback → queued runs cancelled and the
-- active run cancelled with that action, then admitted — or, if a live other owner must first stop
-- (cancel requested, NOTIFY), queued behind it. Locks: thread advisory lock, slots, active run,
-- queue. Raises ZP006, ZP008. Notifies zeroth_wakeup, zeroth_control. Time: clock_timestamp().
CREATE FUNCTION zeroth.admit_run(
    deployment_ref  text,
    thread_id       text,
    strategy        text             DEFAULT 'reject',
    worker_id       text             DEFAULT NULL,
    payload         jsonb            DEFAULT '{}'::jsonb,
    tenant_id       text             DEFAULT NULL,
    workspace_id    text             DEFAULT NULL,
    lease_seconds   double precision DEFAULT 60,
    grace_seconds   double precision DEFAULT 10,
    idempotency_key text             DEFAULT NULL,
    metadata        jsonb            DEFAULT '{}'::jsonb,
    run_id          uuid             DEFAULT NULL,
    priority        integer          DEFAULT 0,
    max_attempts    integer          DEFAULT 3,
    resumable       boolean          DEFAULT NULL,
    now_override    timestamptz      DEFAULT NULL)
    RETURNS zeroth.admission
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now    timestamptz := zeroth._now(now_override);
    v_lease  interval := zeroth._lease_interval(admit_run.lease_seconds);
    v_grace  interval := zeroth._grace_interval(admit_run.grace_seconds);
    v_tenant    text := zeroth._scope_tenant(admit_run.tenant_id, admit_run.workspace_id);
    v_wskey     text := zeroth._workspace_key(admit_run.workspace_id);
    v_result    zeroth.admission;
    v_displaced jsonb := '[]'::jsonb;
BEGIN
    IF v_tenant IS NULL THEN
        RAISE EXCEPTION 'a workspace_id needs a tenant_id' USING ERRCODE = 'ZP006';
    END IF;
    PERFORM zeroth._require_identifier(admit_run.deployment_ref, 'deployment_ref');
    PERFORM zeroth._require_identifier(admit_run.thread_id, 'thread_id');
    PERFORM zeroth._require_identifier(v_tenant, 'tenant_id');
    IF admit_run.workspace_id IS NOT NULL THEN
        PERFORM zeroth._require_identifier(admit_run.workspace_id, 'workspace_id');
    END IF;
    IF admit_run.worker_id IS NOT NULL THEN
        PERFORM zeroth._require_identifier(admit_run.worker_id, 'worker_id');
    END IF;
    PERFORM zeroth._require(admit_run.strategy IN ('reject', 'interrupt', 'rollback', 'enqueue'),
                            'strategy must be reject, interrupt, rollback or enqueue');
    PERFORM zeroth._require(jsonb_typeof(admit_run.payload) = 'object', 'payload must be a JSON object');
    PERFORM zeroth._require(jsonb_typeof(admit_run.metadata) = 'object', 'metadata must be a JSON object');
    PERFORM zeroth._require(admit_run.priority IS NOT NULL, 'priority must not be NULL');
    PERFORM zeroth._require(admit_run.max_attempts BETWEEN 1 AND 1000, 'max_attempts must be between 1 and 1000');
    PERFORM zeroth._require(admit_run.idempotency_key IS NULL
                            OR length(admit_run.idempotency_key) BETWEEN 1 AND 500,
                            'idempotency_key must be NULL or 1 to 500 characters');

    IF admit_run.strategy IN ('interrupt', 'rollback') THEN
        PERFORM zeroth._lock_thread(v_tenant, v_wskey, admit_run.thread_id);
        -- Under the lock: a retried admission returns its run and interrupts nothing.
        v_result := zeroth._admission_reuse(v_tenant, v_wskey, admit_run.deployment_ref, admit_run.thread_id,
                                            admit_run.idempotency_key, admit_run.run_id, admit_run.worker_id, true);
        IF v_result.outcome IS NOT NULL THEN
            RETURN v_result;
        END IF;
        v_displaced := zeroth._displace(v_tenant, v_wskey, admit_run.thread_id, admit_run.strategy, v_grace, v_now,
                                        admit_run.worker_id);
    END IF;
    -- After a displacement the thread is idle, or its active run is stopping for a live owner:
    -- then the new run queues right behind it (the queue was cancelled).
    RETURN zeroth._admit(v_tenant, admit_run.workspace_id, admit_run.deployment_ref, admit_run.thread_id,
                         admit_run.strategy <> 'reject', admit_run.worker_id, admit_run.payload, admit_run.metadata,
                         admit_run.priority, NULL, admit_run.max_attempts, admit_run.idempotency_key,
                         admit_run.run_id, coalesce(admit_run.resumable, admit_run.worker_id IS NULL),
                         v_lease, v_grace, v_now, true, v_displaced);
END
$$;
COMMENT ON FUNCTION zeroth.admit_run(text, text, text, text, jsonb, text, text, double precision, double precision, text, jsonb, uuid, integer, integer, boolean, timestamptz) IS
'admit_run: create a run for a thread, at most one active per thread. worker_id = admit-and-own: leased to the caller at generation 1 in the same statement (pending; start it with start_run). Strategies when busy: reject → busy (+ active_run_id, retry_after_s); enqueue → queued behind it; interrupt / rollback → queue and active run cancelled with that action, then admitted, or queued behind a live other owner asked to stop (NOTIFY). A repeated idempotency key or run_id returns reused. Raises ZP006, ZP008. Notifies zeroth_wakeup, zeroth_control. Time: clock_timestamp().';

-- ---------------------------------------------------------------------------------------------
-- Cancel and takeover
-- ---------------------------------------------------------------------------------------------

-- request_cancel_v2: the cancel with five outcomes. cancelled (pending, waiting or queued: at
-- once; a claimed holder is fenced out) | cancel_requested (running, owner's lease + grace not run
-- out: durable flag, first action wins, NOTIFY zeroth_control; retry_after_s says when a retry
-- could take over) | taken_over (running past lease + grace: cancelled here, stop reason recorded,
-- the owner fenced out) | not_cancellable (terminal) | unknown. Locks: slots, then run. Raises
-- ZP008. Notifies zeroth_control, zeroth_wakeup. Time: clock_timestamp().
CREATE FUNCTION zeroth.request_cancel_v2(
    run_id        uuid,
    tenant_id     text             DEFAULT NULL,
    workspace_id  text             DEFAULT NULL,
    action        text             DEFAULT 'cancel',
    grace_seconds double precision DEFAULT 10,
    now_override  timestamptz      DEFAULT NULL)
    RETURNS zeroth.cancel_result
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now   timestamptz := zeroth._now(now_override);
    v_grace interval := zeroth._grace_interval(request_cancel_v2.grace_seconds);
BEGIN
    PERFORM zeroth._require(request_cancel_v2.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require(request_cancel_v2.action IN ('cancel', 'interrupt', 'rollback'),
                            'action must be cancel, interrupt or rollback');
    RETURN zeroth._cancel(zeroth._scope_tenant(request_cancel_v2.tenant_id, request_cancel_v2.workspace_id),
                          zeroth._workspace_key(request_cancel_v2.workspace_id), request_cancel_v2.run_id,
                          request_cancel_v2.action, v_grace, v_now);
END
$$;
COMMENT ON FUNCTION zeroth.request_cancel_v2(uuid, text, text, text, double precision, timestamptz) IS
'request_cancel_v2: cancelled (pending/waiting/queued, at once) | cancel_requested (running, owner''s lease + grace not run out: durable flag, first action wins, NOTIFY zeroth_control, retry_after_s) | taken_over (running past lease + grace: cancelled with a stop reason, owner fenced out) | not_cancellable | unknown. Raises ZP008. Notifies zeroth_control, zeroth_wakeup. Time: clock_timestamp().';

-- request_cancel: the 0002 contract, now on the shared decision with no grace: a running run
-- whose lease expired is cancelled at once (reported as cancelled; the row also records the
-- stop reason taken_over). Returns cancelled | cancel_requested | not_cancellable | unknown.
-- Locks: slots, then run. Raises ZP008. Notifies zeroth_control, zeroth_wakeup. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.request_cancel(
    run_id       uuid,
    tenant_id    text        DEFAULT NULL,
    workspace_id text        DEFAULT NULL,
    action       text        DEFAULT 'cancel',
    now_override timestamptz DEFAULT NULL)
    RETURNS text
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_outcome text;
BEGIN
    SELECT c.outcome INTO v_outcome
      FROM zeroth.request_cancel_v2(run_id => request_cancel.run_id, tenant_id => request_cancel.tenant_id,
                                    workspace_id => request_cancel.workspace_id, action => request_cancel.action,
                                    grace_seconds => 0, now_override => request_cancel.now_override) AS c;
    RETURN CASE v_outcome WHEN 'taken_over' THEN 'cancelled' ELSE v_outcome END;
END
$$;
COMMENT ON FUNCTION zeroth.request_cancel(uuid, text, text, text, timestamptz) IS
'request_cancel: returns cancelled (pending, waiting, or running with an expired lease: terminal at once, lease cleared so the old holder''s fenced writes are refused) | cancel_requested (running with a live lease: durable flag, first action wins, NOTIFY zeroth_control to the owner) | not_cancellable (terminal) | unknown (no such run in scope). request_cancel_v2 adds taken_over, a grace and retry_after_s. Raises ZP008. Notifies zeroth_wakeup when an immediate cancel freed a slot. Time: clock_timestamp().';

-- claim_for_takeover: take over one run whose owner's lease expired more than grace ago, applying
-- the run's own choice: resumable → requeued (back to pending, claimable, checkpoints kept; the
-- attempt is given back); not resumable → failed with {stop_reason, message}; a cancel was
-- requested → cancelled. Returns the row once, or nothing (lease live or within grace, renewing
-- right now, not active, unknown). Locks: slot then run, SKIP LOCKED. Raises ZP008. Notifies
-- zeroth_wakeup (and zeroth_run_finished for thread runs). Time: clock_timestamp().
CREATE FUNCTION zeroth.claim_for_takeover(
    run_id        uuid,
    tenant_id     text             DEFAULT NULL,
    workspace_id  text             DEFAULT NULL,
    grace_seconds double precision DEFAULT 10,
    stop_reason   text             DEFAULT 'orphan_recovered',
    message       text             DEFAULT NULL,
    now_override  timestamptz      DEFAULT NULL)
    RETURNS SETOF zeroth.takeover
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now   timestamptz := zeroth._now(now_override);
    v_grace interval := zeroth._grace_interval(claim_for_takeover.grace_seconds);
BEGIN
    PERFORM zeroth._require(claim_for_takeover.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(claim_for_takeover.stop_reason, 'stop_reason');
    RETURN QUERY SELECT * FROM zeroth._take_over(
        zeroth._scope_tenant(claim_for_takeover.tenant_id, claim_for_takeover.workspace_id),
        zeroth._workspace_key(claim_for_takeover.workspace_id), claim_for_takeover.run_id, v_grace, v_now,
        claim_for_takeover.stop_reason, claim_for_takeover.message);
END
$$;
COMMENT ON FUNCTION zeroth.claim_for_takeover(uuid, text, text, double precision, text, text, timestamptz) IS
'claim_for_takeover: take over one run whose owner''s lease expired more than grace ago: resumable → requeued (pending, attempt given back), not resumable → failed with {stop_reason, message}, cancel requested → cancelled. Returns the row once, or nothing (live, within grace, being renewed, not active, unknown). SKIP LOCKED. Raises ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';

-- reconcile_thread_runs: the periodic pass over active thread runs of a scope (one deployment or
-- all) whose owners' leases expired more than grace ago; each is taken over as claim_for_takeover
-- does (its resumable choice decides). Concurrent reconcilers never block each other and report
-- each run once (SKIP LOCKED). Returns the runs taken over. Raises ZP006, ZP008. Notifies
-- zeroth_wakeup. Time: clock_timestamp().
CREATE FUNCTION zeroth.reconcile_thread_runs(
    deployment_ref text             DEFAULT NULL,
    tenant_id      text             DEFAULT NULL,
    workspace_id   text             DEFAULT NULL,
    grace_seconds  double precision DEFAULT 10,
    claim_limit    integer          DEFAULT 100,
    stop_reason    text             DEFAULT 'orphan_recovered',
    message        text             DEFAULT NULL,
    now_override   timestamptz      DEFAULT NULL)
    RETURNS SETOF zeroth.takeover
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now    timestamptz := zeroth._now(now_override);
    v_grace  interval := zeroth._grace_interval(reconcile_thread_runs.grace_seconds);
    v_tenant text := zeroth._scope_tenant(reconcile_thread_runs.tenant_id, reconcile_thread_runs.workspace_id);
    v_wskey  text := zeroth._workspace_key(reconcile_thread_runs.workspace_id);
    v_id     uuid;
BEGIN
    IF v_tenant IS NULL THEN
        RAISE EXCEPTION 'a workspace_id needs a tenant_id' USING ERRCODE = 'ZP006';
    END IF;
    PERFORM zeroth._require(reconcile_thread_runs.claim_limit BETWEEN 1 AND 1000, 'claim_limit must be between 1 and 1000');
    PERFORM zeroth._require_identifier(reconcile_thread_runs.stop_reason, 'stop_reason');
    FOR v_id IN
        SELECT r.run_id FROM zeroth.runs r
         WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey
           AND r.thread_id IS NOT NULL AND r.status IN ('pending', 'running', 'waiting')
           AND r.thread_queued_at IS NULL
           AND (reconcile_thread_runs.deployment_ref IS NULL OR r.deployment_ref = reconcile_thread_runs.deployment_ref)
           AND r.lease_expires_at + v_grace < v_now
         ORDER BY r.lease_expires_at
         LIMIT reconcile_thread_runs.claim_limit
    LOOP
        RETURN QUERY SELECT * FROM zeroth._take_over(v_tenant, v_wskey, v_id, v_grace, v_now,
                                                     reconcile_thread_runs.stop_reason, reconcile_thread_runs.message);
    END LOOP;
END
$$;
COMMENT ON FUNCTION zeroth.reconcile_thread_runs(text, text, text, double precision, integer, text, text, timestamptz) IS
'reconcile_thread_runs: take over (as claim_for_takeover) up to claim_limit active thread runs of a scope (one deployment or all) whose owners'' leases expired more than grace ago. Concurrent reconcilers never block each other or report a run twice. Raises ZP006, ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';

-- ---------------------------------------------------------------------------------------------
-- Progress and accounting
-- ---------------------------------------------------------------------------------------------

-- update_run_progress: the owner merges JSON objects into progress and/or accounting (top-level
-- keys replace, omitted keys are kept) while the run is running. Fenced by (worker_id,
-- generation, live lease). Returns false when fenced out (a terminal run has no lease). Raises
-- ZP003 (holder but not running), ZP008 (not objects, both NULL, over 64 kB). Time: clock_timestamp().
CREATE FUNCTION zeroth.update_run_progress(
    run_id       uuid,
    worker_id    text,
    generation   bigint,
    progress     jsonb       DEFAULT NULL,
    accounting   jsonb       DEFAULT NULL,
    tenant_id    text        DEFAULT NULL,
    workspace_id text        DEFAULT NULL,
    now_override timestamptz DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now    timestamptz := zeroth._now(now_override);
    v_tenant text := zeroth._scope_tenant(update_run_progress.tenant_id, update_run_progress.workspace_id);
    v_wskey  text := zeroth._workspace_key(update_run_progress.workspace_id);
BEGIN
    PERFORM zeroth._require(update_run_progress.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(update_run_progress.worker_id, 'worker_id');
    PERFORM zeroth._require(update_run_progress.generation IS NOT NULL, 'generation must not be NULL');
    PERFORM zeroth._require(update_run_progress.progress IS NOT NULL OR update_run_progress.accounting IS NOT NULL,
                            'give progress, accounting or both');
    PERFORM zeroth._require(update_run_progress.progress IS NULL OR jsonb_typeof(update_run_progress.progress) = 'object',
                            'progress must be a JSON object');
    PERFORM zeroth._require(update_run_progress.accounting IS NULL
                            OR jsonb_typeof(update_run_progress.accounting) = 'object',
                            'accounting must be a JSON object');
    PERFORM zeroth._require(coalesce(octet_length(update_run_progress.progress::text), 0)
                            + coalesce(octet_length(update_run_progress.accounting::text), 0) <= 65536,
                            'progress and accounting may hold at most 64 kB');

    UPDATE zeroth.runs r
       SET progress = CASE WHEN update_run_progress.progress IS NULL THEN r.progress
                           WHEN jsonb_typeof(r.progress) = 'object' THEN r.progress || update_run_progress.progress
                           ELSE update_run_progress.progress END,
           accounting = CASE WHEN update_run_progress.accounting IS NULL THEN r.accounting
                             ELSE coalesce(r.accounting, '{}'::jsonb) || update_run_progress.accounting END,
           updated_at = v_now
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = update_run_progress.run_id
       AND r.lease_worker_id = update_run_progress.worker_id
       AND r.lease_generation = update_run_progress.generation
       AND r.lease_expires_at >= v_now
       AND r.status = 'running';
    IF NOT FOUND THEN
        PERFORM zeroth._explain_fenced_miss(v_tenant, v_wskey, update_run_progress.run_id, update_run_progress.worker_id,
                                            update_run_progress.generation, v_now, 'update_run_progress', '{running}');
        RETURN false;
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION zeroth.update_run_progress(uuid, text, bigint, jsonb, jsonb, text, text, timestamptz) IS
'update_run_progress: the lease holder merges JSON objects into progress and/or accounting (top-level keys replace, omitted keys kept) while the run is running; fenced by (worker_id, generation, live lease). Returns false when fenced out. Raises ZP003 (holder but not running), ZP008. Time: clock_timestamp().';

-- ---------------------------------------------------------------------------------------------
-- Reads
-- ---------------------------------------------------------------------------------------------

CREATE FUNCTION zeroth._thread_run(r zeroth.runs) RETURNS zeroth.thread_run
    LANGUAGE sql IMMUTABLE
    RETURN ROW(r.run_id, r.thread_id, r.deployment_ref, r.status, r.thread_queued_at IS NOT NULL, r.wait_reason,
               r.attempts, r.max_attempts, r.resumable, r.created_at, r.started_at, r.finished_at, r.updated_at,
               r.lease_worker_id, r.lease_generation, r.lease_expires_at, r.cancel_action, r.cancel_requested_at,
               r.idempotency_key, r.payload, r.metadata, r.output, r.error, r.progress, r.accounting)::zeroth.thread_run;
COMMENT ON FUNCTION zeroth._thread_run(zeroth.runs) IS 'Internal: a runs row as zeroth.thread_run.';

-- list_thread_runs: the runs of a thread in this scope, newest first (created_at, run_id), at
-- most max_runs (capped at 1000), through runs_thread_idx. A scoped read: no locks, no
-- errors (an unknown thread is no rows). Time: none.
CREATE FUNCTION zeroth.list_thread_runs(
    thread_id    text,
    tenant_id    text    DEFAULT NULL,
    workspace_id text    DEFAULT NULL,
    max_runs     integer DEFAULT 20)
    RETURNS SETOF zeroth.thread_run
    LANGUAGE sql STABLE
    BEGIN ATOMIC
        SELECT t.*
          FROM zeroth.runs r
         CROSS JOIN LATERAL zeroth._thread_run(r) AS t
         WHERE r.tenant_id = zeroth._scope_tenant(list_thread_runs.tenant_id, list_thread_runs.workspace_id)
           AND r.workspace_key = zeroth._workspace_key(list_thread_runs.workspace_id)
           AND r.thread_id = list_thread_runs.thread_id
         ORDER BY r.created_at DESC, r.run_id DESC
         LIMIT greatest(least(list_thread_runs.max_runs, 1000), 0);
    END;
COMMENT ON FUNCTION zeroth.list_thread_runs(text, text, text, integer) IS
'list_thread_runs: the runs of a thread, newest first (created_at, run_id), at most max_runs (capped at 1000). Read only.';

-- get_thread_run: one run (with a thread or not) as zeroth.thread_run, or no row when no run
-- has this id in this scope; join re-reads a run with it. A scoped read: no locks, no errors.
-- Time: none.
CREATE FUNCTION zeroth.get_thread_run(run_id uuid, tenant_id text DEFAULT NULL, workspace_id text DEFAULT NULL)
    RETURNS SETOF zeroth.thread_run
    LANGUAGE sql STABLE
    BEGIN ATOMIC
        SELECT t.*
          FROM zeroth.runs r
         CROSS JOIN LATERAL zeroth._thread_run(r) AS t
         WHERE r.tenant_id = zeroth._scope_tenant(get_thread_run.tenant_id, get_thread_run.workspace_id)
           AND r.workspace_key = zeroth._workspace_key(get_thread_run.workspace_id)
           AND r.run_id = get_thread_run.run_id;
    END;
COMMENT ON FUNCTION zeroth.get_thread_run(uuid, text, text) IS
'get_thread_run: one run (thread or not) as zeroth.thread_run, or no row when no run has this id in this scope. Read only.';

-- ---------------------------------------------------------------------------------------------
-- 0002 functions that meet the thread rule (full replacements, same signatures)
-- ---------------------------------------------------------------------------------------------

-- enqueue_run: new → pending, or, for a thread that already has an active run, new → waiting
-- behind it (thread queue, as admit_run's enqueue strategy: promoted to pending when that run
-- ends). A repeated idempotency key (per tenant, workspace and deployment) or caller-chosen
-- run_id returns the existing run with created = false. Locks: the thread's advisory lock and
-- active run (thread runs only), else the unique-index entry. Raises ZP006 invalid_scope,
-- ZP008 invalid_argument. Notifies zeroth_wakeup when it creates a pending run. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.enqueue_run(
    deployment_ref  text,
    payload         jsonb       DEFAULT '{}'::jsonb,
    tenant_id       text        DEFAULT NULL,
    workspace_id    text        DEFAULT NULL,
    priority        integer     DEFAULT 0,
    run_after       timestamptz DEFAULT NULL,
    max_attempts    integer     DEFAULT 3,
    idempotency_key text        DEFAULT NULL,
    metadata        jsonb       DEFAULT '{}'::jsonb,
    run_id          uuid        DEFAULT NULL,
    thread_id       text        DEFAULT NULL,
    now_override    timestamptz DEFAULT NULL)
    RETURNS zeroth.enqueued_run
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now       timestamptz := zeroth._now(now_override);
    v_tenant    text := zeroth._scope_tenant(enqueue_run.tenant_id, enqueue_run.workspace_id);
    v_wskey     text := zeroth._workspace_key(enqueue_run.workspace_id);
    v_result    zeroth.enqueued_run;
    v_admission zeroth.admission;
BEGIN
    IF v_tenant IS NULL THEN
        RAISE EXCEPTION 'a workspace_id needs a tenant_id' USING ERRCODE = 'ZP006';
    END IF;
    PERFORM zeroth._require_identifier(enqueue_run.deployment_ref, 'deployment_ref');
    PERFORM zeroth._require_identifier(v_tenant, 'tenant_id');
    IF enqueue_run.workspace_id IS NOT NULL THEN
        PERFORM zeroth._require_identifier(enqueue_run.workspace_id, 'workspace_id');
    END IF;
    PERFORM zeroth._require(jsonb_typeof(enqueue_run.payload) = 'object', 'payload must be a JSON object');
    PERFORM zeroth._require(jsonb_typeof(enqueue_run.metadata) = 'object', 'metadata must be a JSON object');
    PERFORM zeroth._require(enqueue_run.priority IS NOT NULL, 'priority must not be NULL');
    PERFORM zeroth._require(enqueue_run.max_attempts BETWEEN 1 AND 1000, 'max_attempts must be between 1 and 1000');
    PERFORM zeroth._require(enqueue_run.idempotency_key IS NULL
                            OR length(enqueue_run.idempotency_key) BETWEEN 1 AND 500,
                            'idempotency_key must be NULL or 1 to 500 characters');
    PERFORM zeroth._require(enqueue_run.run_after IS NULL OR isfinite(enqueue_run.run_after),
                            'run_after must be a finite timestamp');

    IF enqueue_run.thread_id IS NOT NULL THEN
        PERFORM zeroth._require_identifier(enqueue_run.thread_id, 'thread_id');
        v_admission := zeroth._admit(v_tenant, enqueue_run.workspace_id, enqueue_run.deployment_ref,
                                     enqueue_run.thread_id, true, NULL, enqueue_run.payload, enqueue_run.metadata,
                                     enqueue_run.priority, enqueue_run.run_after, enqueue_run.max_attempts,
                                     enqueue_run.idempotency_key, enqueue_run.run_id, true, NULL, interval '0', v_now,
                                     false);
        RETURN ROW(v_admission.run_id, v_admission.outcome <> 'reused', v_admission.status)::zeroth.enqueued_run;
    END IF;

    INSERT INTO zeroth.runs AS r (
        run_id, tenant_id, workspace_id, deployment_ref, thread_id, status, priority, run_after,
        max_attempts, created_at, updated_at, payload, metadata, idempotency_key)
    VALUES (
        coalesce(enqueue_run.run_id, gen_random_uuid()), v_tenant, enqueue_run.workspace_id,
        enqueue_run.deployment_ref, enqueue_run.thread_id, 'pending', enqueue_run.priority,
        coalesce(enqueue_run.run_after, v_now), enqueue_run.max_attempts, v_now, v_now,
        enqueue_run.payload, enqueue_run.metadata, enqueue_run.idempotency_key)
    ON CONFLICT DO NOTHING
    RETURNING r.run_id, true, r.status INTO v_result.run_id, v_result.created, v_result.status;

    IF FOUND THEN
        PERFORM zeroth._notify_wakeup(enqueue_run.deployment_ref, v_tenant, enqueue_run.workspace_id);
        RETURN v_result;
    END IF;

    -- A unique index said no: return the run that holds the key (or the caller's run_id).
    SELECT r.run_id, false, r.status INTO v_result.run_id, v_result.created, v_result.status
      FROM zeroth.runs r
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND ((enqueue_run.idempotency_key IS NOT NULL
             AND r.deployment_ref = enqueue_run.deployment_ref
             AND r.idempotency_key = enqueue_run.idempotency_key)
            OR r.run_id = enqueue_run.run_id)
     ORDER BY (r.run_id = enqueue_run.run_id) IS TRUE DESC
     LIMIT 1;
    RETURN v_result;
END
$$;
COMMENT ON FUNCTION zeroth.enqueue_run(text, jsonb, text, text, integer, timestamptz, integer, text, jsonb, uuid, text, timestamptz) IS
'enqueue_run: new → pending; with a thread_id whose thread has an active run, new → waiting in the thread queue (promoted to pending when that run ends). A repeated idempotency key (per tenant, workspace, deployment) or caller-chosen run_id returns the existing run with created = false. Raises ZP006 invalid_scope, ZP008 invalid_argument. Notifies zeroth_wakeup. Time: clock_timestamp().';

-- resume_run: waiting → pending (approval given, interrupt resolved). input, when given, is stored
-- as metadata.resume_input for the next drive. A run queued behind its thread's active run is not
-- paused and cannot be resumed (ZP003): it starts when that run ends. Locks: the run row. Returns
-- true. Raises ZP001 (unknown run), ZP003 (not waiting, or queued), ZP008. Notifies zeroth_wakeup.
-- Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.resume_run(
    run_id       uuid,
    tenant_id    text        DEFAULT NULL,
    workspace_id text        DEFAULT NULL,
    input        jsonb       DEFAULT NULL,
    now_override timestamptz DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now    timestamptz := zeroth._now(now_override);
    v_tenant text := zeroth._scope_tenant(resume_run.tenant_id, resume_run.workspace_id);
    v_wskey  text := zeroth._workspace_key(resume_run.workspace_id);
    v_run    record;
BEGIN
    PERFORM zeroth._require(resume_run.run_id IS NOT NULL, 'run_id must not be NULL');

    UPDATE zeroth.runs r
       SET status = 'pending',
           wait_reason = NULL,
           run_after = v_now,
           metadata = CASE WHEN resume_run.input IS NULL THEN r.metadata
                           ELSE r.metadata || jsonb_build_object('resume_input', resume_run.input) END,
           updated_at = v_now
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = resume_run.run_id
       AND r.status = 'waiting'
       AND r.thread_queued_at IS NULL
    RETURNING r.deployment_ref, r.workspace_id INTO v_run;
    IF NOT FOUND THEN
        IF EXISTS (SELECT 1 FROM zeroth.runs r
                    WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey AND r.run_id = resume_run.run_id
                      AND r.thread_queued_at IS NOT NULL) THEN
            RAISE EXCEPTION 'run % is queued behind the active run of its thread; it starts when that run ends',
                resume_run.run_id USING ERRCODE = 'ZP003';
        END IF;
        PERFORM zeroth._explain_admin_miss(v_tenant, v_wskey, resume_run.run_id, 'resume_run', '{waiting}');
    END IF;
    PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_tenant, v_run.workspace_id);
    RETURN true;
END
$$;
COMMENT ON FUNCTION zeroth.resume_run(uuid, text, text, jsonb, timestamptz) IS
'resume_run: waiting → pending; input (if given) is stored as metadata.resume_input. A run queued behind its thread''s active run cannot be resumed. Raises ZP001 (unknown run), ZP003 (not waiting, or queued), ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';

-- redrive_run: failed or cancelled → pending (dead-letter redrive, operator replay), or → waiting
-- in the thread queue when its thread has an active run now. Resets attempts, error, output,
-- cancel and dead-letter marks; never the lease generation, so fencing stays monotonic across
-- replays. Checkpoints are kept: the next claim hands the latest one to the handler, which
-- decides whether to resume from it. Locks: the thread's advisory lock and active run (thread
-- runs), then the run row. Returns true. Raises ZP001 (unknown run), ZP003 (not failed/cancelled),
-- ZP008. Notifies zeroth_wakeup when the run became pending. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.redrive_run(
    run_id       uuid,
    tenant_id    text        DEFAULT NULL,
    workspace_id text        DEFAULT NULL,
    now_override timestamptz DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now    timestamptz := zeroth._now(now_override);
    v_tenant text := zeroth._scope_tenant(redrive_run.tenant_id, redrive_run.workspace_id);
    v_wskey  text := zeroth._workspace_key(redrive_run.workspace_id);
    v_thread text;
    v_active zeroth.runs;
    v_queue  boolean := false;
    v_run    record;
BEGIN
    PERFORM zeroth._require(redrive_run.run_id IS NOT NULL, 'run_id must not be NULL');

    SELECT r.thread_id INTO v_thread FROM zeroth.runs r
     WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey AND r.run_id = redrive_run.run_id;
    IF v_thread IS NOT NULL THEN
        PERFORM zeroth._lock_thread(v_tenant, v_wskey, v_thread);
        v_active := zeroth._lock_thread_active(v_tenant, v_wskey, v_thread, v_now);
        v_queue := v_active.run_id IS NOT NULL;
    END IF;

    UPDATE zeroth.runs r
       SET status = CASE WHEN v_queue THEN 'waiting'::zeroth.run_status ELSE 'pending'::zeroth.run_status END,
           wait_reason = CASE WHEN v_queue THEN 'thread_queue' END,
           thread_queued_at = CASE WHEN v_queue THEN zeroth._queue_position(v_tenant, v_wskey, v_thread, v_now) END,
           attempts = 0,
           run_after = v_now,
           error = NULL, output = NULL, finished_at = NULL, dead_lettered_at = NULL,
           cancel_action = NULL, cancel_requested_at = NULL,
           updated_at = v_now
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = redrive_run.run_id
       AND r.status IN ('failed', 'cancelled')
    RETURNING r.deployment_ref, r.workspace_id INTO v_run;
    IF NOT FOUND THEN
        PERFORM zeroth._explain_admin_miss(v_tenant, v_wskey, redrive_run.run_id, 'redrive_run', '{failed,cancelled}');
    END IF;
    IF NOT v_queue THEN
        PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_tenant, v_run.workspace_id);
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION zeroth.redrive_run(uuid, text, text, timestamptz) IS
'redrive_run: failed or cancelled → pending, or → waiting in the thread queue when its thread has an active run; resets attempts, error, output, cancel and dead-letter marks, never lease_generation. Raises ZP001 (unknown run), ZP003 (not failed/cancelled), ZP008. Notifies zeroth_wakeup when the run became pending. Time: clock_timestamp().';

-- claim_orphaned: take over resumable running runs whose lease expired (crashed or stalled
-- owners; a not resumable run is ended by claim_for_takeover / reconcile_thread_runs instead).
-- Each claimed run gets a new generation and recovery_checkpoint_id = its latest checkpoint.
-- claim_limit bounds the batch (NULL = all, or the free slots under max_concurrency). With no free
-- slot it probes for one orphan: saturated = an orphan is waiting; (run_id NULL, not saturated) is
-- a definitive empty scan. Locks: slot rows then run rows, SKIP LOCKED. Raises ZP006, ZP008.
-- Notifies nothing (it is the recovery path itself). Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.claim_orphaned(
    deployment_ref  text,
    worker_id       text,
    tenant_id       text             DEFAULT NULL,
    workspace_id    text             DEFAULT NULL,
    max_concurrency integer          DEFAULT NULL,
    claim_limit     integer          DEFAULT NULL,
    lease_seconds   double precision DEFAULT 60,
    now_override    timestamptz      DEFAULT NULL)
    RETURNS SETOF zeroth.claimed_run
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now    timestamptz := zeroth._now(now_override);
    v_lease  interval := zeroth._lease_interval(claim_orphaned.lease_seconds);
    v_tenant text := zeroth._scope_tenant(claim_orphaned.tenant_id, claim_orphaned.workspace_id);
    v_wskey  text := zeroth._workspace_key(claim_orphaned.workspace_id);
    v_want   integer := claim_orphaned.claim_limit;
    v_slots  integer[];
    v_active integer := 0;
    v_ids    uuid[];
BEGIN
    PERFORM zeroth._require_identifier(claim_orphaned.deployment_ref, 'deployment_ref');
    PERFORM zeroth._require_identifier(claim_orphaned.worker_id, 'worker_id');
    PERFORM zeroth._require(claim_orphaned.claim_limit IS NULL OR claim_orphaned.claim_limit BETWEEN 1 AND 1000,
                            'claim_limit must be NULL or between 1 and 1000');
    PERFORM zeroth._require(claim_orphaned.max_concurrency IS NULL OR claim_orphaned.max_concurrency >= 1,
                            'max_concurrency must be NULL or at least 1');

    IF claim_orphaned.max_concurrency IS NOT NULL THEN
        IF v_tenant IS NULL THEN
            RAISE EXCEPTION 'distributed concurrency needs an exact scope: a workspace_id needs a tenant_id'
                USING ERRCODE = 'ZP006';
        END IF;
        SELECT t.slots, t.active_count INTO v_slots, v_active
          FROM zeroth._take_slots(v_tenant, v_wskey, claim_orphaned.deployment_ref,
                                  claim_orphaned.max_concurrency,
                                  least(coalesce(claim_orphaned.claim_limit, claim_orphaned.max_concurrency),
                                        claim_orphaned.max_concurrency),
                                  v_now) AS t;
        IF cardinality(v_slots) = 0 THEN
            -- Report saturation only when work is really blocked: is any orphan waiting?
            RETURN NEXT zeroth._claim_marker(v_active, EXISTS (
                SELECT 1 FROM zeroth.runs r
                 WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey
                   AND r.deployment_ref = claim_orphaned.deployment_ref
                   AND r.status = 'running' AND r.lease_expires_at < v_now AND r.resumable),
                claim_orphaned.max_concurrency);
            RETURN;
        END IF;
        v_want := cardinality(v_slots);
    END IF;

    -- Lock first (SKIP LOCKED: never wait on another claimer), then lease what was locked.
    WITH locked AS MATERIALIZED (
        SELECT r.run_id, r.lease_expires_at, r.started_at
          FROM zeroth.runs r
         WHERE r.tenant_id = v_tenant
           AND r.workspace_key = v_wskey
           AND r.deployment_ref = claim_orphaned.deployment_ref
           AND r.status = 'running'
           AND r.lease_expires_at < v_now
           AND r.resumable
         ORDER BY r.lease_expires_at, r.started_at
         LIMIT v_want
           FOR UPDATE SKIP LOCKED
    )
    SELECT coalesce(array_agg(l.run_id ORDER BY l.lease_expires_at, l.started_at), '{}') INTO v_ids FROM locked l;
    RETURN QUERY SELECT * FROM zeroth._lease_locked_runs(
        v_tenant, v_wskey, v_ids, v_slots, claim_orphaned.worker_id, v_now, v_lease, v_active,
        claim_orphaned.max_concurrency);
END
$$;
COMMENT ON FUNCTION zeroth.claim_orphaned(text, text, text, text, integer, integer, double precision, timestamptz) IS
'claim_orphaned: take over resumable running runs whose lease expired (not resumable ones are left to claim_for_takeover); each gets a new generation and recovery_checkpoint_id = its latest checkpoint. claim_limit bounds the batch. A single run_id-NULL row reports saturation (an orphan is waiting but no slot is free) or a definitive empty scan. SKIP LOCKED throughout. Raises ZP006, ZP008. Time: clock_timestamp().';
