-- fail_run: running → pending (retryable, attempts < max_attempts: run_after = now + exponential
-- backoff with jitter) or → failed (non-retryable), or → failed and dead-lettered (retryable but
-- attempts exhausted). Fenced; clears the lease and frees the slot. Returns 'retry_scheduled',
-- 'failed' or 'dead_lettered', or NULL when fenced out. The error document is stored bounded
-- (zeroth._bounded_error: 65,536 characters a top-level string, 1 MiB the document). Raises
-- ZP003, ZP008. Notifies zeroth_wakeup when a slot was freed or the retry is due at once. Time:
-- clock_timestamp(). retry_base_seconds / retry_max_seconds NULL: the deployment's registered
-- policy (zeroth.deployments, read now: a change of policy applies to the next failure of every
-- run of the deployment) when it binds this session (a DBA's row, or this login's registration:
-- zeroth._policy_binds_caller), else 1 / 300.
CREATE OR REPLACE FUNCTION zeroth.fail_run(
    run_id             uuid,
    worker_id          text,
    generation         bigint,
    error              jsonb            DEFAULT NULL,
    retryable          boolean          DEFAULT true,
    retry_base_seconds double precision DEFAULT NULL,
    retry_max_seconds  double precision DEFAULT NULL,
    tenant_id          text             DEFAULT NULL,
    workspace_id       text             DEFAULT NULL)
    RETURNS text
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_tenant  text := zeroth._scope_tenant(fail_run.tenant_id, fail_run.workspace_id);
    v_wskey   text := zeroth._workspace_key(fail_run.workspace_id);
    v_error   jsonb;
    v_base    double precision;
    v_max     double precision;
    v_end     record;
BEGIN
    PERFORM zeroth._require(fail_run.retryable IS NOT NULL, 'retryable must not be NULL');
    -- The retry policy the caller left NULL: the deployment's registered one (one lookup by the
    -- run's key and the registry's primary key, no lock) when a DBA set it or this login
    -- registered it (another login's registration does not set this caller's backoff), else
    -- 1 / 300.
    IF fail_run.retry_base_seconds IS NULL OR fail_run.retry_max_seconds IS NULL THEN
        SELECT d.retry_base_seconds, d.retry_max_seconds INTO v_base, v_max
          FROM zeroth.runs r JOIN zeroth.deployments d ON d.deployment_ref = r.deployment_ref
         WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey AND r.run_id = fail_run.run_id
           AND zeroth._policy_binds_caller(d.managed_by, d.registered_by);
        fail_run.retry_base_seconds := coalesce(fail_run.retry_base_seconds, v_base, 1);
        fail_run.retry_max_seconds := coalesce(fail_run.retry_max_seconds, v_max, 300);
    END IF;
    PERFORM zeroth._require(fail_run.retry_base_seconds >= 0 AND fail_run.retry_max_seconds >= fail_run.retry_base_seconds
                            AND fail_run.retry_max_seconds <= 86400 * 30,
                            'need 0 <= retry_base_seconds <= retry_max_seconds <= 30 days');
    -- The caller's error document, bounded before any lock is taken (zeroth._bounded_error: a
    -- longer text is cut, a larger document summarised, never refused, so the attempt still ends).
    v_error := zeroth._bounded_error(fail_run.error);

    -- The settle path (sql/functions/internal/settle.sql): checks, lock, clock, settle. A
    -- retryable failure is retried with backoff while attempts < max_attempts, else
    -- dead-lettered; a non-retryable one fails.
    v_end := zeroth._settle_one(v_tenant, v_wskey, fail_run.run_id, fail_run.worker_id, fail_run.generation,
                                CASE WHEN fail_run.retryable THEN 'retry' ELSE 'fail' END,
                                payload => v_error,
                                retry_base_seconds => fail_run.retry_base_seconds,
                                retry_max_seconds => fail_run.retry_max_seconds);
    PERFORM zeroth._raise_unlisted_edge('fail_run', fail_run.run_id, v_end.from_status, v_end.sqlstate);
    RETURN CASE v_end.outcome WHEN 'retried' THEN 'retry_scheduled' ELSE v_end.outcome END;
END
$$;
COMMENT ON FUNCTION zeroth.fail_run(uuid, text, bigint, jsonb, boolean, double precision, double precision, text, text) IS
'fail_run: running → pending with exponential backoff + jitter (retryable, attempts < max_attempts), → failed (not retryable), or → failed + dead_lettered_at (retries exhausted). Fenced; clears the lease, frees the slot. The error document is stored bounded: each top-level string longer than 65,536 characters cut ("truncated": true), a document still over 1 MiB replaced by its summary (docs/sql-api.md, "Error documents"). retry_base_seconds / retry_max_seconds NULL (the defaults): the deployment''s registered policy (zeroth.deployments, read at this failure: a change applies to the next failure) when a DBA set it (managed_by sql, or registered_by NULL) or this session''s login registered it (registered_by = session_user), else 1 / 300; 0 <= base <= max <= 30 days. Returns retry_scheduled | failed | dead_lettered, or NULL when fenced out. Raises ZP003, ZP008. Notifies zeroth_wakeup when a slot was freed or the retry is due at once. Time: clock_timestamp().';
ALTER FUNCTION zeroth.fail_run(uuid, text, bigint, jsonb, boolean, double precision, double precision, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.fail_run(uuid, text, bigint, jsonb, boolean, double precision, double precision, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.fail_run(uuid, text, bigint, jsonb, boolean, double precision, double precision, text, text) TO zeroth_worker;
