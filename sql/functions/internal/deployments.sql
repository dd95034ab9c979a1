-- Helpers of the registry (migrations 0019, 0020). _check_deployment_policy: ZP008 unless the
-- retry policy and lease of a deployment are within the bounds fail_run and the claims apply
-- (0 <= base <= max <= 30 days, a NULL side counting as 1 / 300; 1 <= lease <= 86400; no NaN).
-- A registered lease is at least a second: it is the lease of every claim of the deployment that
-- names none, by every worker, and a shorter one (1e-9 s rounds to no time at all) lapses before
-- the run can be started, each lapsed claim counting an attempt until the run is dead-lettered.
CREATE OR REPLACE FUNCTION zeroth._check_deployment_policy(
    retry_base_seconds double precision, retry_max_seconds double precision,
    lease_seconds double precision) RETURNS void
    LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF NOT (coalesce(retry_base_seconds, 1) >= 0
            AND coalesce(retry_base_seconds, 1) <= coalesce(retry_max_seconds, 300)
            AND coalesce(retry_max_seconds, 300) <= 86400 * 30) THEN
        RAISE EXCEPTION 'need 0 <= retry_base_seconds <= retry_max_seconds <= 30 days (not set: 1 and 300), got % and %',
            coalesce(retry_base_seconds::text, 'NULL'), coalesce(retry_max_seconds::text, 'NULL')
            USING ERRCODE = 'ZP008';
    END IF;
    IF lease_seconds IS NOT NULL AND NOT (lease_seconds >= 1 AND lease_seconds <= 86400) THEN
        RAISE EXCEPTION 'a deployment''s lease_seconds must be in [1, 86400] (a shorter lease lapses before its run can start), got %',
            lease_seconds::text USING ERRCODE = 'ZP008';
    END IF;
END
$$;
COMMENT ON FUNCTION zeroth._check_deployment_policy(double precision, double precision, double precision) IS 'Internal: ZP008 unless a deployment''s retry policy (0 <= base <= max <= 30 days, NULL counting as 1 / 300) and lease (NULL or 1 <= s <= 86400: a shorter registered lease lapses before its run can start) are within the bounds fail_run and the claims apply.';
ALTER FUNCTION zeroth._check_deployment_policy(double precision, double precision, double precision) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._check_deployment_policy(double precision, double precision, double precision) FROM PUBLIC;

-- _check_timeouts (issue 34 item 2): ZP008 unless an attempt timeout is NULL or 1 s .. 30 days and a
-- run timeout NULL or 1 s .. 365 days (no NaN, no infinity): the bounds of the registry's and the
-- runs' CHECK constraints, for the registry's writers and enqueue_run(s).
CREATE OR REPLACE FUNCTION zeroth._check_timeouts(
    attempt_timeout_seconds double precision, run_timeout_seconds double precision) RETURNS void
    LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF attempt_timeout_seconds IS NOT NULL
       AND NOT (attempt_timeout_seconds >= 1 AND attempt_timeout_seconds <= 86400 * 30) THEN
        RAISE EXCEPTION 'attempt_timeout_seconds must be NULL or in [1, 2592000] (30 days), got %',
            attempt_timeout_seconds::text USING ERRCODE = 'ZP008';
    END IF;
    IF run_timeout_seconds IS NOT NULL
       AND NOT (run_timeout_seconds >= 1 AND run_timeout_seconds <= 86400 * 365) THEN
        RAISE EXCEPTION 'run_timeout_seconds must be NULL or in [1, 31536000] (365 days), got %',
            run_timeout_seconds::text USING ERRCODE = 'ZP008';
    END IF;
END
$$;
COMMENT ON FUNCTION zeroth._check_timeouts(double precision, double precision) IS 'Internal: ZP008 unless an attempt timeout is NULL or in [1 s, 30 days] and a run timeout NULL or in [1 s, 365 days].';
ALTER FUNCTION zeroth._check_timeouts(double precision, double precision) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._check_timeouts(double precision, double precision) FROM PUBLIC;

-- _deployment_values: a registry row's defaults as the audit records them (old_values,
-- new_values of zeroth.deployment_changes); a policy column that is not set (NULL) is absent.
-- (STABLE, as its body is: jsonb_build_object; zeroth._code_version_hash says why.)
CREATE OR REPLACE FUNCTION zeroth._deployment_values(d zeroth.deployments) RETURNS jsonb
    LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('max_attempts', d.max_attempts, 'priority', d.priority,
                              'managed_by', d.managed_by)
           || jsonb_strip_nulls(jsonb_build_object('retry_base_seconds', d.retry_base_seconds,
                                                   'retry_max_seconds', d.retry_max_seconds,
                                                   'lease_seconds', d.lease_seconds,
                                                   'attempt_timeout_seconds', d.attempt_timeout_seconds,
                                                   'run_timeout_seconds', d.run_timeout_seconds))
$$;
COMMENT ON FUNCTION zeroth._deployment_values(zeroth.deployments) IS 'Internal: a zeroth.deployments row''s defaults as a document (the old_values / new_values of zeroth.deployment_changes); retry_base_seconds, retry_max_seconds, lease_seconds, attempt_timeout_seconds, run_timeout_seconds only when set.';
ALTER FUNCTION zeroth._deployment_values(zeroth.deployments) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._deployment_values(zeroth.deployments) FROM PUBLIC;

-- _deployment_result: the deployment_registration of an outcome and a registry row.
CREATE OR REPLACE FUNCTION zeroth._deployment_result(outcome text, d zeroth.deployments,
                                                     previous jsonb)
    RETURNS zeroth.deployment_registration
    LANGUAGE sql IMMUTABLE AS $$
    SELECT ROW(outcome, d.deployment_ref, d.max_attempts, d.priority, d.managed_by, d.version,
               previous, d.retry_base_seconds, d.retry_max_seconds,
               d.lease_seconds, d.attempt_timeout_seconds,
               d.run_timeout_seconds)::zeroth.deployment_registration
$$;
COMMENT ON FUNCTION zeroth._deployment_result(text, zeroth.deployments, jsonb) IS 'Internal: the deployment_registration (register_deployment, set_deployment_defaults) of an outcome, a zeroth.deployments row and the values an update replaced.';
ALTER FUNCTION zeroth._deployment_result(text, zeroth.deployments, jsonb) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._deployment_result(text, zeroth.deployments, jsonb) FROM PUBLIC;

-- _policy_binds_caller: whether a registry row's retry policy and lease apply to the calling
-- session (fail_run, the claims, with the caller's value NULL). A DBA's row (managed_by 'sql', or
-- registered_by NULL: set or handed back by a DBA) binds every caller; an application's
-- registration binds only its own login's sessions (registered_by = session_user). Otherwise one
-- trust domain's worker login that registered a deployment name first (another team's, before that
-- team's application starts: theirs is then 'kept') would set the backoff and lease of the other
-- domain's runs, 30 days of it. session_user: inside a SECURITY DEFINER function current_user is
-- always zeroth_owner.
CREATE OR REPLACE FUNCTION zeroth._policy_binds_caller(managed_by text, registered_by text)
    RETURNS boolean
    LANGUAGE sql STABLE AS $$
    SELECT managed_by = 'sql' OR registered_by IS NULL OR registered_by = session_user
$$;
COMMENT ON FUNCTION zeroth._policy_binds_caller(text, text) IS 'Internal: whether a zeroth.deployments row''s retry policy and lease apply to this session when it passes none: a DBA''s row (managed_by sql, or registered_by NULL) for every session, an application''s registration only for its own login (registered_by = session_user).';
ALTER FUNCTION zeroth._policy_binds_caller(text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._policy_binds_caller(text, text) FROM PUBLIC;

-- _deployment_lease: the lease of a claim of deployment_ref: lease_seconds when given (checked:
-- ZP008 unless 0 < s <= 86400), else the deployment's registered lease (zeroth.deployments: one
-- primary-key lookup) when it binds this session (_policy_binds_caller), else 60 s. Takes no lock.
CREATE OR REPLACE FUNCTION zeroth._deployment_lease(deployment_ref text,
                                                    lease_seconds double precision)
    RETURNS interval
    LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF lease_seconds IS NOT NULL THEN
        RETURN zeroth._lease_interval(lease_seconds);
    END IF;
    RETURN make_interval(secs => coalesce(
        (SELECT d.lease_seconds FROM zeroth.deployments d
          WHERE d.deployment_ref = _deployment_lease.deployment_ref
            AND zeroth._policy_binds_caller(d.managed_by, d.registered_by)), 60));
END
$$;
COMMENT ON FUNCTION zeroth._deployment_lease(text, double precision) IS 'Internal: the lease of a claim: lease_seconds when given (ZP008 unless 0 < s <= 86400), else zeroth.deployments.lease_seconds of the deployment (a primary-key lookup) when the row binds this session (_policy_binds_caller: a DBA''s row, or this login''s registration), else 60 s.';
ALTER FUNCTION zeroth._deployment_lease(text, double precision) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._deployment_lease(text, double precision) FROM PUBLIC;

-- _deployment_claim_policy (issue 34 item 2): the lease of a claim of deployment_ref as
-- _deployment_lease gives it, and, when the lease is NULL, the deployment's attempt and run
-- timeouts (NULL: none) read in the same primary-key probe that reads the registered lease (each
-- only when the row binds this session: _policy_binds_caller), with timeouts_known true. A given
-- lease reads nothing here (as before): timeouts_known false, and the claim reads the timeouts
-- inside a statement it makes anyway (zeroth._claim_in_scope, zeroth._claim_orphaned), so a claim
-- costs no statement more than it did. Takes no lock.
DROP FUNCTION IF EXISTS zeroth._deployment_claim_policy(text, double precision);
CREATE OR REPLACE FUNCTION zeroth._deployment_claim_policy(
    deployment_ref text, lease_seconds double precision,
    OUT lease interval, OUT attempt_timeout_seconds double precision,
    OUT run_timeout_seconds double precision, OUT timeouts_known boolean)
    LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_lease double precision;
BEGIN
    IF _deployment_claim_policy.lease_seconds IS NOT NULL THEN
        lease := zeroth._lease_interval(_deployment_claim_policy.lease_seconds);
        timeouts_known := false;
        RETURN;
    END IF;
    SELECT d.lease_seconds, d.attempt_timeout_seconds, d.run_timeout_seconds
      INTO v_lease, attempt_timeout_seconds, run_timeout_seconds
      FROM zeroth.deployments d
     WHERE d.deployment_ref = _deployment_claim_policy.deployment_ref
       AND zeroth._policy_binds_caller(d.managed_by, d.registered_by);
    lease := make_interval(secs => coalesce(v_lease, 60));
    timeouts_known := true;
END
$$;
COMMENT ON FUNCTION zeroth._deployment_claim_policy(text, double precision) IS 'Internal: a claim''s lease (lease_seconds when given, ZP008 unless 0 < s <= 86400: nothing read, timeouts_known false; else the registered lease, else 60 s) and, read in that same primary-key probe, the deployment''s attempt / run timeouts (NULL: none; timeouts_known true), from a row that binds this session (_policy_binds_caller).';
ALTER FUNCTION zeroth._deployment_claim_policy(text, double precision) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._deployment_claim_policy(text, double precision) FROM PUBLIC;

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
-- Retry policy and lease (migration 0020): a value given replaces the row's; NULL keeps it, unless
-- the column is named in unset (then it becomes NULL, "not set"; register_deployment names all). The merged policy is checked
-- (ZP008: 0 <= base <= max <= 30 days, a NULL side counting as 1 / 300) before anything is written.
-- Timeouts (migration 0021: attempt_timeout_seconds, run_timeout_seconds) likewise: a value
-- replaces, NULL keeps, unset clears; checked by zeroth._check_timeouts.
-- Internal: SECURITY INVOKER, executable by zeroth_owner only. Time: clock_timestamp().
-- The signature of 0019 (before the retry policy and lease of 0020) and the one before
-- migration 0021 (without the timeouts).
DROP FUNCTION IF EXISTS zeroth._change_deployment(text, integer, integer, text, text);
DROP FUNCTION IF EXISTS zeroth._change_deployment(text, integer, integer, double precision, double precision, double precision, text[], text, text);
DROP FUNCTION IF EXISTS zeroth._change_deployment(text, integer, integer, double precision, double precision, double precision, double precision, double precision, text[], text, text);
CREATE OR REPLACE FUNCTION zeroth._change_deployment(
    deployment_ref     text,
    max_attempts       integer,
    priority           integer,
    retry_base_seconds double precision,
    retry_max_seconds  double precision,
    lease_seconds      double precision,
    attempt_timeout_seconds double precision,
    run_timeout_seconds     double precision,
    unset              text[],
    managed_by         text,
    via                text)
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
    v_base   double precision;
    v_max    double precision;
    v_lease  double precision;
    v_atime  double precision;
    v_rtime  double precision;
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
            v_base := _change_deployment.retry_base_seconds;
            v_max := _change_deployment.retry_max_seconds;
            v_lease := _change_deployment.lease_seconds;
            v_atime := _change_deployment.attempt_timeout_seconds;
            v_rtime := _change_deployment.run_timeout_seconds;
            PERFORM zeroth._check_deployment_policy(v_base, v_max, v_lease);
            PERFORM zeroth._check_timeouts(v_atime, v_rtime);
            INSERT INTO zeroth.deployments AS d (deployment_ref, max_attempts, priority, managed_by,
                                                 version, created_at, updated_at, updated_by,
                                                 registered_by, retry_base_seconds,
                                                 retry_max_seconds, lease_seconds,
                                                 attempt_timeout_seconds, run_timeout_seconds)
            VALUES (_change_deployment.deployment_ref, coalesce(_change_deployment.max_attempts, 3),
                    coalesce(_change_deployment.priority, 0), _change_deployment.managed_by,
                    coalesce(v_top, 0) + 1, v_now, v_now, v_who, v_owner, v_base, v_max, v_lease,
                    v_atime, v_rtime)
            ON CONFLICT ON CONSTRAINT deployments_pkey DO NOTHING
            RETURNING d.* INTO v_new;
            IF FOUND THEN
                INSERT INTO zeroth.deployment_changes (deployment_ref, version, changed_at, changed_by,
                                                       acting_role, via, old_values, new_values)
                VALUES (v_new.deployment_ref, v_new.version, v_now, v_who, v_role, _change_deployment.via,
                        NULL, zeroth._deployment_values(v_new));
                RETURN zeroth._deployment_result('created', v_new, NULL);
            END IF;
            v_locked := true;  -- created by another caller meanwhile: look again, locked
            CONTINUE;
        END IF;
        IF v_app AND (v_old.managed_by = 'sql'
                      OR (v_old.registered_by IS NOT NULL AND v_old.registered_by <> v_who)) THEN
            RETURN zeroth._deployment_result('kept', v_old, NULL);
        END IF;
        v_base := CASE WHEN _change_deployment.retry_base_seconds IS NULL
                            AND 'retry_base_seconds' = ANY (_change_deployment.unset) THEN NULL
                       ELSE coalesce(_change_deployment.retry_base_seconds, v_old.retry_base_seconds) END;
        v_max := CASE WHEN _change_deployment.retry_max_seconds IS NULL
                            AND 'retry_max_seconds' = ANY (_change_deployment.unset) THEN NULL
                      ELSE coalesce(_change_deployment.retry_max_seconds, v_old.retry_max_seconds) END;
        v_lease := CASE WHEN _change_deployment.lease_seconds IS NULL
                            AND 'lease_seconds' = ANY (_change_deployment.unset) THEN NULL
                        ELSE coalesce(_change_deployment.lease_seconds, v_old.lease_seconds) END;
        v_atime := CASE WHEN _change_deployment.attempt_timeout_seconds IS NULL
                             AND 'attempt_timeout_seconds' = ANY (_change_deployment.unset) THEN NULL
                        ELSE coalesce(_change_deployment.attempt_timeout_seconds,
                                      v_old.attempt_timeout_seconds) END;
        v_rtime := CASE WHEN _change_deployment.run_timeout_seconds IS NULL
                             AND 'run_timeout_seconds' = ANY (_change_deployment.unset) THEN NULL
                        ELSE coalesce(_change_deployment.run_timeout_seconds,
                                      v_old.run_timeout_seconds) END;
        PERFORM zeroth._check_deployment_policy(v_base, v_max, v_lease);
        PERFORM zeroth._check_timeouts(v_atime, v_rtime);
        IF (v_old.max_attempts, v_old.priority, v_old.managed_by, v_old.registered_by,
            v_old.retry_base_seconds, v_old.retry_max_seconds, v_old.lease_seconds,
            v_old.attempt_timeout_seconds, v_old.run_timeout_seconds)
           IS NOT DISTINCT FROM
           (coalesce(_change_deployment.max_attempts, v_old.max_attempts),
            coalesce(_change_deployment.priority, v_old.priority), _change_deployment.managed_by,
            v_owner, v_base, v_max, v_lease, v_atime, v_rtime) THEN
            RETURN zeroth._deployment_result('unchanged', v_old, NULL);
        END IF;
        EXIT WHEN v_locked;
        v_locked := true;
    END LOOP;
    IF NOT v_locked OR v_old.deployment_ref IS NULL THEN
        RAISE EXCEPTION 'deployment % changed under this call three times; try again',
            _change_deployment.deployment_ref USING ERRCODE = '40001';
    END IF;

    v_was := zeroth._deployment_values(v_old);
    v_top := (SELECT max(c.version) FROM zeroth.deployment_changes c
               WHERE c.deployment_ref = v_old.deployment_ref);
    UPDATE zeroth.deployments AS d
       SET max_attempts = coalesce(_change_deployment.max_attempts, d.max_attempts),
           priority = coalesce(_change_deployment.priority, d.priority),
           managed_by = _change_deployment.managed_by,
           version = greatest(d.version, coalesce(v_top, 0)) + 1,
           updated_at = v_now,
           updated_by = v_who,
           registered_by = v_owner,
           retry_base_seconds = v_base,
           retry_max_seconds = v_max,
           lease_seconds = v_lease,
           attempt_timeout_seconds = v_atime,
           run_timeout_seconds = v_rtime
     WHERE d.deployment_ref = v_old.deployment_ref
    RETURNING d.* INTO v_new;
    INSERT INTO zeroth.deployment_changes (deployment_ref, version, changed_at, changed_by, acting_role,
                                           via, old_values, new_values)
    VALUES (v_new.deployment_ref, v_new.version, v_now, v_who, v_role, _change_deployment.via, v_was,
            zeroth._deployment_values(v_new));
    RETURN zeroth._deployment_result('updated', v_new, v_was);
END
$$;
COMMENT ON FUNCTION zeroth._change_deployment(text, integer, integer, double precision, double precision, double precision, double precision, double precision, text[], text, text) IS 'Internal: creates or changes a zeroth.deployments row and audits the change in zeroth.deployment_changes (register_deployment keeps a row a DBA set or another login registered). A call that changes nothing takes no lock; versions continue after the highest audited one. Retry policy and lease: a value replaces, NULL keeps, unset names the columns set back to NULL; the merged policy is checked (ZP008). Outcome created, updated, unchanged or kept.';
ALTER FUNCTION zeroth._change_deployment(text, integer, integer, double precision, double precision, double precision, double precision, double precision, text[], text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._change_deployment(text, integer, integer, double precision, double precision, double precision, double precision, double precision, text[], text, text) FROM PUBLIC;
