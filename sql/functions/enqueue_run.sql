-- zeroth._enqueue_run: enqueue_run without its check of a caller's key, and with schedule_id,
-- the marker of a schedule's run. Called by enqueue_run (schedule_id NULL) and by
-- fire_due_schedules, the only caller that may use a 'zeroth-schedule:' idempotency key and set
-- schedule_id (so that a worker cannot plant the runs of a DBA's future fire times).
-- priority / max_attempts NULL: the deployment's registered defaults (zeroth.deployments, one
-- primary-key lookup, made only then), else 0 / 3; an explicit value wins. The run stores what it
-- got, so a later change of the registry never changes it.
-- attempt_timeout_seconds / run_timeout_seconds (migration 0021): the run's own timeouts, whole
-- seconds, stored
-- on the run (NULL: the deployment's, read by the claims); checked by zeroth._check_timeouts.
-- Internal: SECURITY INVOKER, executable by zeroth_owner only.
-- The signature before migration 0021 (without the timeouts).
DROP FUNCTION IF EXISTS zeroth._enqueue_run(text, jsonb, text, text, integer, timestamptz, integer, text, jsonb, uuid, text, uuid);
CREATE OR REPLACE FUNCTION zeroth._enqueue_run(
    deployment_ref  text,
    payload         jsonb       DEFAULT '{}'::jsonb,
    tenant_id       text        DEFAULT NULL,
    workspace_id    text        DEFAULT NULL,
    priority        integer     DEFAULT NULL,
    run_after       timestamptz DEFAULT NULL,
    max_attempts    integer     DEFAULT NULL,
    idempotency_key text        DEFAULT NULL,
    metadata        jsonb       DEFAULT '{}'::jsonb,
    run_id          uuid        DEFAULT NULL,
    thread_id       text        DEFAULT NULL,
    schedule_id     uuid        DEFAULT NULL,
    attempt_timeout_seconds integer     DEFAULT NULL,
    run_timeout_seconds     integer     DEFAULT NULL)
    RETURNS zeroth.enqueued_run
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now       timestamptz := zeroth._now();
    v_tenant    text := zeroth._scope_tenant(_enqueue_run.tenant_id, _enqueue_run.workspace_id);
    v_wskey     text := zeroth._workspace_key(_enqueue_run.workspace_id);
    v_result    zeroth.enqueued_run;
    v_admission zeroth.admission;
    v_priority  integer := _enqueue_run.priority;
    v_attempts  integer := _enqueue_run.max_attempts;
    v_def_priority integer;
    v_def_attempts integer;
BEGIN
    IF v_tenant IS NULL THEN
        RAISE EXCEPTION 'a workspace_id needs a tenant_id' USING ERRCODE = 'ZP006';
    END IF;
    PERFORM zeroth._require_identifier(_enqueue_run.deployment_ref, 'deployment_ref');
    PERFORM zeroth._require_identifier(v_tenant, 'tenant_id');
    IF _enqueue_run.workspace_id IS NOT NULL THEN
        PERFORM zeroth._require_identifier(_enqueue_run.workspace_id, 'workspace_id');
    END IF;
    PERFORM zeroth._require(jsonb_typeof(_enqueue_run.payload) = 'object', 'payload must be a JSON object');
    PERFORM zeroth._require(jsonb_typeof(_enqueue_run.metadata) = 'object', 'metadata must be a JSON object');
    PERFORM zeroth._require(_enqueue_run.max_attempts IS NULL OR _enqueue_run.max_attempts BETWEEN 1 AND 1000,
                            'max_attempts must be NULL or between 1 and 1000');
    PERFORM zeroth._require(_enqueue_run.idempotency_key IS NULL
                            OR length(_enqueue_run.idempotency_key) BETWEEN 1 AND 500,
                            'idempotency_key must be NULL or 1 to 500 characters');
    PERFORM zeroth._require(zeroth._key_fits(v_tenant, v_wskey, _enqueue_run.deployment_ref,
                                             _enqueue_run.idempotency_key),
                            'tenant_id, workspace_id, deployment_ref and idempotency_key must fit in 2600 bytes together');
    PERFORM zeroth._require(_enqueue_run.run_after IS NULL OR isfinite(_enqueue_run.run_after),
                            'run_after must be a finite timestamp');
    IF _enqueue_run.attempt_timeout_seconds IS NOT NULL OR _enqueue_run.run_timeout_seconds IS NOT NULL THEN
        -- Only when one is given: an enqueue without runs no statement more (issue 34 item 2).
        PERFORM zeroth._check_timeouts(_enqueue_run.attempt_timeout_seconds,
                                       _enqueue_run.run_timeout_seconds);
    END IF;
    IF v_priority IS NULL OR v_attempts IS NULL THEN
        -- No row: both NULL (SELECT INTO sets its targets even when it finds nothing).
        SELECT d.priority, d.max_attempts INTO v_def_priority, v_def_attempts
          FROM zeroth.deployments d
         WHERE d.deployment_ref = _enqueue_run.deployment_ref;
        v_priority := coalesce(v_priority, v_def_priority, 0);
        v_attempts := coalesce(v_attempts, v_def_attempts, 3);
    END IF;

    IF _enqueue_run.thread_id IS NOT NULL THEN
        -- A schedule's run has no thread (fire_due_schedules passes none): no marker to carry.
        PERFORM zeroth._require(_enqueue_run.schedule_id IS NULL, 'a scheduled run has no thread_id');
        PERFORM zeroth._require_identifier(_enqueue_run.thread_id, 'thread_id');
        v_admission := zeroth._admit(v_tenant, _enqueue_run.workspace_id, _enqueue_run.deployment_ref,
                                     _enqueue_run.thread_id, true, NULL, _enqueue_run.payload, _enqueue_run.metadata,
                                     v_priority, _enqueue_run.run_after, v_attempts,
                                     _enqueue_run.idempotency_key, _enqueue_run.run_id, true, NULL, interval '0', v_now,
                                     false);
        IF v_admission.outcome <> 'reused'
           AND (_enqueue_run.attempt_timeout_seconds IS NOT NULL
                OR _enqueue_run.run_timeout_seconds IS NOT NULL) THEN
            -- A thread run's own timeouts: written after the admission (which takes none), in the
            -- same transaction, before any claim can see the run.
            UPDATE zeroth.runs r
               SET attempt_timeout_seconds = _enqueue_run.attempt_timeout_seconds,
                   run_timeout_seconds = _enqueue_run.run_timeout_seconds
             WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey
               AND r.run_id = v_admission.run_id;
        END IF;
        RETURN ROW(v_admission.run_id, v_admission.outcome <> 'reused', v_admission.status)::zeroth.enqueued_run;
    END IF;

    IF _enqueue_run.idempotency_key IS NULL AND _enqueue_run.run_id IS NULL THEN
        -- No key and a fresh run_id: nothing to conflict with, so a plain INSERT. ON CONFLICT
        -- inserts speculatively and confirms the row with a WAL record of its own (HEAP_CONFIRM,
        -- 48 bytes a run: issue 30, item 3); a collision of fresh ids would raise
        -- unique_violation instead of passing unseen.
        INSERT INTO zeroth.runs AS r (
            run_id, tenant_id, workspace_id, deployment_ref, status, priority, run_after,
            max_attempts, created_at, updated_at, payload, metadata, schedule_id,
            attempt_timeout_seconds, run_timeout_seconds)
        VALUES (
            gen_random_uuid(), v_tenant, _enqueue_run.workspace_id,
            _enqueue_run.deployment_ref, 'pending', v_priority,
            coalesce(_enqueue_run.run_after, v_now), v_attempts, v_now, v_now,
            _enqueue_run.payload, _enqueue_run.metadata, _enqueue_run.schedule_id,
            _enqueue_run.attempt_timeout_seconds, _enqueue_run.run_timeout_seconds)
        RETURNING r.run_id, true, r.status INTO v_result.run_id, v_result.created, v_result.status;
    ELSE
        INSERT INTO zeroth.runs AS r (
            run_id, tenant_id, workspace_id, deployment_ref, status, priority, run_after,
            max_attempts, created_at, updated_at, payload, metadata, idempotency_key, schedule_id,
            attempt_timeout_seconds, run_timeout_seconds)
        VALUES (
            coalesce(_enqueue_run.run_id, gen_random_uuid()), v_tenant, _enqueue_run.workspace_id,
            _enqueue_run.deployment_ref, 'pending', v_priority,
            coalesce(_enqueue_run.run_after, v_now), v_attempts, v_now, v_now,
            _enqueue_run.payload, _enqueue_run.metadata, _enqueue_run.idempotency_key, _enqueue_run.schedule_id,
            _enqueue_run.attempt_timeout_seconds, _enqueue_run.run_timeout_seconds)
        ON CONFLICT DO NOTHING
        RETURNING r.run_id, true, r.status INTO v_result.run_id, v_result.created, v_result.status;
    END IF;

    IF FOUND THEN
        IF coalesce(_enqueue_run.run_after, v_now) <= v_now THEN
            PERFORM zeroth._notify_wakeup(_enqueue_run.deployment_ref, v_tenant, _enqueue_run.workspace_id);
        END IF;
        RETURN v_result;
    END IF;

    -- A unique index said no: return the run that holds the key (or the caller's run_id). One
    -- branch per unique index, the run_id match first: an OR of the two is no index condition,
    -- and a generic plan made on a small table filtered the whole scope (as _admission_reuse).
    SELECT x.run_id, false, x.status INTO v_result.run_id, v_result.created, v_result.status
      FROM (SELECT r.run_id, r.status, true AS by_run_id
              FROM zeroth.runs r
             WHERE r.tenant_id = v_tenant
               AND r.workspace_key = v_wskey
               AND r.run_id = _enqueue_run.run_id
            UNION ALL
            SELECT r.run_id, r.status, false
              FROM zeroth.runs r
             WHERE r.tenant_id = v_tenant
               AND r.workspace_key = v_wskey
               AND r.deployment_ref = _enqueue_run.deployment_ref
               AND r.idempotency_key = _enqueue_run.idempotency_key) x
     ORDER BY x.by_run_id DESC
     LIMIT 1;
    RETURN v_result;
END
$$;
COMMENT ON FUNCTION zeroth._enqueue_run(text, jsonb, text, text, integer, timestamptz, integer, text, jsonb, uuid, text, uuid, integer, integer) IS 'Internal: enqueue_run''s transition without the caller-key check, with runs.schedule_id (set only by fire_due_schedules).';
ALTER FUNCTION zeroth._enqueue_run(text, jsonb, text, text, integer, timestamptz, integer, text, jsonb, uuid, text, uuid, integer, integer) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._enqueue_run(text, jsonb, text, text, integer, timestamptz, integer, text, jsonb, uuid, text, uuid, integer, integer) FROM PUBLIC;

-- enqueue_run: new → pending, or, for a thread that already has an active run, new → waiting
-- behind it (thread queue, as admit_run's enqueue strategy: promoted to pending when that run
-- ends). A repeated idempotency key (per tenant, workspace and deployment) or caller-chosen
-- run_id returns the existing run with created = false (the first enqueue wins, whatever the
-- payload). priority / max_attempts NULL (the defaults): the deployment's registered defaults
-- (zeroth.deployments: register_deployment, set_deployment_defaults), else 0 / 3; an explicit
-- value wins, and the run keeps what it got. attempt_timeout_seconds / run_timeout_seconds (since
-- 0021): this run's bound on an attempt's wall time and on its total time from its first claim,
-- over the deployment's (NULL: the deployment's, if any). Locks: the thread's lock and active run (thread runs only), else the
-- unique-index entry. Raises ZP006 invalid_scope, ZP008 invalid_argument, ZP011 reserved_key (an
-- idempotency key starting 'zeroth-schedule:', the schedules' own). Notifies zeroth_wakeup when it
-- creates a pending run that is due now. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.enqueue_run(
    deployment_ref  text,
    payload         jsonb       DEFAULT '{}'::jsonb,
    tenant_id       text        DEFAULT NULL,
    workspace_id    text        DEFAULT NULL,
    priority        integer     DEFAULT NULL,
    run_after       timestamptz DEFAULT NULL,
    max_attempts    integer     DEFAULT NULL,
    idempotency_key text        DEFAULT NULL,
    metadata        jsonb       DEFAULT '{}'::jsonb,
    run_id          uuid        DEFAULT NULL,
    thread_id       text        DEFAULT NULL,
    attempt_timeout_seconds integer     DEFAULT NULL,
    run_timeout_seconds     integer     DEFAULT NULL)
    RETURNS zeroth.enqueued_run
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM zeroth._require_caller_key(enqueue_run.idempotency_key, 'idempotency_key');
    RETURN zeroth._enqueue_run(
        deployment_ref  => enqueue_run.deployment_ref,
        payload         => enqueue_run.payload,
        tenant_id       => enqueue_run.tenant_id,
        workspace_id    => enqueue_run.workspace_id,
        priority        => enqueue_run.priority,
        run_after       => enqueue_run.run_after,
        max_attempts    => enqueue_run.max_attempts,
        idempotency_key => enqueue_run.idempotency_key,
        metadata        => enqueue_run.metadata,
        run_id          => enqueue_run.run_id,
        thread_id       => enqueue_run.thread_id,
        attempt_timeout_seconds => enqueue_run.attempt_timeout_seconds,
        run_timeout_seconds     => enqueue_run.run_timeout_seconds);
END
$$;
COMMENT ON FUNCTION zeroth.enqueue_run(text, jsonb, text, text, integer, timestamptz, integer, text, jsonb, uuid, text, integer, integer) IS
'enqueue_run: new → pending; with a thread_id whose thread has an active run, new → waiting in the thread queue (promoted to pending when that run ends). A repeated idempotency key (per tenant, workspace, deployment) or caller-chosen run_id returns the existing run with created = false (first enqueue wins, whatever the payload). priority / max_attempts NULL (default): the deployment''s registered defaults (zeroth.deployments), else 0 / 3; an explicit value wins and the run keeps what it got. attempt_timeout_seconds (whole seconds, 1 to 30 days) / run_timeout_seconds (1 to 365 days): this run''s bound on an attempt''s wall time and on its total time from its first claim, over the deployment''s (NULL: the deployment''s). Raises ZP006 invalid_scope, ZP008 invalid_argument, ZP011 reserved_key (an idempotency key starting zeroth-schedule:, reserved for fire_due_schedules). Notifies zeroth_wakeup when it creates a pending run that is due now. Time: clock_timestamp().';
ALTER FUNCTION zeroth.enqueue_run(text, jsonb, text, text, integer, timestamptz, integer, text, jsonb, uuid, text, integer, integer) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.enqueue_run(text, jsonb, text, text, integer, timestamptz, integer, text, jsonb, uuid, text, integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.enqueue_run(text, jsonb, text, text, integer, timestamptz, integer, text, jsonb, uuid, text, integer, integer) TO zeroth_worker;
