-- admit_run: create a run for a thread; with worker_id (admit-and-own) lease it to the caller at
-- generation 1 in the same statement (status pending: claim_pending skips it while the lease
-- lives; the caller starts it with start_run). That lease obeys the scope's zeroth.scope_limits
-- row as every claim does (a slot of its max_concurrency, a start of its rate key); paused, full
-- or out of starts, the run is admitted unleased (pending, for the ordinary claims; lease_* NULL,
-- retry_after_s = when the rate key has a start again). Strategy when the thread has an
-- active run: reject → busy; enqueue → queued behind it; interrupt / rollback → queued runs
-- cancelled and the active run cancelled with that action, then admitted — or, if a live owner
-- must first stop (cancel requested, NOTIFY), queued behind it. The caller's own active run is
-- cancelled at once only when it proves ownership with worker_id and owner_generation (its live
-- lease). A repeated idempotency key or run_id returns reused (the first admission wins, whatever
-- the payload). priority / max_attempts NULL (the defaults): the deployment's registered
-- defaults (zeroth.deployments), else 0 / 3, as enqueue_run. Locks: the thread's lock, slots, active run, queue; the rate key row and a slot,
-- SKIP LOCKED. Raises ZP003 (interrupt / rollback: the cancel's edge a DBA removed from
-- zeroth.run_transitions), ZP006, ZP008, ZP011 (an idempotency key starting 'zeroth-schedule:').
-- Notifies zeroth_wakeup, zeroth_control. Time: clock_timestamp().
-- lease_seconds NULL (default): the deployment's registered lease (zeroth.deployments; a DBA's, or
-- this login's own registration: zeroth._policy_binds_caller), else 60 s.
-- code_version (issue 34): the caller's code version (as a claim's: 1 to 128 characters, ZP008
-- otherwise); an owned admission records it on the run as a claim does (runs.code_version_id),
-- an unowned one records none (the worker that claims it will). NULL: unversioned.
CREATE OR REPLACE FUNCTION zeroth.admit_run(
    deployment_ref   text,
    thread_id        text,
    strategy         text             DEFAULT 'reject',
    worker_id        text             DEFAULT NULL,
    payload          jsonb            DEFAULT '{}'::jsonb,
    tenant_id        text             DEFAULT NULL,
    workspace_id     text             DEFAULT NULL,
    lease_seconds    double precision DEFAULT NULL,
    grace_seconds    double precision DEFAULT 10,
    idempotency_key  text             DEFAULT NULL,
    metadata         jsonb            DEFAULT '{}'::jsonb,
    run_id           uuid             DEFAULT NULL,
    priority         integer          DEFAULT NULL,
    max_attempts     integer          DEFAULT NULL,
    resumable        boolean          DEFAULT NULL,
    owner_generation bigint           DEFAULT NULL,
    code_version     text             DEFAULT NULL)
    RETURNS zeroth.admission
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now       timestamptz := zeroth._now();
    v_lease     interval := zeroth._deployment_lease(admit_run.deployment_ref, admit_run.lease_seconds);
    v_grace     interval := zeroth._grace_interval(admit_run.grace_seconds);
    v_tenant    text := zeroth._scope_tenant(admit_run.tenant_id, admit_run.workspace_id);
    v_wskey     text := zeroth._workspace_key(admit_run.workspace_id);
    v_result    zeroth.admission;
    v_displaced jsonb := '[]'::jsonb;
    v_priority  integer;
    v_attempts  integer;
    v_def_priority integer;
    v_def_attempts integer;
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
    PERFORM zeroth._require(admit_run.owner_generation IS NULL OR admit_run.worker_id IS NOT NULL,
                            'owner_generation needs a worker_id');
    PERFORM zeroth._require(admit_run.strategy IN ('reject', 'interrupt', 'rollback', 'enqueue'),
                            'strategy must be reject, interrupt, rollback or enqueue');
    PERFORM zeroth._require(jsonb_typeof(admit_run.payload) = 'object', 'payload must be a JSON object');
    PERFORM zeroth._require(jsonb_typeof(admit_run.metadata) = 'object', 'metadata must be a JSON object');
    PERFORM zeroth._require(admit_run.max_attempts IS NULL OR admit_run.max_attempts BETWEEN 1 AND 1000,
                            'max_attempts must be NULL or between 1 and 1000');
    PERFORM zeroth._require(admit_run.idempotency_key IS NULL
                            OR length(admit_run.idempotency_key) BETWEEN 1 AND 500,
                            'idempotency_key must be NULL or 1 to 500 characters');
    PERFORM zeroth._require(zeroth._key_fits(v_tenant, v_wskey, admit_run.deployment_ref,
                                             admit_run.idempotency_key),
                            'tenant_id, workspace_id, deployment_ref and idempotency_key must fit in 2600 bytes together');
    PERFORM zeroth._require_caller_key(admit_run.idempotency_key, 'idempotency_key');
    PERFORM zeroth._check_code_version(admit_run.code_version);

    IF admit_run.strategy IN ('interrupt', 'rollback') THEN
        PERFORM zeroth._lock_thread(v_tenant, v_wskey, admit_run.thread_id);
        -- Under the lock: a retried admission returns its run and interrupts nothing.
        v_result := zeroth._admission_reuse(v_tenant, v_wskey, admit_run.deployment_ref, admit_run.thread_id,
                                            admit_run.idempotency_key, admit_run.run_id, admit_run.worker_id, true);
        IF v_result.outcome IS NOT NULL THEN
            RETURN v_result;
        END IF;
        v_displaced := zeroth._displace(v_tenant, v_wskey, admit_run.thread_id, admit_run.strategy, v_grace, v_now,
                                        admit_run.worker_id, admit_run.owner_generation);
    END IF;
    -- priority / max_attempts NULL: the deployment's registered defaults (zeroth.deployments, one
    -- primary-key probe), else 0 / 3, as enqueue_run.
    v_priority := admit_run.priority;
    v_attempts := admit_run.max_attempts;
    IF v_priority IS NULL OR v_attempts IS NULL THEN
        SELECT d.priority, d.max_attempts INTO v_def_priority, v_def_attempts
          FROM zeroth.deployments d
         WHERE d.deployment_ref = admit_run.deployment_ref;
        v_priority := coalesce(v_priority, v_def_priority, 0);
        v_attempts := coalesce(v_attempts, v_def_attempts, 3);
    END IF;
    -- After a displacement the thread is idle, or its active run is stopping for a live owner:
    -- then the new run queues right behind it (the queue was cancelled).
    RETURN zeroth._admit(v_tenant, admit_run.workspace_id, admit_run.deployment_ref, admit_run.thread_id,
                         admit_run.strategy <> 'reject', admit_run.worker_id, admit_run.payload, admit_run.metadata,
                         v_priority, NULL, v_attempts, admit_run.idempotency_key,
                         admit_run.run_id, coalesce(admit_run.resumable, admit_run.worker_id IS NULL),
                         v_lease, v_grace, v_now, true, v_displaced, admit_run.code_version);
END
$$;
COMMENT ON FUNCTION zeroth.admit_run(text, text, text, text, jsonb, text, text, double precision, double precision, text, jsonb, uuid, integer, integer, boolean, bigint, text) IS
'admit_run: create a run for a thread, at most one active per thread. priority / max_attempts NULL: the deployment''s registered defaults (zeroth.deployments), else 0 / 3. worker_id = admit-and-own: leased to the caller at generation 1 in the same statement (pending; start it with start_run) when the scope''s zeroth.scope_limits row leaves room, as for a claim (not paused, a free slot of its max_concurrency, a start of its rate key); otherwise admitted unleased (lease_* NULL; retry_after_s: when the rate key has a start again), pending for the ordinary claims. Strategies when busy: reject → busy (+ active_run_id, retry_after_s); enqueue → queued behind it; interrupt / rollback → queue and active run cancelled with that action, then admitted, or queued behind a live owner asked to stop (NOTIFY). The caller''s own active run is cancelled at once only with worker_id + owner_generation of its live lease. A repeated idempotency key or run_id returns reused (first admission wins). lease_seconds NULL (the default): the deployment''s registered lease (zeroth.deployments.lease_seconds: a DBA''s, or this login''s own registration), else 60 s. code_version: the caller''s code version, recorded on an owned admission''s run as a claim records it (runs.code_version_id; NULL: unversioned). Raises ZP003 (interrupt / rollback: the cancel''s edge a DBA removed from zeroth.run_transitions), ZP006, ZP008, ZP011 reserved_key (an idempotency key starting zeroth-schedule:, reserved for fire_due_schedules). Notifies zeroth_wakeup, zeroth_control. Time: clock_timestamp().';
ALTER FUNCTION zeroth.admit_run(text, text, text, text, jsonb, text, text, double precision, double precision, text, jsonb, uuid, integer, integer, boolean, bigint, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.admit_run(text, text, text, text, jsonb, text, text, double precision, double precision, text, jsonb, uuid, integer, integer, boolean, bigint, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.admit_run(text, text, text, text, jsonb, text, text, double precision, double precision, text, jsonb, uuid, integer, integer, boolean, bigint, text) TO zeroth_worker;
