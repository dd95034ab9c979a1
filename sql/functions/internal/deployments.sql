-- The registry of deployments (zeroth.deployments, migration 0019): the one writer behind
-- register_deployment and set_deployment_defaults. Creates the row, or changes it when the values
-- differ, bumping its version and appending the change to zeroth.deployment_changes (who:
-- session_user and the SET ROLE in force — inside a SECURITY DEFINER function current_user is
-- always zeroth_owner; when: the database clock; old → new).
-- A registration (via 'register_deployment') keeps, as they are (outcome 'kept'): a row a DBA set
-- (managed_by 'sql'), and a row another login's application registered (registered_by: one trust
-- domain's worker role does not set the defaults of another's runs). A DBA's change clears
-- registered_by, so the next registration takes the row.
-- Locks: a call that would change nothing ('kept', 'unchanged') reads the row without a lock, so
-- no open transaction of another session holds it up; a change locks the row and checks again.
-- Versions continue after the highest audited one, so a row a DBA deleted (or whose version a DBA
-- edited) is created or changed again without colliding with its audit rows.
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
    v_now    timestamptz := zeroth._now();
    v_who    text := session_user;
    v_role   text := nullif(current_setting('role'), 'none');
    v_app    boolean := _change_deployment.via = 'register_deployment';
    v_owner  text := CASE WHEN _change_deployment.via = 'register_deployment' THEN session_user END;
    v_old    zeroth.deployments;
    v_new    zeroth.deployments;
    v_was    jsonb;
    v_top    bigint;
    v_locked boolean := false;
BEGIN
    -- At most three rounds: unlocked look, locked look (and again if a DBA deletes the row in
    -- between, or another caller creates it first).
    FOR v_round IN 1 .. 3 LOOP
        IF v_locked THEN
            SELECT d.* INTO v_old FROM zeroth.deployments d
             WHERE d.deployment_ref = _change_deployment.deployment_ref FOR UPDATE;
        ELSE
            SELECT d.* INTO v_old FROM zeroth.deployments d
             WHERE d.deployment_ref = _change_deployment.deployment_ref;
        END IF;
        IF NOT FOUND THEN
            v_top := (SELECT max(c.version) FROM zeroth.deployment_changes c
                       WHERE c.deployment_ref = _change_deployment.deployment_ref);
            INSERT INTO zeroth.deployments AS d (deployment_ref, max_attempts, priority, managed_by,
                                                 version, created_at, updated_at, updated_by,
                                                 registered_by)
            VALUES (_change_deployment.deployment_ref, coalesce(_change_deployment.max_attempts, 3),
                    coalesce(_change_deployment.priority, 0), _change_deployment.managed_by,
                    coalesce(v_top, 0) + 1, v_now, v_now, v_who, v_owner)
            ON CONFLICT ON CONSTRAINT deployments_pkey DO NOTHING
            RETURNING d.* INTO v_new;
            IF FOUND THEN
                INSERT INTO zeroth.deployment_changes (deployment_ref, version, changed_at, changed_by,
                                                       acting_role, via, old_values, new_values)
                VALUES (v_new.deployment_ref, v_new.version, v_now, v_who, v_role, _change_deployment.via,
                        NULL, jsonb_build_object('max_attempts', v_new.max_attempts,
                                                 'priority', v_new.priority,
                                                 'managed_by', v_new.managed_by));
                RETURN ROW('created', v_new.deployment_ref, v_new.max_attempts, v_new.priority,
                           v_new.managed_by, v_new.version, NULL::jsonb)::zeroth.deployment_registration;
            END IF;
            v_locked := true;  -- created by another caller meanwhile: look again, locked
            CONTINUE;
        END IF;
        IF v_app AND (v_old.managed_by = 'sql'
                      OR (v_old.registered_by IS NOT NULL AND v_old.registered_by <> v_who)) THEN
            RETURN ROW('kept', v_old.deployment_ref, v_old.max_attempts, v_old.priority,
                       v_old.managed_by, v_old.version, NULL::jsonb)::zeroth.deployment_registration;
        END IF;
        IF (v_old.max_attempts, v_old.priority, v_old.managed_by, v_old.registered_by)
           IS NOT DISTINCT FROM
           (coalesce(_change_deployment.max_attempts, v_old.max_attempts),
            coalesce(_change_deployment.priority, v_old.priority), _change_deployment.managed_by,
            v_owner) THEN
            RETURN ROW('unchanged', v_old.deployment_ref, v_old.max_attempts, v_old.priority,
                       v_old.managed_by, v_old.version, NULL::jsonb)::zeroth.deployment_registration;
        END IF;
        EXIT WHEN v_locked;
        v_locked := true;
    END LOOP;
    IF NOT v_locked OR v_old.deployment_ref IS NULL THEN
        RAISE EXCEPTION 'deployment % changed under this call three times; try again',
            _change_deployment.deployment_ref USING ERRCODE = '40001';
    END IF;

    v_was := jsonb_build_object('max_attempts', v_old.max_attempts, 'priority', v_old.priority,
                                'managed_by', v_old.managed_by);
    v_top := (SELECT max(c.version) FROM zeroth.deployment_changes c
               WHERE c.deployment_ref = v_old.deployment_ref);
    UPDATE zeroth.deployments AS d
       SET max_attempts = coalesce(_change_deployment.max_attempts, d.max_attempts),
           priority = coalesce(_change_deployment.priority, d.priority),
           managed_by = _change_deployment.managed_by,
           version = greatest(d.version, coalesce(v_top, 0)) + 1,
           updated_at = v_now,
           updated_by = v_who,
           registered_by = v_owner
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
COMMENT ON FUNCTION zeroth._change_deployment(text, integer, integer, text, text) IS 'Internal: creates or changes a zeroth.deployments row and audits the change in zeroth.deployment_changes (register_deployment keeps a row a DBA set or another login registered). A call that changes nothing takes no lock; versions continue after the highest audited one. Outcome created, updated, unchanged or kept.';
ALTER FUNCTION zeroth._change_deployment(text, integer, integer, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._change_deployment(text, integer, integer, text, text) FROM PUBLIC;
