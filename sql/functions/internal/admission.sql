-- sql/functions/internal/admission.sql: thread admission (admit_run and enqueue_run(s) with a thread_id).
-- Internal helpers: SECURITY INVOKER, executable by zeroth_owner only (they run inside the
-- SECURITY DEFINER public functions). Re-applied by every upgrade (sql/README.md).

-- An existing run that an admission must return instead of creating one: same idempotency key
-- (tenant, workspace, deployment) or same caller-chosen run_id. The first admission wins: a retry
-- gets that run back whatever payload it carries now, sequentially or concurrently. strict: it
-- must belong to this thread (admit_run), else ZP008. The lease is reported only to its holder.
CREATE OR REPLACE FUNCTION zeroth._admission_reuse(tenant_id text, workspace_key text, deployment_ref text, thread_id text,
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
    -- One branch per unique index (the primary key, the key's index), the run_id match first. An
    -- OR of the two is no index condition: a generic plan made while the table was small read
    -- the whole scope through runs_pkey and filtered it, every run of its history per admission.
    SELECT x.run_id, x.thread_id, x.status, x.lease_worker_id, x.lease_generation, x.lease_expires_at
      INTO v_run
      FROM (SELECT r.run_id, r.thread_id, r.status, r.lease_worker_id, r.lease_generation,
                   r.lease_expires_at, true AS by_run_id
              FROM zeroth.runs r
             WHERE r.tenant_id = _admission_reuse.tenant_id
               AND r.workspace_key = _admission_reuse.workspace_key
               AND r.run_id = _admission_reuse.run_id
            UNION ALL
            SELECT r.run_id, r.thread_id, r.status, r.lease_worker_id, r.lease_generation,
                   r.lease_expires_at, false
              FROM zeroth.runs r
             WHERE r.tenant_id = _admission_reuse.tenant_id
               AND r.workspace_key = _admission_reuse.workspace_key
               AND r.deployment_ref = _admission_reuse.deployment_ref
               AND r.idempotency_key = _admission_reuse.idempotency_key) x
     ORDER BY x.by_run_id DESC
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
COMMENT ON FUNCTION zeroth._admission_reuse(text, text, text, text, text, uuid, text, boolean) IS 'Internal: the run an admission returns as reused (same idempotency key or run_id; the first admission wins whatever the payload), or a NULL outcome.';
ALTER FUNCTION zeroth._admission_reuse(text, text, text, text, text, uuid, text, boolean) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._admission_reuse(text, text, text, text, text, uuid, text, boolean) FROM PUBLIC;

-- interrupt / rollback: the new run supersedes the thread's queue and its active run. Locks the
-- active run (slots, then run), then the queue; cancels the queued runs first, so ending the
-- active run promotes nothing, then the active run (_cancel: at once, taken over, or — a live
-- owner other than the caller's proven lease — asked to stop). Returns
-- [{run_id, outcome, worker_id, lease_generation}].
CREATE OR REPLACE FUNCTION zeroth._displace(tenant_id text, workspace_key text, thread_id text, action text, grace interval,
                                 at timestamptz, worker_id text, owner_generation bigint)
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
                                   _displace.grace, _displace.at);
        v_displaced := v_displaced || jsonb_build_array(jsonb_build_object(
            'run_id', v_cancel.run_id, 'outcome', v_cancel.outcome, 'worker_id', NULL, 'lease_generation', NULL));
    END LOOP;
    v_cancel := zeroth._cancel(_displace.tenant_id, _displace.workspace_key, v_active.run_id, _displace.action,
                               _displace.grace, _displace.at, _displace.worker_id, _displace.owner_generation);
    RETURN v_displaced || jsonb_build_array(jsonb_build_object(
        'run_id', v_cancel.run_id, 'outcome', v_cancel.outcome, 'worker_id', v_cancel.lease_worker_id,
        'lease_generation', v_cancel.lease_generation));
END
$$;
COMMENT ON FUNCTION zeroth._displace(text, text, text, text, interval, timestamptz, text, bigint) IS 'Internal: interrupt / rollback of a thread: cancel its queue, then cancel (or ask the live owner to stop) its active run; returns the displaced runs.';
ALTER FUNCTION zeroth._displace(text, text, text, text, interval, timestamptz, text, bigint) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._displace(text, text, text, text, interval, timestamptz, text, bigint) FROM PUBLIC;

-- The admission proper, shared by admit_run (after _displace), enqueue_run and enqueue_runs: an
-- idle thread admits (leased to worker_id when given and the scope has room for one more lease
-- under its zeroth.scope_limits row, as a claim would: not paused, a start of its rate key, a
-- free slot of its max_concurrency; otherwise admitted unleased, pending for the ordinary claims,
-- retry_after_s = when the rate key has a start again), a busy one answers busy (reject) or queues
-- the run (enqueue). Serialised per thread by the thread's lock (_lock_thread); a retried admission is looked up
-- again once the lock is held (its first attempt may have committed while we waited), and the
-- unique index is the backstop (ON CONFLICT DO NOTHING, then look again). displaced is passed
-- through to the result. code_version (issue 34): an owned admission is a claim of a run not yet
-- started, and records the owner's version as the claims do (runs.code_version_id; its text in
-- zeroth.code_versions); an unowned one records none (its claimer will). (The signature before
-- 0022, without code_version, is dropped first.)
DROP FUNCTION IF EXISTS zeroth._admit(text, text, text, text, boolean, text, jsonb, jsonb, integer, timestamptz, integer, text, uuid, boolean, interval, interval, timestamptz, boolean, jsonb);
CREATE OR REPLACE FUNCTION zeroth._admit(
    tenant_id text, workspace_id text, deployment_ref text, thread_id text, queue_when_busy boolean,
    worker_id text, payload jsonb, metadata jsonb, priority integer, run_after timestamptz, max_attempts integer,
    idempotency_key text, run_id uuid, resumable boolean, lease interval, grace interval, at timestamptz,
    strict boolean, displaced jsonb DEFAULT '[]'::jsonb, code_version text DEFAULT NULL)
    RETURNS zeroth.admission
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_wskey  text := zeroth._workspace_key(_admit.workspace_id);
    v_result zeroth.admission;
    v_active zeroth.runs;
    v_queue  boolean;
    v_owned  boolean;
    v_new    record;
    v_took   boolean := false;
    v_lease  boolean;
    v_slot   integer;
    v_rate   text;
    v_retry  timestamptz;
    v_rate_at timestamptz;
    -- the deployment's timeouts, for an owned admission's lease (issue 34 item 2)
    v_attempt_tmo double precision;
    v_run_tmo     double precision;
BEGIN
    -- A retried admission needs no lock...
    v_result := zeroth._admission_reuse(_admit.tenant_id, v_wskey, _admit.deployment_ref, _admit.thread_id,
                                        _admit.idempotency_key, _admit.run_id, _admit.worker_id, _admit.strict);
    IF v_result.outcome IS NOT NULL THEN
        RETURN v_result;
    END IF;
    PERFORM zeroth._lock_thread(_admit.tenant_id, v_wskey, _admit.thread_id);
    -- ...unless its first attempt was in flight: under the lock, that one has committed.
    v_result := zeroth._admission_reuse(_admit.tenant_id, v_wskey, _admit.deployment_ref, _admit.thread_id,
                                        _admit.idempotency_key, _admit.run_id, _admit.worker_id, _admit.strict);
    IF v_result.outcome IS NOT NULL THEN
        RETURN v_result;
    END IF;

    FOR v_attempt IN 1..100 LOOP
        v_active := zeroth._lock_thread_active(_admit.tenant_id, v_wskey, _admit.thread_id, _admit.at);
        v_queue := v_active.run_id IS NOT NULL;
        IF v_queue AND NOT _admit.queue_when_busy THEN
            RETURN ROW('busy', NULL, NULL, NULL, NULL, v_active.run_id,
                       zeroth._retry_after(v_active.lease_expires_at, _admit.grace, _admit.at),
                       _admit.displaced)::zeroth.admission;
        END IF;

        v_owned := _admit.worker_id IS NOT NULL AND NOT v_queue;
        IF v_owned AND NOT v_took THEN
            -- Every lease obeys the scope's pause, slots and rate, as a claim does (taken once:
            -- a second pass of this loop keeps the room the first one took).
            SELECT t.leasable, t.slot, t.rate_limit, t.retry_at, t.decided_at
              INTO v_lease, v_slot, v_rate, v_retry, v_rate_at
              FROM zeroth._take_lease_room(_admit.tenant_id, v_wskey, _admit.deployment_ref,
                                           _admit.at) AS t;
            v_took := true;
        END IF;
        v_owned := v_owned AND v_lease;
        IF v_owned THEN
            -- An owned admission is a claim: it fixes the attempt and run deadlines of the
            -- deployment's timeouts and caps the lease there, as zeroth._lease_locked_runs does
            -- (bound by the rule of the claims: zeroth._policy_binds_caller).
            SELECT d.attempt_timeout_seconds, d.run_timeout_seconds INTO v_attempt_tmo, v_run_tmo
              FROM zeroth.deployments d
             WHERE d.deployment_ref = _admit.deployment_ref
               AND zeroth._policy_binds_caller(d.managed_by, d.registered_by);
        END IF;
        INSERT INTO zeroth.runs AS r (
            run_id, tenant_id, workspace_id, deployment_ref, thread_id, status, wait_reason, thread_queued_at,
            priority, run_after, max_attempts, created_at, updated_at, payload, metadata, idempotency_key,
            resumable, lease_worker_id, lease_acquired_at, lease_expires_at, lease_generation,
            admission_slot, attempt_deadline_at, run_deadline_at, code_version_id)
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
            CASE WHEN v_owned THEN least(_admit.at + _admit.lease,
                                         _admit.at + make_interval(secs => v_attempt_tmo),
                                         _admit.at + make_interval(secs => v_run_tmo)) END,
            -- Above every generation an earlier WAL timeline handed out (internal/generations.sql):
            -- a caller's run_id admitted and owned before a lossy failover is not owned at the
            -- same generation again.
            CASE WHEN v_owned THEN zeroth._generation_floor() + 1 ELSE 0 END,
            CASE WHEN v_owned THEN v_slot END,
            CASE WHEN v_owned THEN _admit.at + make_interval(secs => v_attempt_tmo) END,
            CASE WHEN v_owned THEN _admit.at + make_interval(secs => v_run_tmo) END,
            CASE WHEN v_owned THEN zeroth._code_version_hash(_admit.code_version) END)
        ON CONFLICT DO NOTHING
        RETURNING r.run_id, r.status, r.lease_generation, r.lease_expires_at, r.run_after INTO v_new;
        IF FOUND THEN
            IF v_queue THEN
                PERFORM zeroth._mark_queue_changed(_admit.tenant_id, v_wskey, v_active.run_id);
            END IF;
            IF v_owned AND v_slot IS NOT NULL THEN  -- the slot names (run, its first generation)
                UPDATE zeroth.admission_slots s
                   SET run_id = v_new.run_id, lease_generation = v_new.lease_generation
                 WHERE s.tenant_id = _admit.tenant_id AND s.workspace_key = v_wskey
                   AND s.deployment_ref = _admit.deployment_ref AND s.slot_no = v_slot;
            END IF;
            IF v_owned AND v_rate IS NOT NULL THEN  -- a start of the rate key
                PERFORM zeroth._log_rate(v_rate, 1, v_rate_at);
            END IF;
            IF v_owned AND _admit.code_version IS NOT NULL THEN  -- the version's text, as a claim
                PERFORM zeroth._code_version_id(_admit.code_version);
            END IF;
            IF NOT v_queue AND NOT v_owned AND v_new.run_after <= _admit.at THEN
                PERFORM zeroth._notify_wakeup(_admit.deployment_ref, _admit.tenant_id, _admit.workspace_id);
            END IF;
            RETURN ROW(CASE WHEN v_queue THEN 'queued' ELSE 'admitted' END, v_new.run_id, v_new.status,
                       CASE WHEN v_owned THEN v_new.lease_generation END, v_new.lease_expires_at,
                       v_active.run_id,
                       CASE WHEN v_queue THEN zeroth._retry_after(v_active.lease_expires_at, _admit.grace, _admit.at)
                            WHEN NOT v_owned AND v_retry IS NOT NULL
                            THEN zeroth._retry_after(v_retry, interval '0', v_rate_at) END,
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
COMMENT ON FUNCTION zeroth._admit(text, text, text, text, boolean, text, jsonb, jsonb, integer, timestamptz, integer, text, uuid, boolean, interval, interval, timestamptz, boolean, jsonb, text) IS 'Internal: the admission of admit_run and of enqueue_run(s) with a thread_id: admitted, queued, busy or reused; an owned admission records code_version (runs.code_version_id, zeroth.code_versions).';
ALTER FUNCTION zeroth._admit(text, text, text, text, boolean, text, jsonb, jsonb, integer, timestamptz, integer, text, uuid, boolean, interval, interval, timestamptz, boolean, jsonb, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._admit(text, text, text, text, boolean, text, jsonb, jsonb, integer, timestamptz, integer, text, uuid, boolean, interval, interval, timestamptz, boolean, jsonb, text) FROM PUBLIC;
