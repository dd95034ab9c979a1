-- set_version_policy: admin (issue 34, item 3). A DBA sets which code versions may resume a
-- started run of a registered deployment (zeroth.deployments.version_policy): 'any' (the
-- default: every version), 'same' (only the version that started it, runs.code_version_id) or
-- 'compatible' (the same version, or two versions both in compatible_versions: 1 to 100 code
-- versions). A run never started, or started unversioned, stays claimable by every version. The
-- next claim of every worker applies it; runs keep the version they recorded. A change is audited
-- in zeroth.code_version_changes (action set_policy). Locks the deployment's row, waiting at most
-- 2 s. Granted to nobody: run it as a member of zeroth_owner. Raises ZP008 (an unregistered
-- deployment too: register it first), 55P03. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.set_version_policy(
    deployment_ref      text,
    version_policy      text,
    compatible_versions text[] DEFAULT NULL)
    RETURNS TABLE (outcome text, policy text, versions text[])
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    SET lock_timeout = '2s' AS $$
DECLARE
    v_now  timestamptz := zeroth._now();
    v_old  zeroth.deployments;
    v_set  text[];
BEGIN
    PERFORM zeroth._require_identifier(set_version_policy.deployment_ref, 'deployment_ref');
    PERFORM zeroth._require(set_version_policy.version_policy IN ('any', 'same', 'compatible'),
                            'version_policy must be any, same or compatible');
    IF set_version_policy.version_policy = 'compatible' THEN
        PERFORM zeroth._require(cardinality(set_version_policy.compatible_versions) BETWEEN 1 AND 100
                                AND array_ndims(set_version_policy.compatible_versions) = 1
                                AND array_position(set_version_policy.compatible_versions, NULL) IS NULL,
                                'version_policy compatible needs compatible_versions: 1 to 100 code versions, none NULL');
        FOR i IN 1 .. cardinality(set_version_policy.compatible_versions) LOOP
            PERFORM zeroth._check_code_version(set_version_policy.compatible_versions[i],
                                               'each of compatible_versions');
        END LOOP;
        v_set := ARRAY(SELECT DISTINCT v FROM unnest(set_version_policy.compatible_versions) AS v ORDER BY v);
    ELSE
        PERFORM zeroth._require(set_version_policy.compatible_versions IS NULL,
                                'compatible_versions is only for version_policy compatible');
    END IF;

    SELECT d.* INTO v_old FROM zeroth.deployments d
     WHERE d.deployment_ref = set_version_policy.deployment_ref FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'deployment % is not registered: register it first (register_deployment or set_deployment_defaults)',
            set_version_policy.deployment_ref USING ERRCODE = 'ZP008';
    END IF;
    IF (v_old.version_policy, v_old.compatible_versions)
       IS NOT DISTINCT FROM (set_version_policy.version_policy, v_set) THEN
        RETURN QUERY SELECT 'unchanged'::text, v_old.version_policy, v_old.compatible_versions;
        RETURN;
    END IF;
    UPDATE zeroth.deployments AS d
       SET version_policy = set_version_policy.version_policy, compatible_versions = v_set
     WHERE d.deployment_ref = v_old.deployment_ref;
    INSERT INTO zeroth.code_version_changes (deployment_ref, changed_at, changed_by, acting_role, action,
                                             version_policy, compatible_versions)
    VALUES (v_old.deployment_ref, v_now, session_user, nullif(current_setting('role'), 'none'),
            'set_policy', set_version_policy.version_policy, v_set);
    RETURN QUERY SELECT 'updated'::text, set_version_policy.version_policy, v_set;
END
$$;
COMMENT ON FUNCTION zeroth.set_version_policy(text, text, text[]) IS
'set_version_policy: admin. Which code versions may resume a started run of a registered deployment (zeroth.deployments.version_policy): any (the default: every version), same (only the version that started it: runs.code_version_id), compatible (the same version, or two versions both in compatible_versions, 1 to 100 code versions). A run never started, or started by an unversioned worker, stays claimable by every version. Applies from the next claim of every worker. A change is audited in zeroth.code_version_changes (set_policy). Outcome updated or unchanged. Granted to nobody (a DBA''s setting: it binds every session). Locks the deployment row (lock_timeout 2 s). Raises ZP008 (also: the deployment is not registered), 55P03. Time: clock_timestamp().';
ALTER FUNCTION zeroth.set_version_policy(text, text, text[]) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.set_version_policy(text, text, text[]) FROM PUBLIC;
