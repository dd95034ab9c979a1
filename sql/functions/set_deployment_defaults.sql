-- set_deployment_defaults: admin. A DBA sets a deployment's defaults (max_attempts, priority;
-- NULL: keep the current value, or 3 / 0 for a new row). managed_by 'sql' (the default) pins the
-- row: applications' registrations keep it from then on; 'app' hands it back to them (the next
-- registration writes its values). Audited in zeroth.deployment_changes (who, when, old → new).
-- Clears registered_by (the next registration, of any login, takes a row handed back). Runs
-- enqueued before keep their values. Locks the deployment's row to change it, waiting at most
-- 2 s. Granted to nobody: run it as a member of zeroth_owner. Raises ZP008, 55P03. Time:
-- clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.set_deployment_defaults(
    deployment_ref text,
    max_attempts   integer DEFAULT NULL,
    priority       integer DEFAULT NULL,
    managed_by     text    DEFAULT 'sql')
    RETURNS zeroth.deployment_registration
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    SET lock_timeout = '2s' AS $$
BEGIN
    PERFORM zeroth._require_identifier(set_deployment_defaults.deployment_ref, 'deployment_ref');
    PERFORM zeroth._require(set_deployment_defaults.max_attempts IS NULL
                            OR set_deployment_defaults.max_attempts BETWEEN 1 AND 1000,
                            'max_attempts must be NULL or between 1 and 1000');
    PERFORM zeroth._require(set_deployment_defaults.managed_by IN ('app', 'sql'),
                            'managed_by must be ''app'' or ''sql''');
    RETURN zeroth._change_deployment(set_deployment_defaults.deployment_ref,
                                     set_deployment_defaults.max_attempts, set_deployment_defaults.priority,
                                     set_deployment_defaults.managed_by, 'set_deployment_defaults');
END
$$;
COMMENT ON FUNCTION zeroth.set_deployment_defaults(text, integer, integer, text) IS
'set_deployment_defaults: admin: a DBA sets a deployment''s defaults (NULL keeps a value; a new row starts at 3 attempts, priority 0). managed_by sql (default) pins them against applications'' registrations; app hands the row back to them. Audited in zeroth.deployment_changes. Runs enqueued before keep their values. Outcome created, updated or unchanged; previous: the values replaced. Waits at most 2 s (lock_timeout) for a change of the row another session holds: 55P03. Raises ZP008 invalid_argument, 55P03 lock_not_available. Time: clock_timestamp().';
ALTER FUNCTION zeroth.set_deployment_defaults(text, integer, integer, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.set_deployment_defaults(text, integer, integer, text) FROM PUBLIC;
