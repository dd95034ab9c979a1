-- The registry of deployments (zeroth.deployments, migration 0019): the one writer behind
-- register_deployment and set_deployment_defaults. Creates the row, or locks it and changes it
-- when the values differ, bumping its version and appending the change to
-- zeroth.deployment_changes (who: session_user and the SET ROLE in force — inside a SECURITY
-- DEFINER function current_user is always zeroth_owner; when: the database clock; old → new).
-- A registration (via 'register_deployment') leaves a row a DBA set (managed_by 'sql') as it is:
-- outcome 'kept'. Two callers at once: the INSERT of one waits for the other's uncommitted key,
-- then both lock the row in turn, so each change is applied and audited once, in commit order.
-- Internal: SECURITY INVOKER, executable by zeroth_owner only. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth._change_deployment(
    deployment_ref text,
    max_attempts   integer,
    priority       integer,
    managed_by     text,
    via            text)
    RETURNS zeroth.deployment_registration
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now  timestamptz := zeroth._now();
    v_who  text := session_user;
    v_role text := nullif(current_setting('role'), 'none');
    v_old  zeroth.deployments;
    v_new  zeroth.deployments;
    v_was  jsonb;
BEGIN
    INSERT INTO zeroth.deployments AS d (deployment_ref, max_attempts, priority, managed_by, version,
                                         created_at, updated_at, updated_by)
    VALUES (_change_deployment.deployment_ref, coalesce(_change_deployment.max_attempts, 3),
            coalesce(_change_deployment.priority, 0), _change_deployment.managed_by, 1, v_now, v_now, v_who)
    ON CONFLICT ON CONSTRAINT deployments_pkey DO NOTHING
    RETURNING d.* INTO v_new;
    IF FOUND THEN
        INSERT INTO zeroth.deployment_changes (deployment_ref, version, changed_at, changed_by, acting_role,
                                               via, old_values, new_values)
        VALUES (v_new.deployment_ref, v_new.version, v_now, v_who, v_role, _change_deployment.via, NULL,
                jsonb_build_object('max_attempts', v_new.max_attempts, 'priority', v_new.priority,
                                   'managed_by', v_new.managed_by));
        RETURN ROW('created', v_new.deployment_ref, v_new.max_attempts, v_new.priority,
                   v_new.managed_by, v_new.version, NULL::jsonb)::zeroth.deployment_registration;
    END IF;

    SELECT d.* INTO v_old
      FROM zeroth.deployments d
     WHERE d.deployment_ref = _change_deployment.deployment_ref
       FOR UPDATE;
    v_was := jsonb_build_object('max_attempts', v_old.max_attempts, 'priority', v_old.priority,
                                'managed_by', v_old.managed_by);
    IF _change_deployment.via = 'register_deployment' AND v_old.managed_by = 'sql' THEN
        RETURN ROW('kept', v_old.deployment_ref, v_old.max_attempts, v_old.priority,
                   v_old.managed_by, v_old.version, NULL::jsonb)::zeroth.deployment_registration;
    END IF;
    IF (v_old.max_attempts, v_old.priority, v_old.managed_by)
       IS NOT DISTINCT FROM
       (coalesce(_change_deployment.max_attempts, v_old.max_attempts),
        coalesce(_change_deployment.priority, v_old.priority), _change_deployment.managed_by) THEN
        RETURN ROW('unchanged', v_old.deployment_ref, v_old.max_attempts, v_old.priority,
                   v_old.managed_by, v_old.version, NULL::jsonb)::zeroth.deployment_registration;
    END IF;
    UPDATE zeroth.deployments AS d
       SET max_attempts = coalesce(_change_deployment.max_attempts, d.max_attempts),
           priority = coalesce(_change_deployment.priority, d.priority),
           managed_by = _change_deployment.managed_by,
           version = d.version + 1,
           updated_at = v_now,
           updated_by = v_who
     WHERE d.deployment_ref = v_old.deployment_ref
    RETURNING d.* INTO v_new;
    INSERT INTO zeroth.deployment_changes (deployment_ref, version, changed_at, changed_by, acting_role,
                                           via, old_values, new_values)
    VALUES (v_new.deployment_ref, v_new.version, v_now, v_who, v_role, _change_deployment.via, v_was,
            jsonb_build_object('max_attempts', v_new.max_attempts, 'priority', v_new.priority,
                               'managed_by', v_new.managed_by));
    RETURN ROW('updated', v_new.deployment_ref, v_new.max_attempts, v_new.priority, v_new.managed_by,
               v_new.version, v_was)::zeroth.deployment_registration;
END
$$;
COMMENT ON FUNCTION zeroth._change_deployment(text, integer, integer, text, text) IS 'Internal: creates or changes a zeroth.deployments row and audits the change in zeroth.deployment_changes (register_deployment keeps a row a DBA set). Outcome created, updated, unchanged or kept.';
ALTER FUNCTION zeroth._change_deployment(text, integer, integer, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._change_deployment(text, integer, integer, text, text) FROM PUBLIC;
