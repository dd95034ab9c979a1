-- enqueue_run: new → pending, or, for a thread that already has an active run, new → waiting
-- behind it (thread queue, as admit_run's enqueue strategy: promoted to pending when that run
-- ends). A repeated idempotency key (per tenant, workspace and deployment) or caller-chosen
-- run_id returns the existing run with created = false (the first enqueue wins, whatever the
-- payload). Locks: the thread's lock and active run (thread runs only), else the
-- unique-index entry. Raises ZP006 invalid_scope, ZP008 invalid_argument. Notifies zeroth_wakeup
-- when it creates a pending run that is due now. Time: clock_timestamp().
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
    thread_id       text        DEFAULT NULL)
    RETURNS zeroth.enqueued_run
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now       timestamptz := zeroth._now();
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
    PERFORM zeroth._require(zeroth._key_fits(v_tenant, v_wskey, enqueue_run.deployment_ref,
                                             enqueue_run.idempotency_key),
                            'tenant_id, workspace_id, deployment_ref and idempotency_key must fit in 2600 bytes together');
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
        run_id, tenant_id, workspace_id, deployment_ref, status, priority, run_after,
        max_attempts, created_at, updated_at, payload, metadata, idempotency_key)
    VALUES (
        coalesce(enqueue_run.run_id, gen_random_uuid()), v_tenant, enqueue_run.workspace_id,
        enqueue_run.deployment_ref, 'pending', enqueue_run.priority,
        coalesce(enqueue_run.run_after, v_now), enqueue_run.max_attempts, v_now, v_now,
        enqueue_run.payload, enqueue_run.metadata, enqueue_run.idempotency_key)
    ON CONFLICT DO NOTHING
    RETURNING r.run_id, true, r.status INTO v_result.run_id, v_result.created, v_result.status;

    IF FOUND THEN
        IF coalesce(enqueue_run.run_after, v_now) <= v_now THEN
            PERFORM zeroth._notify_wakeup(enqueue_run.deployment_ref, v_tenant, enqueue_run.workspace_id);
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
               AND r.run_id = enqueue_run.run_id
            UNION ALL
            SELECT r.run_id, r.status, false
              FROM zeroth.runs r
             WHERE r.tenant_id = v_tenant
               AND r.workspace_key = v_wskey
               AND r.deployment_ref = enqueue_run.deployment_ref
               AND r.idempotency_key = enqueue_run.idempotency_key) x
     ORDER BY x.by_run_id DESC
     LIMIT 1;
    RETURN v_result;
END
$$;
COMMENT ON FUNCTION zeroth.enqueue_run(text, jsonb, text, text, integer, timestamptz, integer, text, jsonb, uuid, text) IS
'enqueue_run: new → pending; with a thread_id whose thread has an active run, new → waiting in the thread queue (promoted to pending when that run ends). A repeated idempotency key (per tenant, workspace, deployment) or caller-chosen run_id returns the existing run with created = false (first enqueue wins, whatever the payload). Raises ZP006 invalid_scope, ZP008 invalid_argument. Notifies zeroth_wakeup when it creates a pending run that is due now. Time: clock_timestamp().';
ALTER FUNCTION zeroth.enqueue_run(text, jsonb, text, text, integer, timestamptz, integer, text, jsonb, uuid, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.enqueue_run(text, jsonb, text, text, integer, timestamptz, integer, text, jsonb, uuid, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.enqueue_run(text, jsonb, text, text, integer, timestamptz, integer, text, jsonb, uuid, text) TO zeroth_worker;
