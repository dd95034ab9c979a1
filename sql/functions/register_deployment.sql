-- The signature before migration 0020 (without the retry policy and lease).
DROP FUNCTION IF EXISTS zeroth.register_deployment(text, integer, integer);

-- register_deployment: an application declares a deployment's defaults when it starts
-- (zeroth_worker: the App runs as one). Missing: created (managed_by 'app'). Registered by an
-- application before: changed to these values when they differ — the last registration wins, and
-- the change (old → new, who, when) is in zeroth.deployment_changes, so two versions of an
-- application that disagree during a rolling deploy are visible, never silent. Set by a DBA
-- (managed_by 'sql'), or registered by another login's application: kept as it is (one trust
-- domain's worker role does not set the defaults of another's runs; a DBA hands a row over with
-- set_deployment_defaults). retry_base_seconds / retry_max_seconds / lease_seconds NULL: the
-- application sets none (the registered value becomes NULL, not set). attempt_timeout_seconds /
-- run_timeout_seconds (migration 0021): the bound on an attempt's wall time and on a run's total
-- time the claims fix as deadlines (NULL: none). Locks the deployment's row
-- only to change it, waiting at most 2 s. Raises ZP008, 55P03. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.register_deployment(
    deployment_ref     text,
    max_attempts       integer          DEFAULT 3,
    priority           integer          DEFAULT 0,
    retry_base_seconds double precision DEFAULT NULL,
    retry_max_seconds  double precision DEFAULT NULL,
    lease_seconds      double precision DEFAULT NULL,
    attempt_timeout_seconds double precision DEFAULT NULL,
    run_timeout_seconds     double precision DEFAULT NULL)
    RETURNS zeroth.deployment_registration
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    SET lock_timeout = '2s' AS $$
BEGIN
    PERFORM zeroth._require_identifier(register_deployment.deployment_ref, 'deployment_ref');
    PERFORM zeroth._require(register_deployment.max_attempts BETWEEN 1 AND 1000,
                            'max_attempts must be between 1 and 1000');
    PERFORM zeroth._require(register_deployment.priority IS NOT NULL, 'priority must not be NULL');
    PERFORM zeroth._check_deployment_policy(register_deployment.retry_base_seconds,
                                            register_deployment.retry_max_seconds,
                                            register_deployment.lease_seconds);
    PERFORM zeroth._check_timeouts(register_deployment.attempt_timeout_seconds,
                                   register_deployment.run_timeout_seconds);
    -- A registration states the whole policy: what it leaves NULL is not set.
    RETURN zeroth._change_deployment(
        register_deployment.deployment_ref, register_deployment.max_attempts,
        register_deployment.priority, register_deployment.retry_base_seconds,
        register_deployment.retry_max_seconds, register_deployment.lease_seconds,
        register_deployment.attempt_timeout_seconds, register_deployment.run_timeout_seconds,
        ARRAY['retry_base_seconds', 'retry_max_seconds', 'lease_seconds',
              'attempt_timeout_seconds', 'run_timeout_seconds'], 'app',
        'register_deployment');
END
$$;
COMMENT ON FUNCTION zeroth.register_deployment(text, integer, integer, double precision, double precision, double precision, double precision, double precision) IS
'register_deployment: an application declares a deployment''s defaults at start: max_attempts, priority (what enqueue_run / enqueue_runs give a run that names none), retry_base_seconds / retry_max_seconds (the backoff fail_run applies when its caller passes none) lease_seconds (the lease of a claim that names none), attempt_timeout_seconds / run_timeout_seconds (the bound on an attempt''s wall time and on a run''s total time from its first claim, for runs that carry none: the claim fixes the deadlines); NULL: not set (fail_run''s 1 / 300, a claim''s 60 s). Bounds: 0 <= base <= max <= 30 days (NULL counting as 1 / 300), 1 <= lease <= 86400, 1 <= attempt timeout <= 30 days, 1 <= run timeout <= 365 days. Created when missing (managed_by app); an application''s earlier registration is changed to these values (last registration wins; previous holds the values it replaced, and zeroth.deployment_changes the change, who and when); a row a DBA set (managed_by sql), or that another login''s application registered (registered_by), is kept; a call that changes nothing takes no lock. Outcome created, updated, unchanged or kept. Waits at most 2 s (lock_timeout) for a change of the row another session holds: 55P03. Raises ZP008 invalid_argument, 55P03 lock_not_available. Time: clock_timestamp().';
ALTER FUNCTION zeroth.register_deployment(text, integer, integer, double precision, double precision, double precision, double precision, double precision) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.register_deployment(text, integer, integer, double precision, double precision, double precision, double precision, double precision) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.register_deployment(text, integer, integer, double precision, double precision, double precision, double precision, double precision) TO zeroth_worker;
