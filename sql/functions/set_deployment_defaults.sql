-- The signature before migration 0020 (without the retry policy and lease).
DROP FUNCTION IF EXISTS zeroth.set_deployment_defaults(text, integer, integer, text);

-- set_deployment_defaults: admin. A DBA sets a deployment's defaults (max_attempts, priority,
-- retry_base_seconds, retry_max_seconds, lease_seconds, and since migration 0021
-- attempt_timeout_seconds, run_timeout_seconds (the deadlines the next claims fix); NULL: keep the current value, or 3 / 0 /
-- not set for a new row; unset names the policy columns to set back to not set). managed_by 'sql'
-- (the default) pins the row: applications' registrations keep it from then on; 'app' hands it
-- back to them (the next registration writes its values). Audited in zeroth.deployment_changes
-- (who, when, old → new). Clears registered_by (the next registration, of any login, takes a row
-- handed back). Runs enqueued before keep their attempts and priority; a retry policy applies to
-- the next failure, a lease to the next claim. Locks the deployment's row to change it, waiting at
-- most 2 s. Granted to nobody: run it as a member of zeroth_owner. Raises ZP008, 55P03. Time:
-- clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.set_deployment_defaults(
    deployment_ref     text,
    max_attempts       integer          DEFAULT NULL,
    priority           integer          DEFAULT NULL,
    managed_by         text             DEFAULT 'sql',
    retry_base_seconds double precision DEFAULT NULL,
    retry_max_seconds  double precision DEFAULT NULL,
    lease_seconds      double precision DEFAULT NULL,
    unset              text[]           DEFAULT NULL,
    attempt_timeout_seconds double precision DEFAULT NULL,
    run_timeout_seconds     double precision DEFAULT NULL)
    RETURNS zeroth.deployment_registration
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    SET lock_timeout = '2s' AS $$
BEGIN
    set_deployment_defaults.unset := coalesce(set_deployment_defaults.unset, '{}');
    PERFORM zeroth._require_identifier(set_deployment_defaults.deployment_ref, 'deployment_ref');
    PERFORM zeroth._require(set_deployment_defaults.max_attempts IS NULL
                            OR set_deployment_defaults.max_attempts BETWEEN 1 AND 1000,
                            'max_attempts must be NULL or between 1 and 1000');
    PERFORM zeroth._require(set_deployment_defaults.managed_by IN ('app', 'sql'),
                            'managed_by must be ''app'' or ''sql''');
    PERFORM zeroth._require(
        cardinality(set_deployment_defaults.unset) <= 5
        AND set_deployment_defaults.unset
            <@ ARRAY['retry_base_seconds', 'retry_max_seconds', 'lease_seconds',
                     'attempt_timeout_seconds', 'run_timeout_seconds'],
        'unset may name only retry_base_seconds, retry_max_seconds, lease_seconds, '
        'attempt_timeout_seconds and run_timeout_seconds');
    PERFORM zeroth._require(
        NOT (set_deployment_defaults.retry_base_seconds IS NOT NULL
             AND 'retry_base_seconds' = ANY (set_deployment_defaults.unset))
        AND NOT (set_deployment_defaults.retry_max_seconds IS NOT NULL
                 AND 'retry_max_seconds' = ANY (set_deployment_defaults.unset))
        AND NOT (set_deployment_defaults.lease_seconds IS NOT NULL
                 AND 'lease_seconds' = ANY (set_deployment_defaults.unset))
        AND NOT (set_deployment_defaults.attempt_timeout_seconds IS NOT NULL
                 AND 'attempt_timeout_seconds' = ANY (set_deployment_defaults.unset))
        AND NOT (set_deployment_defaults.run_timeout_seconds IS NOT NULL
                 AND 'run_timeout_seconds' = ANY (set_deployment_defaults.unset)),
        'a column is both set and named in unset');
    -- The policy is checked merged with the row's values, in _change_deployment (ZP008).
    RETURN zeroth._change_deployment(
        set_deployment_defaults.deployment_ref, set_deployment_defaults.max_attempts,
        set_deployment_defaults.priority, set_deployment_defaults.retry_base_seconds,
        set_deployment_defaults.retry_max_seconds, set_deployment_defaults.lease_seconds,
        set_deployment_defaults.attempt_timeout_seconds, set_deployment_defaults.run_timeout_seconds,
        set_deployment_defaults.unset, set_deployment_defaults.managed_by,
        'set_deployment_defaults');
END
$$;
COMMENT ON FUNCTION zeroth.set_deployment_defaults(text, integer, integer, text, double precision, double precision, double precision, text[], double precision, double precision) IS
'set_deployment_defaults: admin: a DBA sets a deployment''s defaults: max_attempts, priority, retry_base_seconds / retry_max_seconds (fail_run''s backoff when its caller passes none), lease_seconds (a claim''s lease when its caller passes none), attempt_timeout_seconds / run_timeout_seconds (the bound on an attempt''s wall time and on a run''s total time from its first claim, for runs that carry none; the next claims fix the deadlines). NULL keeps a value (a new row starts at 3 attempts, priority 0, the rest not set); unset names the policy columns to set back to not set (fail_run''s 1 / 300, a claim''s 60 s). Bounds: 0 <= base <= max <= 30 days (not set counting as 1 / 300), 1 <= lease <= 86400, 1 <= attempt timeout <= 30 days, 1 <= run timeout <= 365 days. managed_by sql (default) pins them against applications'' registrations; app hands the row back to them. Audited in zeroth.deployment_changes. Runs enqueued before keep their attempts and priority; a retry policy applies from the next failure, a lease from the next claim. Outcome created, updated or unchanged; previous: the values replaced. Waits at most 2 s (lock_timeout) for a change of the row another session holds: 55P03. Raises ZP008 invalid_argument, 55P03 lock_not_available. Time: clock_timestamp().';
ALTER FUNCTION zeroth.set_deployment_defaults(text, integer, integer, text, double precision, double precision, double precision, text[], double precision, double precision) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.set_deployment_defaults(text, integer, integer, text, double precision, double precision, double precision, text[], double precision, double precision) FROM PUBLIC;
