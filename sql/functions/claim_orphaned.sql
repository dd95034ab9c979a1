-- The body of claim_orphaned (isolated: a run whose end or re-lease raises is rolled back alone
-- and dead-lettered) and of claim_orphaned_scopes' passes (its first pass not isolated, inside
-- one subtransaction of its own: no subtransaction per scope or run unless something raised, so
-- a sweep of many scopes does not overflow the 64 subtransaction ids a snapshot caches).
-- code versions (issue 34, item 3): code_version added last (the signature before it dropped).
DROP FUNCTION IF EXISTS zeroth._claim_orphaned(text, text, text, text, integer, integer, double precision, double precision, boolean);
CREATE OR REPLACE FUNCTION zeroth._claim_orphaned(
    deployment_ref  text,
    worker_id       text,
    tenant_id       text,
    workspace_id    text,
    max_concurrency integer,
    claim_limit     integer,
    lease_seconds   double precision,
    grace_seconds   double precision,
    isolated        boolean,
    code_version    text DEFAULT NULL)
    RETURNS SETOF zeroth.claimed_run
    LANGUAGE plpgsql VOLATILE
    SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_now    timestamptz := zeroth._now();
    -- The lease and, with the lease NULL, the deployment's timeouts in the probe that reads it
    -- (issue 34 item 2; a given lease reads nothing here: step 2's locking statement reads them).
    v_policy record := zeroth._deployment_claim_policy(_claim_orphaned.deployment_ref, _claim_orphaned.lease_seconds);
    v_lease  interval := v_policy.lease;
    v_grace  interval := zeroth._grace_interval(_claim_orphaned.grace_seconds);
    v_tenant text := zeroth._scope_tenant(_claim_orphaned.tenant_id, _claim_orphaned.workspace_id);
    v_wskey  text := zeroth._workspace_key(_claim_orphaned.workspace_id);
    v_want   integer := _claim_orphaned.claim_limit;
    v_slots  integer[];
    v_active integer := 0;
    v_ids    uuid[];
    v_ends      uuid[];
    v_resumable boolean[];
    v_i         integer;
    v_rows      zeroth.claimed_run[];
    v_state     text;
    v_msg       text;
    v_tids      tid[];
    v_limit  integer;
    v_paused boolean;
    v_rate   text;
    v_taken  record;
    v_late   boolean[];
    v_timeouts double precision[];
    v_serves bigint[];  -- code versions (issue 34): the run versions this worker may resume
BEGIN
    PERFORM zeroth._require_identifier(_claim_orphaned.deployment_ref, 'deployment_ref');
    PERFORM zeroth._require_identifier(_claim_orphaned.worker_id, 'worker_id');
    PERFORM zeroth._check_code_version(_claim_orphaned.code_version);
    v_serves := zeroth._version_serves(_claim_orphaned.deployment_ref, _claim_orphaned.code_version);
    PERFORM zeroth._require(_claim_orphaned.claim_limit IS NULL OR _claim_orphaned.claim_limit BETWEEN 0 AND 1000,
                            'claim_limit must be NULL or between 0 and 1000');
    PERFORM zeroth._require(_claim_orphaned.max_concurrency IS NULL OR _claim_orphaned.max_concurrency >= 1,
                            'max_concurrency must be NULL or at least 1');
    IF _claim_orphaned.max_concurrency IS NOT NULL AND v_tenant IS NULL THEN
        RAISE EXCEPTION 'distributed concurrency needs an exact scope: a workspace_id needs a tenant_id'
            USING ERRCODE = 'ZP006';
    END IF;
    SELECT l.max_concurrency, l.paused, l.rate_limit INTO v_limit, v_paused, v_rate
      FROM zeroth._scope_limit(v_tenant, v_wskey, _claim_orphaned.deployment_ref,
                               _claim_orphaned.max_concurrency) AS l;

    -- 1. The orphans nobody may resume end here (each SKIP LOCKED inside _take_over). Isolated:
    --    all in one subtransaction; if one of them raises, that is rolled
    --    back and the batch is done again one run per subtransaction, so the run that raises is
    --    ended alone (zeroth._end_unrecoverable: dead-lettered, stop_reason recovery_failed) and
    --    the others are recovered. The common case pays one subtransaction, none without such
    --    orphans. Not isolated (claim_orphaned_scopes' first pass, itself in one subtransaction):
    --    no subtransaction at all, an error goes up.
    --    First among them (issue 34 item 2), in the same statement: the runs past a deadline,
    --    whatever else is true of them (late): a lease that lapsed at its attempt deadline (timed
    --    out: retried or dead-lettered by the retry policy) or a run past its run deadline
    --    (failed for good), each ended by zeroth._end_timed_out (SKIP LOCKED, re-checked, settled
    --    through zeroth._settle). A run with no deadline is never late (NULL is not true).
    SELECT coalesce(array_agg(o.run_id ORDER BY o.late DESC, o.lease_expires_at), '{}'),
           coalesce(array_agg(o.resumable ORDER BY o.late DESC, o.lease_expires_at), '{}'),
           coalesce(array_agg(o.late ORDER BY o.late DESC, o.lease_expires_at), '{}')
      INTO v_ends, v_resumable, v_late
      FROM (SELECT r.run_id, r.resumable, r.lease_expires_at,
                   coalesce(r.lease_expires_at >= r.attempt_deadline_at
                            OR r.run_deadline_at <= v_now, false) AS late
              FROM zeroth.runs r
             WHERE r.tenant_id = v_tenant
               AND r.workspace_key = v_wskey
               AND r.deployment_ref = _claim_orphaned.deployment_ref
               AND r.status = 'running'
               AND ((r.resumable AND r.attempts >= r.max_attempts AND r.lease_expires_at < v_now)
                    OR (NOT r.resumable AND r.lease_expires_at + v_grace < v_now)
                    OR (r.lease_expires_at < v_now
                        AND (r.lease_expires_at >= r.attempt_deadline_at
                             OR r.run_deadline_at <= v_now)))
             ORDER BY 4 DESC, r.lease_expires_at
             LIMIT coalesce(nullif(_claim_orphaned.claim_limit, 0), 100)) AS o;
    -- The late ones first (they lead the arrays), each in its own call (a run it skips is the
    -- next pass's); the others after them. Isolated, a late run whose end raises is rolled back
    -- alone and dead-lettered (zeroth._end_unrecoverable), as every other end of this sweep.
    FOR v_i IN 1 .. cardinality(v_late) LOOP
        EXIT WHEN NOT v_late[v_i];
        IF NOT _claim_orphaned.isolated THEN
            PERFORM zeroth._end_timed_out(v_tenant, v_wskey, v_ends[v_i], v_now);
            CONTINUE;
        END IF;
        BEGIN
            PERFORM zeroth._end_timed_out(v_tenant, v_wskey, v_ends[v_i], v_now);
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_msg = MESSAGE_TEXT;
            IF zeroth._lock_timed_out(v_state) THEN
                RAISE WARNING 'zeroth: the timeout of run % waited too long for a lock (%); it is left as it was and tried again on the next pass',
                    v_ends[v_i], left(v_msg, 500);
                CONTINUE;
            ELSIF zeroth._transient_sqlstate(v_state) THEN
                RAISE;
            END IF;
            PERFORM zeroth._end_unrecoverable(v_tenant, v_wskey, v_ends[v_i], v_now, v_state, v_msg);
        END;
    END LOOP;
    v_ends := ARRAY(SELECT e.id FROM unnest(v_ends, v_late) AS e(id, late) WHERE NOT e.late);
    v_resumable := v_resumable[cardinality(v_late) - cardinality(v_ends) + 1 :];
    IF cardinality(v_ends) > 0 AND NOT _claim_orphaned.isolated THEN
        FOR v_i IN 1 .. cardinality(v_ends) LOOP
            PERFORM zeroth._take_over(v_tenant, v_wskey, v_ends[v_i],
                                      CASE WHEN v_resumable[v_i] THEN interval '0' ELSE v_grace END,
                                      v_now, 'orphan_recovered', NULL);
        END LOOP;
    ELSIF cardinality(v_ends) > 0 THEN
        BEGIN
            FOR v_i IN 1 .. cardinality(v_ends) LOOP
                PERFORM zeroth._take_over(v_tenant, v_wskey, v_ends[v_i],
                                          CASE WHEN v_resumable[v_i] THEN interval '0' ELSE v_grace END,
                                          v_now, 'orphan_recovered', NULL);
            END LOOP;
        EXCEPTION WHEN OTHERS THEN
            IF zeroth._transient_sqlstate(SQLSTATE) AND NOT zeroth._lock_timed_out(SQLSTATE) THEN
                RAISE;
            END IF;
            FOR v_i IN 1 .. cardinality(v_ends) LOOP
                PERFORM zeroth._take_over_isolated(v_tenant, v_wskey, v_ends[v_i],
                                                   CASE WHEN v_resumable[v_i] THEN interval '0' ELSE v_grace END,
                                                   v_now, 'orphan_recovered', NULL);
            END LOOP;
        END;
    END IF;

    IF _claim_orphaned.claim_limit = 0 THEN  -- step 1 only: report whether one is waiting
        RETURN NEXT zeroth._claim_marker(0, EXISTS (
            SELECT 1 FROM zeroth.runs r
             WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey
               AND r.deployment_ref = _claim_orphaned.deployment_ref
               AND r.status = 'running' AND r.lease_expires_at < v_now AND r.resumable
               AND r.attempts < r.max_attempts
               -- only an orphan this worker's version may resume is work held back
               AND (v_serves IS NULL OR r.code_version_id IS NULL OR r.code_version_id = ANY (v_serves))),
            v_limit);
        RETURN;
    END IF;
    IF v_paused THEN  -- a paused scope (zeroth.scope_limits): nothing is re-leased
        RETURN NEXT zeroth._claim_marker(0, false, v_limit);
        RETURN;
    END IF;

    -- 2. Re-lease the resumable ones: each re-lease starts an attempt, so it takes a start from
    --    the scope's rate limit (held back: report when a start becomes possible, if an orphan
    --    is waiting).
    IF v_rate IS NOT NULL THEN
        SELECT t.granted, t.retry_at, t.decided_at INTO v_taken
          FROM zeroth._take_rate(v_rate, least(coalesce(v_want, 1000), 1000), v_now) AS t;
        v_now := v_taken.decided_at;  -- the re-leases happen when the key was held
        IF v_taken.granted = 0 THEN
            IF EXISTS (SELECT 1 FROM zeroth.runs r
                        WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey
                          AND r.deployment_ref = _claim_orphaned.deployment_ref
                          AND r.status = 'running' AND r.lease_expires_at < v_now AND r.resumable
                          AND r.attempts < r.max_attempts
                          AND (v_serves IS NULL OR r.code_version_id IS NULL
                               OR r.code_version_id = ANY (v_serves))) THEN
                RETURN NEXT zeroth._rate_marker(v_limit, v_taken.retry_at, v_now);
            ELSE
                RETURN NEXT zeroth._claim_marker(0, false, v_limit);
            END IF;
            RETURN;
        END IF;
        v_want := v_taken.granted;
    END IF;
    IF v_limit IS NOT NULL THEN
        SELECT t.slots, t.active_count INTO v_slots, v_active
          FROM zeroth._take_slots(v_tenant, v_wskey, _claim_orphaned.deployment_ref, v_limit,
                                  least(coalesce(v_want, v_limit), v_limit),
                                  v_now) AS t;
        IF cardinality(v_slots) = 0 THEN
            -- Report saturation only when work is really blocked: is any orphan waiting?
            RETURN NEXT zeroth._claim_marker(v_active, EXISTS (
                SELECT 1 FROM zeroth.runs r
                 WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey
                   AND r.deployment_ref = _claim_orphaned.deployment_ref
                   AND r.status = 'running' AND r.lease_expires_at < v_now AND r.resumable
                   AND r.attempts < r.max_attempts
                   AND (v_serves IS NULL OR r.code_version_id IS NULL
                        OR r.code_version_id = ANY (v_serves))),
                v_limit);
            RETURN;
        END IF;
        v_want := cardinality(v_slots);
    END IF;

    -- Lock first (SKIP LOCKED: never wait on another claimer), then lease what was locked.
    WITH locked AS MATERIALIZED (
        SELECT r.run_id, r.ctid, r.lease_expires_at, r.started_at
          FROM zeroth.runs r
         WHERE r.tenant_id = v_tenant
           AND r.workspace_key = v_wskey
           AND r.deployment_ref = _claim_orphaned.deployment_ref
           AND r.status = 'running'
           AND r.lease_expires_at < v_now
           AND r.resumable
           AND r.attempts < r.max_attempts
           -- never re-lease a run past a deadline (step 1 ends it; issue 34 item 2)
           AND NOT coalesce(r.lease_expires_at >= r.attempt_deadline_at OR r.run_deadline_at <= v_now, false)
           -- code versions (issue 34, item 3): only orphans this worker's version may resume
           -- (step 1 above ends the others' hopeless orphans whatever their version: an end
           -- replays no code).
           AND (v_serves IS NULL OR r.code_version_id IS NULL OR r.code_version_id = ANY (v_serves))
         ORDER BY r.lease_expires_at, r.started_at
         LIMIT v_want
           FOR UPDATE SKIP LOCKED
    )
    SELECT coalesce(array_agg(l.run_id ORDER BY l.lease_expires_at, l.started_at), '{}'),
           coalesce(array_agg(l.ctid ORDER BY l.lease_expires_at, l.started_at), '{}'),
           -- The deployment's timeouts when not read with the lease: an InitPlan of this
           -- statement (one primary-key probe), not a statement of its own.
           CASE WHEN NOT v_policy.timeouts_known
                THEN (SELECT ARRAY[d.attempt_timeout_seconds, d.run_timeout_seconds]
                        FROM zeroth.deployments d
                       WHERE d.deployment_ref = _claim_orphaned.deployment_ref
                         AND zeroth._policy_binds_caller(d.managed_by, d.registered_by))
                ELSE ARRAY[v_policy.attempt_timeout_seconds, v_policy.run_timeout_seconds] END
      INTO v_ids, v_tids, v_timeouts FROM locked l;
    IF v_rate IS NOT NULL THEN
        PERFORM zeroth._log_rate(v_rate, cardinality(v_ids), v_now);  -- orphans: the sweep's
        -- next pass (not a retry_at on the rows) takes what the limit held back
    END IF;
    -- The re-lease, one statement for the batch. Isolated: if it raises, again one run at a time,
    -- each in its own subtransaction: a run that cannot be re-leased is ended alone
    -- (zeroth._end_unrecoverable) and the others are re-leased.
    IF cardinality(v_ids) = 0 OR NOT _claim_orphaned.isolated THEN
        RETURN QUERY SELECT * FROM zeroth._lease_locked_runs(
            v_tenant, v_wskey, v_ids, v_tids, v_slots, _claim_orphaned.worker_id, v_now, v_lease, v_active,
            v_limit, false, v_timeouts[1], v_timeouts[2]);
        RETURN;
    END IF;
    BEGIN
        v_rows := ARRAY(SELECT c FROM zeroth._lease_locked_runs(
            v_tenant, v_wskey, v_ids, v_tids, v_slots, _claim_orphaned.worker_id, v_now, v_lease, v_active,
            v_limit, false, v_timeouts[1], v_timeouts[2]) AS c);
    EXCEPTION WHEN OTHERS THEN
        IF zeroth._transient_sqlstate(SQLSTATE) AND NOT zeroth._lock_timed_out(SQLSTATE) THEN
            RAISE;
        END IF;
        v_rows := '{}';
        FOR v_i IN 1 .. cardinality(v_ids) LOOP
            BEGIN
                v_rows := v_rows || ARRAY(SELECT c FROM zeroth._lease_locked_runs(
                    v_tenant, v_wskey, ARRAY[v_ids[v_i]], v_tids[v_i:v_i], v_slots[v_i:v_i], _claim_orphaned.worker_id,
                    v_now, v_lease, v_active, v_limit, false, v_timeouts[1],
                    v_timeouts[2]) AS c WHERE c.run_id IS NOT NULL);
            EXCEPTION WHEN OTHERS THEN
                GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_msg = MESSAGE_TEXT;
                IF zeroth._lock_timed_out(v_state) THEN
                    RAISE WARNING 'zeroth: the re-lease of run % waited too long for a lock (%); it is left as it was and tried again on the next pass',
                        v_ids[v_i], left(v_msg, 500);
                    CONTINUE;
                ELSIF zeroth._transient_sqlstate(v_state) THEN
                    RAISE;
                END IF;
                PERFORM zeroth._end_unrecoverable(v_tenant, v_wskey, v_ids[v_i], v_now, v_state, v_msg);
            END;
        END LOOP;
        IF cardinality(v_rows) = 0 THEN
            v_rows := ARRAY[zeroth._claim_marker(v_active, false, v_limit)];
        END IF;
    END;
    RETURN QUERY SELECT * FROM unnest(v_rows);
END
$$;
COMMENT ON FUNCTION zeroth._claim_orphaned(text, text, text, text, integer, integer, double precision, double precision, boolean, text) IS 'Internal: the body of claim_orphaned; isolated: a run whose end or re-lease raises is rolled back alone and dead-lettered (subtransactions only then), else an error goes up (claim_orphaned_scopes'' first pass).';
ALTER FUNCTION zeroth._claim_orphaned(text, text, text, text, integer, integer, double precision, double precision, boolean, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._claim_orphaned(text, text, text, text, integer, integer, double precision, double precision, boolean, text) FROM PUBLIC;

-- claim_orphaned: recover running runs whose lease expired (crashed or stalled owners).
--   0. First (in step 1's statement) it ends the runs past a deadline (issue 34 item 2): a lease that lapsed at its
--      attempt deadline → timed out (pending with backoff, or dead-lettered with no attempt left;
--      stop_reason attempt_timeout), a run past its run deadline → failed (stop_reason
--      run_timeout), through zeroth._settle as of the lapse (zeroth._end_timed_out).
--   1. First it ends, at most claim_limit (or 100) of them, the orphans nobody may resume, as
--      claim_for_takeover would: a resumable run out of attempts is dead-lettered (stop_reason
--      attempts_exhausted), a non-resumable run whose lease expired more than grace_seconds ago
--      fails (stop_reason orphan_recovered), a run with a requested cancel is cancelled. Their
--      threads move on. This needs no slot, so it happens under saturation too.
--   2. Then it re-leases resumable orphans with attempts left: a new generation, an attempt
--      counted, recovery_checkpoint_id = the latest checkpoint. claim_limit bounds the batch (NULL
--      = all, or the free slots under max_concurrency). With no free slot it probes for one
--      orphan: saturated = an orphan is waiting; (run_id NULL, not saturated) is a definitive
--      empty scan.
--   The scope's row in zeroth.scope_limits applies: its max_concurrency replaces the argument;
--   paused re-leases nothing (step 1 still runs: it leases nothing); its rate_limit key caps the
--   re-leases (each starts an attempt): held back, the run_id-NULL row carries retry_at.
--   claim_limit 0 does step 1 only (at most 100) and re-leases nothing: a worker with no free
--   slot still ends the orphans that block their threads. Its one run_id-NULL row says whether
--   a resumable orphan is waiting.
--   A run whose end or re-lease raises is rolled back alone and dead-lettered (stop_reason
--   recovery_failed): one bad run never stops the recovery of the others.
-- Locks: rate key row, slot rows, run rows, SKIP LOCKED. Raises ZP006, ZP008. Notifies zeroth_wakeup for
-- runs it ended (slots freed, threads promoted). Time: clock_timestamp().
-- lease_seconds NULL (default): the deployment's registered lease (zeroth.deployments; a DBA's, or
-- this login's own registration: zeroth._policy_binds_caller), else 60 s.
-- code_version (issue 34, item 3): the calling worker's code version (NULL: unversioned): step 2
-- re-leases only the orphans the deployment's version_policy lets this version resume
-- (zeroth._version_serves; any, the default, every one); step 1 ends hopeless ones of any version.
CREATE OR REPLACE FUNCTION zeroth.claim_orphaned(
    deployment_ref  text,
    worker_id       text,
    tenant_id       text             DEFAULT NULL,
    workspace_id    text             DEFAULT NULL,
    max_concurrency integer          DEFAULT NULL,
    claim_limit     integer          DEFAULT NULL,
    lease_seconds   double precision DEFAULT NULL,
    grace_seconds   double precision DEFAULT 10,
    code_version    text             DEFAULT NULL)
    RETURNS SETOF zeroth.claimed_run
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    SET lock_timeout = '2s'
    SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN QUERY SELECT * FROM zeroth._claim_orphaned(
        claim_orphaned.deployment_ref, claim_orphaned.worker_id, claim_orphaned.tenant_id,
        claim_orphaned.workspace_id, claim_orphaned.max_concurrency, claim_orphaned.claim_limit,
        claim_orphaned.lease_seconds, claim_orphaned.grace_seconds, true,
        claim_orphaned.code_version);
END
$$;
COMMENT ON FUNCTION zeroth.claim_orphaned(text, text, text, text, integer, integer, double precision, double precision, text) IS
'claim_orphaned: recover running runs whose lease expired. First ends the runs past a deadline (a lease that lapsed at its attempt deadline: timed out, retried with backoff or dead-lettered by the retry policy, stop_reason attempt_timeout; past the run deadline: failed, stop_reason run_timeout; both as of the lapse, through the settle path), then the ones nobody may resume (resumable but out of attempts → failed + dead-lettered, stop_reason attempts_exhausted; not resumable and expired more than grace_seconds ago → failed, stop_reason orphan_recovered; cancel requested → cancelled), then re-leases resumable ones with attempts left: new generation, attempt counted, recovery_checkpoint_id = latest checkpoint. claim_limit bounds the batch (0: end only, re-lease nothing). The scope''s zeroth.scope_limits row applies: its max_concurrency replaces the argument; paused re-leases nothing; its rate_limit key caps the re-leases (rolling window). A run whose end or re-lease raises is rolled back alone and dead-lettered (stop_reason recovery_failed), so one bad run never stops the others'' recovery. Runs under lock_timeout 2 s: a run whose recovery waits longer for a lock (a row someone holds in an open transaction) is left as it was, with a WARNING, for the next pass, and the others are recovered. A single run_id-NULL row reports saturation (an orphan is waiting but no slot is free), a rate limit holding it back (retry_at: when a start becomes possible) or a definitive empty scan. SKIP LOCKED throughout. lease_seconds NULL (the default): the deployment''s registered lease (zeroth.deployments.lease_seconds: a DBA''s, or this login''s own registration), else 60 s. code_version (issue 34): the calling worker''s code version (NULL: unversioned; ZP008 unless 1 to 128 characters, a letter or digit then letters, digits and . _ - + : /): the re-lease takes only the orphans the deployment''s version_policy lets this version resume (any, the default: every one); the ends of step 1 apply to every version. Raises ZP006, ZP008. Notifies zeroth_wakeup for the runs it ended. Time: clock_timestamp().';
ALTER FUNCTION zeroth.claim_orphaned(text, text, text, text, integer, integer, double precision, double precision, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.claim_orphaned(text, text, text, text, integer, integer, double precision, double precision, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.claim_orphaned(text, text, text, text, integer, integer, double precision, double precision, text) TO zeroth_worker;
