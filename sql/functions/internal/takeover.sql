-- sql/functions/internal/takeover.sql: taking over a run whose owner stopped renewing (claim_for_takeover, reconcile_thread_runs, claim_orphaned, and the claims of pending runs for a lapsed claim with no attempt left), and ending alone one whose takeover raised.
-- Internal helpers: SECURITY INVOKER, executable by zeroth_owner only (they run inside the
-- SECURITY DEFINER public functions). Re-applied by every upgrade (sql/README.md).

-- Seconds until lease + grace runs out, rounded up and at least 1; NULL without a lease. Clamped
-- to the integer range (a far-off timestamp never raises).
-- STABLE, as its body is (timestamptz + interval), so that the planner inlines it
-- (zeroth._code_version_hash says why that matters).
CREATE OR REPLACE FUNCTION zeroth._retry_after(lease_expires_at timestamptz, grace interval, at timestamptz) RETURNS integer
    LANGUAGE sql STABLE
    RETURN CASE WHEN lease_expires_at IS NOT NULL
                THEN least(greatest(1, ceil(extract(epoch FROM lease_expires_at + grace - at))), 2147483647)::integer
           END;
COMMENT ON FUNCTION zeroth._retry_after(timestamptz, interval, timestamptz) IS 'Internal: max(1, ceil(lease_expires_at + grace - at)) in seconds, clamped to the integer range; NULL without a lease.';
ALTER FUNCTION zeroth._retry_after(timestamptz, interval, timestamptz) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._retry_after(timestamptz, interval, timestamptz) FROM PUBLIC;

-- Ends or hands back one run whose owner's lease expired more than grace ago. Never waits: the
-- slot row and then the run row are taken with SKIP LOCKED, so an owner renewing right now wins
-- and the call returns nothing. The expiry is re-checked in the locking predicate. Outcome: a
-- requested cancel → cancelled; a claim that lapsed before start_run (pending) with no attempt
-- left once its own is counted → failed and dead-lettered, stop_reason attempts_exhausted; not
-- resumable → failed with {stop_reason, message}; resumable and out of attempts (a running run)
-- → dead-lettered alike; else → requeued (pending). The interrupted attempt stays counted, and a
-- lapsed unstarted claim is counted here (start_run never counted it): only a hand-back by the
-- live holder gives one back, so a run that kills every worker it lands on — before or after
-- start_run — ends after max_attempts. The decision, the end, the slot, the attempt history and
-- the wakeup are the settle path's (zeroth._settle, kind take_over, only along an edge of
-- zeroth.run_transitions: a removed edge takes nothing); this function locks and maps the outcome.
CREATE OR REPLACE FUNCTION zeroth._take_over(tenant_id text, workspace_key text, run_id uuid, grace interval, at timestamptz,
                                  stop_reason text, message text)
    RETURNS SETOF zeroth.takeover
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_run    record;
    v_slot   tid[] := '{}';
    v_result zeroth.takeover;
BEGIN
    SELECT r.admission_slot, r.deployment_ref INTO v_run
      FROM zeroth.runs r
     WHERE r.tenant_id = _take_over.tenant_id AND r.workspace_key = _take_over.workspace_key
       AND r.run_id = _take_over.run_id;
    IF v_run.admission_slot IS NOT NULL THEN
        v_slot := ARRAY(SELECT s.ctid
                          FROM zeroth.admission_slots s
                         WHERE s.tenant_id = _take_over.tenant_id AND s.workspace_key = _take_over.workspace_key
                           AND s.deployment_ref = v_run.deployment_ref AND s.slot_no = v_run.admission_slot
                           FOR UPDATE SKIP LOCKED);
        -- Held by someone right now: theirs (an owner renewing wins). No such row at all (a
        -- DBA deleted it): nothing to free, and no reason to leave the run stranded for ever.
        IF cardinality(v_slot) = 0
           AND EXISTS (SELECT 1 FROM zeroth.admission_slots s
                        WHERE s.tenant_id = _take_over.tenant_id AND s.workspace_key = _take_over.workspace_key
                          AND s.deployment_ref = v_run.deployment_ref
                          AND s.slot_no = v_run.admission_slot) THEN
            RETURN;
        END IF;
    END IF;

    SELECT r.ctid, r.thread_id, r.lease_worker_id, r.lease_generation
      INTO v_run
      FROM zeroth.runs r
     WHERE r.tenant_id = _take_over.tenant_id AND r.workspace_key = _take_over.workspace_key
       AND r.run_id = _take_over.run_id
       AND r.status IN ('pending', 'running')
       AND r.lease_worker_id IS NOT NULL
       AND r.lease_expires_at + _take_over.grace < _take_over.at
       FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;

    -- The decision, the end, the slot and the wakeup: the settle path (kind take_over).
    SELECT _take_over.run_id, v_run.thread_id,
           CASE s.outcome WHEN 'takeover_requeued' THEN 'requeued'
                          WHEN 'takeover_cancelled' THEN 'cancelled'
                          WHEN 'takeover_failed' THEN 'failed'
                          WHEN 'orphan_recovered' THEN 'failed'
                          ELSE 'dead_lettered' END,
           s.to_status, v_run.lease_worker_id, v_run.lease_generation
      INTO v_result
      FROM zeroth._settle(_take_over.tenant_id, _take_over.workspace_key, v_run.lease_worker_id,
                          ARRAY[_take_over.run_id], ARRAY[v_run.lease_generation], ARRAY['take_over'],
                          ARRAY[to_jsonb(_take_over.message)], NULL, ARRAY[_take_over.stop_reason],
                          NULL, NULL, ARRAY[v_run.ctid], v_slot, _take_over.at) s
     WHERE s.sqlstate IS NULL;
    IF FOUND THEN
        RETURN NEXT v_result;
    END IF;
END
$$;
COMMENT ON FUNCTION zeroth._take_over(text, text, uuid, interval, timestamptz, text, text) IS 'Internal: the takeover of one run whose lease expired past grace (SKIP LOCKED throughout): cancelled | failed | dead_lettered | requeued; a lapsed unstarted claim counts its attempt. Shared by claim_for_takeover, reconcile_thread_runs, claim_orphaned and the claims of pending runs (a spent lapsed claim).';
ALTER FUNCTION zeroth._take_over(text, text, uuid, interval, timestamptz, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._take_over(text, text, uuid, interval, timestamptz, text, text) FROM PUBLIC;

-- Whether an error caught while recovering one run says something about this moment, not about
-- the run: a connection, transaction-rollback (40001 serialization, 40P01 deadlock), resource
-- (53: out of memory, disk full), lock-not-available (55P03) or operator-intervention or system
-- (57, 58) class. Those are raised again (the whole pass fails and the next one retries it, as
-- before); only an error the run itself causes ends it (zeroth._end_unrecoverable).
CREATE OR REPLACE FUNCTION zeroth._transient_sqlstate(sqlstate text) RETURNS boolean
    LANGUAGE sql IMMUTABLE
    RETURN left(sqlstate, 2) IN ('08', '40', '53', '55', '57', '58');
COMMENT ON FUNCTION zeroth._transient_sqlstate(text) IS 'Internal: an SQLSTATE of a passing condition (classes 08, 40, 53, 55, 57, 58): a recovery that raised it is retried by the next pass, not ended.';
ALTER FUNCTION zeroth._transient_sqlstate(text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._transient_sqlstate(text) FROM PUBLIC;

-- Whether the recovery of one run gave up waiting for a lock (55P03: claim_orphaned,
-- claim_orphaned_scopes, reconcile_thread_runs and claim_for_takeover run under SET lock_timeout
-- = '2s'). That says nothing about the run and must not end
-- it, nor fail the pass: a zeroth_worker member holding a row of its own scope (a child_runs row
-- its parent's wait_for_children locked, in a transaction it leaves open) would stall or fail
-- every sweep of every scope for as long as it liked. The run is left (a WARNING) for the next
-- pass and the others are recovered.
CREATE OR REPLACE FUNCTION zeroth._lock_timed_out(sqlstate text) RETURNS boolean
    LANGUAGE sql IMMUTABLE
    RETURN sqlstate = '55P03';
COMMENT ON FUNCTION zeroth._lock_timed_out(text) IS 'Internal: 55P03 lock_not_available: a recovery that waited past the sweep''s lock_timeout leaves that run (or scope) for the next pass, neither ended nor failing the pass.';
ALTER FUNCTION zeroth._lock_timed_out(text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._lock_timed_out(text) FROM PUBLIC;

-- The end of a run whose recovery raised (one bad run never stops the recovery of
-- another). Called after the subtransaction that tried it rolled back: the run, still
-- active with its lease expired (re-checked; SKIP LOCKED, so a run someone holds right now is left
-- to them), becomes failed and dead-lettered with {stop_reason recovery_failed, message naming the
-- SQLSTATE and the error, bounded} (zeroth._stop_error; its previous error kept bounded), its lease
-- cleared and its slot freed (zeroth._settle, kind unrecoverable). So the next pass does not meet it again, an operator finds it in
-- zeroth.dead_letters, and redrive_run can start it over once the cause is gone. It raises
-- nothing: should even this end raise, it is rolled back too and reported as a WARNING naming the
-- run, the others go on, and the next pass tries the run again. Returns the takeover row
-- (outcome dead_lettered) or nothing.
CREATE OR REPLACE FUNCTION zeroth._end_unrecoverable(tenant_id text, workspace_key text, run_id uuid, at timestamptz,
                                                      sqlstate text, message text)
    RETURNS SETOF zeroth.takeover
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_run    record;
    v_result zeroth.takeover;
    v_state  text;
    v_msg    text;
BEGIN
    BEGIN
        SELECT r.ctid, r.thread_id, r.lease_worker_id, r.lease_generation
          INTO v_run
          FROM zeroth.runs r
         WHERE r.tenant_id = _end_unrecoverable.tenant_id AND r.workspace_key = _end_unrecoverable.workspace_key
           AND r.run_id = _end_unrecoverable.run_id
           AND r.status IN ('pending', 'running')
           AND r.lease_worker_id IS NOT NULL
           AND r.lease_expires_at < _end_unrecoverable.at
           FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        -- The end, the slot naming this lease and the wakeup: the settle path (kind unrecoverable).
        PERFORM 1
           FROM zeroth._settle(_end_unrecoverable.tenant_id, _end_unrecoverable.workspace_key, v_run.lease_worker_id,
                               ARRAY[_end_unrecoverable.run_id], ARRAY[v_run.lease_generation],
                               ARRAY['unrecoverable'],
                               ARRAY[to_jsonb(format(
                                   'the recovery of this run raised %s: %s; it is dead-lettered so that it '
                                   'stops no other run''s recovery (redrive_run starts it again)',
                                   _end_unrecoverable.sqlstate, left(_end_unrecoverable.message, 2000)))],
                               NULL, NULL, NULL, NULL, ARRAY[v_run.ctid],
                               ARRAY(SELECT s.ctid FROM zeroth.admission_slots s
                                      -- IS NOT DISTINCT FROM: by admission_slots_run_idx (_lock_settle).
                                      WHERE s.run_id = _end_unrecoverable.run_id
                                        AND (s.tenant_id, s.workspace_key) IS NOT DISTINCT FROM
                                            (_end_unrecoverable.tenant_id, _end_unrecoverable.workspace_key)
                                        AND s.lease_generation = v_run.lease_generation
                                        FOR UPDATE),
                               _end_unrecoverable.at) s
          WHERE s.sqlstate IS NULL;
        IF NOT FOUND THEN
            RETURN;
        END IF;
    EXCEPTION WHEN OTHERS THEN
        IF zeroth._transient_sqlstate(SQLSTATE) AND NOT zeroth._lock_timed_out(SQLSTATE) THEN
            RAISE;
        END IF;
        GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_msg = MESSAGE_TEXT;
        RAISE WARNING 'zeroth: the recovery of run % raised % (%), and so did its dead-lettering: % (%); it is left as it was and tried again on the next pass',
            _end_unrecoverable.run_id, _end_unrecoverable.sqlstate, left(_end_unrecoverable.message, 500),
            v_state, left(v_msg, 500);
        RETURN;
    END;
    v_result := ROW(_end_unrecoverable.run_id, v_run.thread_id, 'dead_lettered', 'failed',
                    v_run.lease_worker_id, v_run.lease_generation)::zeroth.takeover;
    RETURN NEXT v_result;
END
$$;
COMMENT ON FUNCTION zeroth._end_unrecoverable(text, text, uuid, timestamptz, text, text) IS 'Internal: a run whose recovery raised (rolled back) → failed + dead-lettered, stop_reason recovery_failed, lease cleared, slot freed (SKIP LOCKED; re-checks it is active with an expired lease). Raises nothing but a passing condition other than a lock timeout: a failure here (55P03 included) is a WARNING and the run is left for the next pass.';
ALTER FUNCTION zeroth._end_unrecoverable(text, text, uuid, timestamptz, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._end_unrecoverable(text, text, uuid, timestamptz, text, text) FROM PUBLIC;

-- zeroth._take_over in a subtransaction of its own: a run whose takeover raises is rolled back
-- alone and ended by zeroth._end_unrecoverable; one whose takeover gave up waiting for a lock
-- (zeroth._lock_timed_out) is rolled back and left for the next pass, with a WARNING. The loops over many runs (claim_orphaned,
-- reconcile_thread_runs) first try the whole batch in one subtransaction and use this, one run at
-- a time, only when that raised; claim_for_takeover (one run) always does.
CREATE OR REPLACE FUNCTION zeroth._take_over_isolated(tenant_id text, workspace_key text, run_id uuid, grace interval,
                                                       at timestamptz, stop_reason text, message text)
    RETURNS SETOF zeroth.takeover
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_rows  zeroth.takeover[];
    v_state text;
    v_msg   text;
BEGIN
    BEGIN
        v_rows := ARRAY(SELECT t FROM zeroth._take_over(_take_over_isolated.tenant_id, _take_over_isolated.workspace_key,
                                                         _take_over_isolated.run_id, _take_over_isolated.grace,
                                                         _take_over_isolated.at, _take_over_isolated.stop_reason,
                                                         _take_over_isolated.message) AS t);
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_msg = MESSAGE_TEXT;
        IF zeroth._lock_timed_out(v_state) THEN
            RAISE WARNING 'zeroth: the recovery of run % waited too long for a lock (%); it is left as it was and tried again on the next pass',
                _take_over_isolated.run_id, left(v_msg, 500);
            RETURN;
        ELSIF zeroth._transient_sqlstate(v_state) THEN
            RAISE;
        END IF;
        RETURN QUERY SELECT * FROM zeroth._end_unrecoverable(
            _take_over_isolated.tenant_id, _take_over_isolated.workspace_key, _take_over_isolated.run_id,
            _take_over_isolated.at, v_state, v_msg);
        RETURN;
    END;
    RETURN QUERY SELECT * FROM unnest(v_rows);
END
$$;
COMMENT ON FUNCTION zeroth._take_over_isolated(text, text, uuid, interval, timestamptz, text, text) IS 'Internal: zeroth._take_over in its own subtransaction; when it raises, the run alone is rolled back and ended by zeroth._end_unrecoverable (dead-lettered, stop_reason recovery_failed); when it gave up waiting for a lock (55P03), rolled back and left for the next pass (WARNING).';
ALTER FUNCTION zeroth._take_over_isolated(text, text, uuid, interval, timestamptz, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._take_over_isolated(text, text, uuid, interval, timestamptz, text, text) FROM PUBLIC;
