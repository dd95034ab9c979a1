-- sql/functions/internal/claims.sql: the shared body of claim_pending / claim_and_start and the leasing step of every claim.
-- Internal helpers: SECURITY INVOKER, executable by zeroth_owner only (they run inside the
-- SECURITY DEFINER public functions). Re-applied by every upgrade (sql/README.md).

-- The recovery point of a run re-leased after its checkpoints (zeroth._lease_locked_runs), and the
-- data a claim returns with it. PL/pgSQL, so never inlined: the claim's UPDATE, which every claim
-- runs, plans and starts up one call each, not a sub-plan and a join with zeroth.checkpoints that
-- only a run with checkpoints uses (issue 30: each node of a generic plan is set up again at
-- every execution). They take no lock.
CREATE OR REPLACE FUNCTION zeroth._latest_checkpoint_id(tenant_id text, workspace_key text, run_id uuid) RETURNS uuid
    LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT k.checkpoint_id
              FROM zeroth.checkpoints k
             WHERE k.tenant_id = _latest_checkpoint_id.tenant_id
               AND k.workspace_key = _latest_checkpoint_id.workspace_key
               AND k.run_id = _latest_checkpoint_id.run_id
             ORDER BY k.checkpoint_order DESC
             LIMIT 1);
END
$$;
COMMENT ON FUNCTION zeroth._latest_checkpoint_id(text, text, uuid) IS 'Internal: the checkpoint with the highest checkpoint_order of a run, or NULL.';
ALTER FUNCTION zeroth._latest_checkpoint_id(text, text, uuid) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._latest_checkpoint_id(text, text, uuid) FROM PUBLIC;

CREATE OR REPLACE FUNCTION zeroth._checkpoint_data(tenant_id text, workspace_key text, checkpoint_id uuid) RETURNS jsonb
    LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT k.data
              FROM zeroth.checkpoints k
             WHERE k.tenant_id = _checkpoint_data.tenant_id
               AND k.workspace_key = _checkpoint_data.workspace_key
               AND k.checkpoint_id = _checkpoint_data.checkpoint_id);
END
$$;
COMMENT ON FUNCTION zeroth._checkpoint_data(text, text, uuid) IS 'Internal: the data of a checkpoint, or NULL.';
ALTER FUNCTION zeroth._checkpoint_data(text, text, uuid) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._checkpoint_data(text, text, uuid) FROM PUBLIC;

CREATE OR REPLACE FUNCTION zeroth._claim_marker(active_count integer, saturated boolean, concurrency_limit integer)
    RETURNS zeroth.claimed_run
    LANGUAGE sql IMMUTABLE
    RETURN ROW(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
               active_count, saturated, concurrency_limit, NULL, NULL, NULL, NULL)::zeroth.claimed_run;
COMMENT ON FUNCTION zeroth._claim_marker(integer, boolean, integer) IS 'Internal: the run_id-NULL row a claim returns when it claimed nothing, carrying the saturation it saw.';
ALTER FUNCTION zeroth._claim_marker(integer, boolean, integer) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._claim_marker(integer, boolean, integer) FROM PUBLIC;

-- Leases runs the caller has already locked (FOR UPDATE SKIP LOCKED; rows[i] is the address of
-- the locked row of run_ids[i]) and, under max_concurrency, pairs run_ids[i] with the already
-- locked slot slots[i]: new generation, worker, times, slot, the latest checkpoint as recovery
-- point. Counts an attempt for every run that starts here (start: pending → running), for every
-- running run re-leased after its lease expired (an orphan: its last attempt died with its
-- worker) and for every pending run re-leased after a claim that lapsed before start_run (that
-- claim's attempt died with its worker too; the claim found it had one left, see
-- _claim_in_scope). Returns the claimed rows in input order, or the run_id-NULL row that says
-- nothing was claimable.
-- The UPDATE reaches the runs by their addresses (a TID scan), the one plan whatever the table's
-- statistics: by (tenant_id, workspace_key, run_id = ANY) a generic plan made before the first
-- ANALYZE of zeroth.runs (no statistics: each equality guessed to keep 0.5% of the rows, so a
-- scope looks like one row) put only the scope in the index condition and filtered the array,
-- walking every row version of the scope per claim on PostgreSQL 15 (issue 30). The scope
-- and run are re-checked by filters no index can serve, and sequential scans are off so that a
-- plan made on a small table cannot prefer one to the TID scan (a row this transaction holds
-- locked cannot move: no caller updates a run between locking it and leasing it).
-- Deadlines (issue 34 item 2): attempt_timeout / run_timeout are the deployment's (seconds, NULL:
-- none), a run's own (runs.attempt_timeout_seconds, run_timeout_seconds) wins. Each claim fixes
-- attempt_deadline_at = at + the attempt timeout; the first fixes run_deadline_at = at + the run
-- timeout and later ones keep it; the lease is capped at the earlier of the two (least() skips a
-- NULL: a run with no timeout gets at + lease, as before). The caller leases no run past its run
-- deadline (it ends those: zeroth._end_past_run_deadline, claim_orphaned's timeout step).
DROP FUNCTION IF EXISTS zeroth._lease_locked_runs(text, text, uuid[], integer[], text, timestamptz, interval, integer, integer, boolean);
CREATE OR REPLACE FUNCTION zeroth._lease_locked_runs(
    tenant_id text, workspace_key text, run_ids uuid[], rows tid[], slots integer[],
    worker_id text, at timestamptz, lease interval, active_count integer,
    concurrency_limit integer, start boolean,
    attempt_timeout double precision DEFAULT NULL, run_timeout double precision DEFAULT NULL,
    code_version_id bigint DEFAULT NULL)
    RETURNS SETOF zeroth.claimed_run
    LANGUAGE plpgsql VOLATILE
    -- JIT off, as in every function that turns a plan node off: a statement that cannot avoid
    -- the node (a LATERAL row lock needs a nested loop) is costed at 1e10 and JIT-compiled at
    -- each execution, 0.3-1.1 s of CPU where the server has LLVM (docs/performance.md, "JIT").
    SET jit = off
    SET enable_seqscan = off
    SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_count integer;
    -- Above every generation an earlier WAL timeline handed out (internal/generations.sql).
    v_floor bigint := zeroth._generation_floor();
BEGIN
    RETURN QUERY
    -- Each row finds its place in run_ids (its slot, its position in the answer) by
    -- array_position, not by a join with unnest(run_ids): with a generic plan's estimate of 10
    -- elements a nested loop over the two looks cheapest, and for a batch of 1,000 it compared
    -- every row with every element in the executor (1,000,000 join-filter rows, 70 ms);
    -- array_position's scan of the array is the same count of uuid comparisons in C, a few ms at
    -- 1,000 and nothing at the batch sizes a worker claims.
    WITH claimed AS (
        UPDATE zeroth.runs r
           SET lease_worker_id = _lease_locked_runs.worker_id,
               lease_acquired_at = _lease_locked_runs.at,
               lease_expires_at = least(
                   _lease_locked_runs.at + _lease_locked_runs.lease,
                   _lease_locked_runs.at + make_interval(secs => coalesce(
                       r.attempt_timeout_seconds, _lease_locked_runs.attempt_timeout)),
                   coalesce(r.run_deadline_at, _lease_locked_runs.at + make_interval(secs => coalesce(
                       r.run_timeout_seconds, _lease_locked_runs.run_timeout)))),
               attempt_deadline_at = _lease_locked_runs.at + make_interval(secs => coalesce(
                   r.attempt_timeout_seconds, _lease_locked_runs.attempt_timeout)),
               run_deadline_at = coalesce(r.run_deadline_at, _lease_locked_runs.at + make_interval(
                   secs => coalesce(r.run_timeout_seconds, _lease_locked_runs.run_timeout))),
               lease_generation = greatest(r.lease_generation + 1, v_floor + 1),
               -- code versions (issue 34, item 3): a run not yet started takes the claimer's
               -- version (a lapsed unstarted claim's is replaced); a started one keeps its own.
               code_version_id = CASE WHEN r.started_at IS NULL
                                      THEN _lease_locked_runs.code_version_id
                                      ELSE r.code_version_id END,
               admission_slot = _lease_locked_runs.slots[
                                    array_position(_lease_locked_runs.run_ids, r.run_id)],
               -- (calls, not a sub-plan and a join: zeroth._latest_checkpoint_id says why)
               recovery_checkpoint_id = CASE WHEN r.checkpoint_seq > 0
                   THEN zeroth._latest_checkpoint_id(r.tenant_id, r.workspace_key, r.run_id) END,
               status = CASE WHEN _lease_locked_runs.start THEN 'running' ELSE r.status END,
               attempts = r.attempts
                          + CASE WHEN r.status = 'running' OR _lease_locked_runs.start
                                 THEN 1 ELSE 0 END
                          + CASE WHEN r.status = 'pending' AND r.lease_worker_id IS NOT NULL
                                 THEN 1 ELSE 0 END,
               started_at = CASE WHEN _lease_locked_runs.start AND r.status = 'pending'
                                 THEN _lease_locked_runs.at ELSE r.started_at END,
               updated_at = _lease_locked_runs.at
         -- By address (see the header): IS NOT DISTINCT FROM and array_position are the
         -- same tests as = and = ANY on these NOT NULL columns, but never index conditions.
         WHERE r.ctid = ANY (_lease_locked_runs.rows)
           AND (r.tenant_id, r.workspace_key) IS NOT DISTINCT FROM
               (_lease_locked_runs.tenant_id, _lease_locked_runs.workspace_key)
           AND array_position(_lease_locked_runs.run_ids, r.run_id) IS NOT NULL
        RETURNING r.*, array_position(_lease_locked_runs.run_ids, r.run_id) AS position
    ), slotted AS (
        UPDATE zeroth.admission_slots s
           SET run_id = c.run_id, lease_generation = c.lease_generation
          FROM claimed c
         WHERE s.tenant_id = c.tenant_id AND s.workspace_key = c.workspace_key
           AND s.deployment_ref = c.deployment_ref AND s.slot_no = c.admission_slot
        RETURNING s.slot_no
    )
    SELECT c.run_id, c.lease_generation, c.lease_expires_at, c.status, c.attempts, c.max_attempts,
           c.priority, c.thread_id, c.idempotency_key, c.payload, c.metadata, c.recovery_checkpoint_id,
           CASE WHEN c.recovery_checkpoint_id IS NOT NULL
                THEN zeroth._checkpoint_data(c.tenant_id, c.workspace_key, c.recovery_checkpoint_id) END,
           c.cancel_requested_at IS NOT NULL, _lease_locked_runs.active_count,
           false, _lease_locked_runs.concurrency_limit, NULL::timestamptz,
           NULL::double precision, least(c.attempt_deadline_at, c.run_deadline_at),
           extract(epoch FROM least(c.attempt_deadline_at, c.run_deadline_at)
                              - _lease_locked_runs.at)::double precision
      FROM claimed c
     ORDER BY c.position;

    GET DIAGNOSTICS v_count = ROW_COUNT;
    IF v_count = 0 THEN
        RETURN NEXT zeroth._claim_marker(_lease_locked_runs.active_count, false,
                                         _lease_locked_runs.concurrency_limit);
    END IF;
END
$$;
COMMENT ON FUNCTION zeroth._lease_locked_runs(text, text, uuid[], tid[], integer[], text, timestamptz, interval, integer, integer, boolean, double precision, double precision, bigint) IS 'Internal: lease runs (and slots) the caller already locked (rows: their addresses, reached by a TID scan); with start make pending ones running; count an attempt per start, per re-leased orphan and per lapsed unstarted claim re-leased; a run not yet started records the claimer''s code_version_id. The shared second half of claim_pending, claim_and_start and claim_orphaned.';
ALTER FUNCTION zeroth._lease_locked_runs(text, text, uuid[], tid[], integer[], text, timestamptz, interval, integer, integer, boolean, double precision, double precision, bigint) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._lease_locked_runs(text, text, uuid[], tid[], integer[], text, timestamptz, interval, integer, integer, boolean, double precision, double precision, bigint) FROM PUBLIC;

-- One scope's claim, arguments already checked and limits resolved (concurrency_limit: the
-- scope's effective max_concurrency, NULL for none; rate_limit: its zeroth.rate_limits key, NULL
-- for none): take starts from the rate limit, then free admission slots, lock up to that many
-- (at most `want`) pending, due runs with SKIP LOCKED, lease them (with start, make them
-- running) and log them as starts of the rate limit. The runs are read in claim order (priority
-- DESC, run_after, created_at) from the session's claim floor (zeroth._claim_floor,
-- internal/claim_floor.sql: the floor's level from the floor, the others from their heads, every
-- level from its head once per bound), and the first run locked is the next floor
-- (zeroth._set_claim_floor; issue 30). A locked run whose previous claim lapsed
-- before start_run with no attempt left after counting that one is not leased but dead-lettered
-- (zeroth._take_over), and the claim locks more in its place: a payload that kills every
-- two-step worker before it starts ends after max_attempts claims and never blocks the runs
-- behind it. A locked run past its run deadline (runs.run_deadline_at, fixed by its first claim)
-- is not leased either but failed for good (zeroth._end_past_run_deadline, stop_reason
-- run_timeout; issue 34 item 2); attempt_timeout / run_timeout: the deployment's timeouts for
-- _lease_locked_runs, already read when timeouts_known (else read by the locking statement).
-- Locks: the rate key row, slot rows, run rows, all SKIP LOCKED, so no claimer ever
-- waits on another. The shared body of claim_pending,
-- claim_and_start and claim_and_start_scopes. (0012 added rate_limit; the old signature is
-- dropped first.)
DROP FUNCTION IF EXISTS zeroth._claim_in_scope(text, text, text, text, integer, integer, timestamptz, interval, boolean);
CREATE OR REPLACE FUNCTION zeroth._claim_in_scope(
    tenant_id text, workspace_key text, deployment_ref text, worker_id text,
    concurrency_limit integer, rate_limit text, want integer, at timestamptz, lease interval,
    start boolean,
    attempt_timeout double precision DEFAULT NULL, run_timeout double precision DEFAULT NULL,
    timeouts_known boolean DEFAULT false,
    code_version_id bigint DEFAULT NULL, serves bigint[] DEFAULT NULL)
    RETURNS SETOF zeroth.claimed_run
    LANGUAGE plpgsql VOLATILE
    -- JIT off, as in every function that turns a plan node off: a statement that cannot avoid
    -- the node (a LATERAL row lock needs a nested loop) is costed at 1e10 and JIT-compiled at
    -- each execution, 0.3-1.1 s of CPU where the server has LLVM (docs/performance.md, "JIT").
    SET jit = off
    -- Sequential scans off: a generic plan made while the table's statistics said it was empty
    -- (an ANALYZE of a new database) read zeroth.runs whole once it grew
    -- (tests/plans/test_generic_plans.py, analyzed-while-empty).
    SET enable_seqscan = off
    SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_timeouts double precision[];
    v_want   integer := _claim_in_scope.want;
    v_slots  integer[];
    v_active integer := 0;
    v_ids    uuid[] := '{}';
    v_rows   tid[] := '{}';
    v_more   uuid[];
    v_more_rows tid[];
    v_spent  uuid[];
    v_overdue uuid[];
    v_ended  uuid[] := '{}';
    v_rate   record;
    v_retry  timestamptz;
    v_row    zeroth.claimed_run;
    v_at     timestamptz := _claim_in_scope.at;
    -- the claim floor (issue 30): where this claim reads from, the first run each pass locked,
    -- the first of all of them
    v_floor  record;
    v_kept   text;  -- the floor's value as kept (zeroth._set_claim_floor)
    v_began  timestamptz;
    v_read   bigint;
    v_pages  bigint;
    v_first_priority   integer;
    v_first_run_after  timestamptz;
    v_first_created_at timestamptz;
    v_first_run_id     uuid;
    v_next_priority    integer;
    v_next_run_after   timestamptz;
    v_next_created_at  timestamptz;
    v_next_run_id      uuid;
BEGIN
    IF _claim_in_scope.rate_limit IS NOT NULL THEN
        SELECT t.granted, t.retry_at, t.decided_at INTO v_rate
          FROM zeroth._take_rate(_claim_in_scope.rate_limit, v_want, _claim_in_scope.at) AS t;
        v_at := v_rate.decided_at;  -- the starts happen when the key was held (ascending)
        IF v_rate.granted = 0 THEN
            -- Held back only if work is really waiting; otherwise a definitive empty answer.
            -- Work this claimer may take (its serves), read from its own claim floor (a look
            -- for every claimer would read the head, and keep a floor over this one's).
            IF zeroth._scope_has_due_run(_claim_in_scope.tenant_id, _claim_in_scope.workspace_key,
                                         _claim_in_scope.deployment_ref, v_at,
                                         _claim_in_scope.serves) THEN
                RETURN NEXT zeroth._rate_marker(_claim_in_scope.concurrency_limit, v_rate.retry_at,
                                                v_at);
            ELSE
                RETURN NEXT zeroth._claim_marker(0, false, _claim_in_scope.concurrency_limit);
            END IF;
            RETURN;
        END IF;
        v_want := v_rate.granted;
    END IF;
    IF _claim_in_scope.concurrency_limit IS NOT NULL THEN
        SELECT t.slots, t.active_count INTO v_slots, v_active
          FROM zeroth._take_slots(_claim_in_scope.tenant_id, _claim_in_scope.workspace_key,
                                  _claim_in_scope.deployment_ref, _claim_in_scope.concurrency_limit,
                                  v_want, v_at) AS t;
        IF cardinality(v_slots) = 0 THEN
            RETURN NEXT zeroth._claim_marker(v_active, true, _claim_in_scope.concurrency_limit);
            RETURN;
        END IF;
        v_want := cardinality(v_slots);
    END IF;

    -- Lock first (SKIP LOCKED: never wait on another claimer), then lease what was locked.
    -- From the session's claim floor (zeroth._claim_floor, issue 30): the levels above the
    -- floor's priority from their heads, the floor's level from the floor on (an exact start of
    -- the index scan: the dead entries before it are not read), the levels below from their
    -- heads; or, for a full scan, every level from its head.
    -- (Assigned, not SELECTed INTO: PL/pgSQL evaluates a lone function call as an expression,
    -- without a statement of its own; issue 30, sixth session.)
    v_floor := zeroth._claim_floor(_claim_in_scope.tenant_id, _claim_in_scope.workspace_key,
                                   _claim_in_scope.deployment_ref, _claim_in_scope.serves, v_at);
    IF v_floor.full_scan THEN
        v_began := clock_timestamp();
        v_read := zeroth._claim_index_entries_read();
        v_pages := zeroth._claim_index_pages_read();
    END IF;
    LOOP
        WITH locked AS MATERIALIZED (
            SELECT u.run_id, u.ctid, u.priority, u.run_after, u.created_at, u.spent, u.overdue,
                   -- The deployment's timeouts, when the caller did not read them: an InitPlan of
                   -- this statement (one primary-key probe, evaluated only when reached), not a
                   -- statement of its own (issue 34 item 2).
                   CASE WHEN NOT _claim_in_scope.timeouts_known
                        THEN (SELECT ARRAY[d.attempt_timeout_seconds, d.run_timeout_seconds]
                                FROM zeroth.deployments d
                               WHERE d.deployment_ref = _claim_in_scope.deployment_ref
                                 AND zeroth._policy_binds_caller(d.managed_by, d.registered_by))
                   END AS timeouts
              FROM (
                -- The three ranges in claim order; each locks at most what is still wanted and
                -- the next is read only when the ones before it gave too few (Append is lazy).
                SELECT * FROM (
                    SELECT r.run_id, r.ctid, r.priority, r.run_after, r.created_at,
                           -- its last claim lapsed unstarted, and counting that attempt leaves none
                           (r.lease_worker_id IS NOT NULL AND r.attempts + 1 >= r.max_attempts)
                           -- or its run deadline passed: never started again (issue 34 item 2)
                           OR coalesce(r.run_deadline_at <= v_at, false) AS spent,
                           coalesce(r.run_deadline_at <= v_at, false) AS overdue
                      FROM zeroth.runs r
                     WHERE r.tenant_id = _claim_in_scope.tenant_id
                       AND r.workspace_key = _claim_in_scope.workspace_key
                       AND r.deployment_ref = _claim_in_scope.deployment_ref
                       AND r.status = 'pending'
                       AND r.priority > v_floor.priority
                       AND r.run_after <= v_at
                       AND (r.lease_expires_at IS NULL OR r.lease_expires_at < v_at)
                       AND r.run_id <> ALL (v_ids || v_ended)  -- an earlier pass's (our own locks)
                       -- code versions (issue 34, item 3): a started run only for a version its
                       -- deployment lets resume it. serves NULL (policy any, the default): always
                       -- true, the same index scan as before; else a filter on the rows the scan
                       -- reads, which passes over the due runs pinned to versions this worker may
                       -- not serve (zeroth.pinned_runs counts them; retire_code_version clears
                       -- them).
                       AND (_claim_in_scope.serves IS NULL OR r.started_at IS NULL
                            OR r.code_version_id IS NULL
                            OR r.code_version_id = ANY (_claim_in_scope.serves))
                     ORDER BY r.priority DESC, r.run_after, r.created_at
                     LIMIT v_want - cardinality(v_ids)
                       FOR UPDATE SKIP LOCKED) above
                UNION ALL
                SELECT * FROM (
                    SELECT r.run_id, r.ctid, r.priority, r.run_after, r.created_at,
                           (r.lease_worker_id IS NOT NULL AND r.attempts + 1 >= r.max_attempts)
                           OR coalesce(r.run_deadline_at <= v_at, false) AS spent,
                           coalesce(r.run_deadline_at <= v_at, false) AS overdue
                      FROM zeroth.runs r
                     WHERE r.tenant_id = _claim_in_scope.tenant_id
                       AND r.workspace_key = _claim_in_scope.workspace_key
                       AND r.deployment_ref = _claim_in_scope.deployment_ref
                       AND r.status = 'pending'
                       AND r.priority = v_floor.priority
                       AND (r.run_after, r.created_at) >= (v_floor.run_after, v_floor.created_at)
                       AND r.run_after <= v_at
                       AND (r.lease_expires_at IS NULL OR r.lease_expires_at < v_at)
                       AND r.run_id <> ALL (v_ids || v_ended)
                       AND (_claim_in_scope.serves IS NULL OR r.started_at IS NULL
                            OR r.code_version_id IS NULL
                            OR r.code_version_id = ANY (_claim_in_scope.serves))
                     ORDER BY r.priority DESC, r.run_after, r.created_at
                     LIMIT v_want - cardinality(v_ids)
                       FOR UPDATE SKIP LOCKED) at_floor
                UNION ALL
                SELECT * FROM (
                    SELECT r.run_id, r.ctid, r.priority, r.run_after, r.created_at,
                           (r.lease_worker_id IS NOT NULL AND r.attempts + 1 >= r.max_attempts)
                           OR coalesce(r.run_deadline_at <= v_at, false) AS spent,
                           coalesce(r.run_deadline_at <= v_at, false) AS overdue
                      FROM zeroth.runs r
                     WHERE r.tenant_id = _claim_in_scope.tenant_id
                       AND r.workspace_key = _claim_in_scope.workspace_key
                       AND r.deployment_ref = _claim_in_scope.deployment_ref
                       AND r.status = 'pending'
                       AND r.priority < v_floor.priority
                       AND r.run_after <= v_at
                       AND (r.lease_expires_at IS NULL OR r.lease_expires_at < v_at)
                       AND r.run_id <> ALL (v_ids || v_ended)
                       AND (_claim_in_scope.serves IS NULL OR r.started_at IS NULL
                            OR r.code_version_id IS NULL
                            OR r.code_version_id = ANY (_claim_in_scope.serves))
                     ORDER BY r.priority DESC, r.run_after, r.created_at
                     LIMIT v_want - cardinality(v_ids)
                       FOR UPDATE SKIP LOCKED) below
              ) u
             LIMIT v_want - cardinality(v_ids)
        )
        SELECT coalesce(array_agg(l.run_id ORDER BY l.priority DESC, l.run_after, l.created_at)
                            FILTER (WHERE NOT l.spent), '{}'),
               coalesce(array_agg(l.ctid ORDER BY l.priority DESC, l.run_after, l.created_at)
                            FILTER (WHERE NOT l.spent), '{}'),
               coalesce(array_agg(l.run_id) FILTER (WHERE l.spent), '{}'),
               coalesce(array_agg(l.run_id) FILTER (WHERE l.overdue), '{}'),
               max(l.timeouts),  -- the same value on every row (NULL: none, or read before)
               -- the first run locked, in claim order: the next floor
               (array_agg(l.priority ORDER BY l.priority DESC, l.run_after, l.created_at))[1],
               (array_agg(l.run_after ORDER BY l.priority DESC, l.run_after, l.created_at))[1],
               (array_agg(l.created_at ORDER BY l.priority DESC, l.run_after, l.created_at))[1],
               (array_agg(l.run_id ORDER BY l.priority DESC, l.run_after, l.created_at))[1]
          INTO v_more, v_more_rows, v_spent, v_overdue, v_timeouts,
               v_first_priority, v_first_run_after, v_first_created_at, v_first_run_id
          FROM locked l;
        IF NOT _claim_in_scope.timeouts_known AND cardinality(v_more) > 0 THEN
            attempt_timeout := v_timeouts[1];
            run_timeout := v_timeouts[2];
            timeouts_known := true;
        END IF;
        -- The earliest run locked by any pass (a later pass may lock one an earlier skipped).
        IF v_first_priority IS NOT NULL
           AND (v_next_priority IS NULL OR v_first_priority > v_next_priority
                OR (v_first_priority = v_next_priority
                    AND (v_first_run_after, v_first_created_at)
                        < (v_next_run_after, v_next_created_at))) THEN
            v_next_priority := v_first_priority;
            v_next_run_after := v_first_run_after;
            v_next_created_at := v_first_created_at;
            v_next_run_id := v_first_run_id;
        END IF;
        v_ids := v_ids || v_more;
        v_rows := v_rows || v_more_rows;
        v_ended := v_ended || v_spent;
        EXIT WHEN cardinality(v_spent) = 0;
        -- Rare (a poison payload). Each pass sets at least one run aside for good (ended, or
        -- left alone when _take_over finds its slot busy: a later claim ends it), so this stops.
        -- Each in a subtransaction of its own (zeroth._take_over_isolated): a spent run whose
        -- end raises is dead-lettered alone (recovery_failed) and never fails this claim.
        FOR i IN 1 .. cardinality(v_spent) LOOP
            IF v_spent[i] = ANY (v_overdue) THEN
                -- Past its run deadline (a run retried, slept or waiting since): ended for good,
                -- through the settle path. In a subtransaction of its own, as the takeovers below:
                -- an end that raises is rolled back alone and the run left pending (set aside by
                -- this claim, met again by the next, with a WARNING each time), never failing
                -- this claim.
                PERFORM zeroth._end_past_run_deadline_isolated(_claim_in_scope.tenant_id,
                                                               _claim_in_scope.workspace_key,
                                                               v_spent[i], v_at);
            ELSE
                PERFORM zeroth._take_over_isolated(_claim_in_scope.tenant_id, _claim_in_scope.workspace_key,
                                                   v_spent[i], interval '0', v_at, 'orphan_recovered', NULL);
            END IF;
        END LOOP;
        EXIT WHEN cardinality(v_ids) >= v_want;
    END LOOP;
    -- The next floor: the first run this claim locked (everything before it in the ranges read
    -- was dead, locked by another claimer, leased, pinned to another version or not there). After
    -- a full scan only when the head was dirty (zeroth._claim_floor_after_full_scan); a floored
    -- scan that locked nothing keeps the floor it had.
    IF v_floor.full_scan THEN
        PERFORM zeroth._claim_floor_after_full_scan(
            _claim_in_scope.tenant_id, _claim_in_scope.workspace_key, _claim_in_scope.deployment_ref,
            _claim_in_scope.serves, v_floor.kept_priority, v_next_priority, v_next_run_after,
            v_next_created_at, v_next_run_id, v_at,
            zeroth._claim_index_entries_read() - v_read - cardinality(v_ids) - cardinality(v_ended),
            zeroth._claim_index_pages_read() - v_pages, v_want, clock_timestamp() - v_began);
    ELSIF v_next_priority IS NOT NULL THEN
        v_kept := zeroth._set_claim_floor(
            _claim_in_scope.tenant_id, _claim_in_scope.workspace_key, _claim_in_scope.deployment_ref,
            _claim_in_scope.serves, v_next_priority, v_next_run_after, v_next_created_at,
            v_next_run_id, v_floor.full_at, v_floor.bound_ms);
    END IF;
    IF _claim_in_scope.rate_limit IS NOT NULL THEN
        -- Log the starts; a batch the limit cut short says on every row when more may start.
        v_retry := zeroth._log_rate(_claim_in_scope.rate_limit, cardinality(v_ids), v_at);
        IF v_retry IS NOT NULL AND cardinality(v_ids) = v_rate.granted
           AND v_rate.granted < _claim_in_scope.want THEN
            FOR v_row IN
                SELECT * FROM zeroth._lease_locked_runs(
                    _claim_in_scope.tenant_id, _claim_in_scope.workspace_key, v_ids, v_rows, v_slots,
                    _claim_in_scope.worker_id, v_at, _claim_in_scope.lease,
                    v_active, _claim_in_scope.concurrency_limit, _claim_in_scope.start,
                    _claim_in_scope.attempt_timeout, _claim_in_scope.run_timeout,
                    _claim_in_scope.code_version_id)
            LOOP
                v_row.retry_at := v_retry;
                v_row.retry_after := extract(epoch FROM v_retry - v_at);
                RETURN NEXT v_row;
            END LOOP;
            RETURN;
        END IF;
    END IF;
    RETURN QUERY SELECT * FROM zeroth._lease_locked_runs(
        _claim_in_scope.tenant_id, _claim_in_scope.workspace_key, v_ids, v_rows, v_slots,
        _claim_in_scope.worker_id, v_at, _claim_in_scope.lease, v_active,
        _claim_in_scope.concurrency_limit, _claim_in_scope.start,
        _claim_in_scope.attempt_timeout, _claim_in_scope.run_timeout,
        _claim_in_scope.code_version_id);
END
$$;
COMMENT ON FUNCTION zeroth._claim_in_scope(text, text, text, text, integer, text, integer, timestamptz, interval, boolean, double precision, double precision, boolean, bigint, bigint[]) IS 'Internal: claim up to `want` pending, due runs of one scope under its rate limit (starts from the key''s rolling window; none left: the marker with retry_at) and its effective concurrency limit (rate key, slots, runs, SKIP LOCKED); with start make them running; a started run only when serves (the claimer''s zeroth._version_serves) lets its code_version_id resume, a run not yet started records code_version_id. The shared body of claim_pending, claim_and_start and claim_and_start_scopes.';
ALTER FUNCTION zeroth._claim_in_scope(text, text, text, text, integer, text, integer, timestamptz, interval, boolean, double precision, double precision, boolean, bigint, bigint[]) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._claim_in_scope(text, text, text, text, integer, text, integer, timestamptz, interval, boolean, double precision, double precision, boolean, bigint, bigint[]) FROM PUBLIC;

-- Ends a run that nobody holds a live lease on whose run deadline passed (issue 34 item 2): a
-- pending run (due, sleeping or in backoff; never started again) or a waiting one (paused, or
-- waiting for an event or its children), met by a claim (which holds its row already) or by the
-- sweep (zeroth.wake_due_waits). pending / waiting → failed along edge run_timed_out
-- (zeroth.run_transitions), error {stop_reason run_timeout} (the previous error kept, bounded), not
-- dead-lettered (no retry can help it). Through the one settle path (zeroth._settle, kind
-- deadline), on behalf of the run's holder as locked (a lapsed claim's, or none): the lapsed
-- claim's attempt is counted and recorded (expired), its lease cleared and its slot freed; a
-- waiting or sleeping run ends no attempt (its wait gave it back); a run with events gets its
-- END. Never waits: the lapsed claim's slot, then the run row, FOR UPDATE SKIP LOCKED, and the
-- run re-checked under its lock (pending or waiting, not queued behind its thread, no live lease,
-- past its run deadline), so a resume_run, emit_event or child's end that holds the row now goes
-- first and this call returns false (the run, pending again, is met by the next claim or sweep).
-- Returns whether it ended the run. Raises what the settle raises (the callers isolate it:
-- zeroth._end_past_run_deadline_isolated).
CREATE OR REPLACE FUNCTION zeroth._end_past_run_deadline(tenant_id text, workspace_key text,
                                                         run_id uuid, at timestamptz)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_run   record;
    v_slots tid[] := '{}';
BEGIN
    -- A lapsed claim's slot first, SKIP LOCKED (the lock order: slots before runs; someone
    -- holding it now — the lapsed holder's own settle, refused anyway — leaves the run to a later
    -- pass, as zeroth._take_over does).
    SELECT r.admission_slot, r.deployment_ref INTO v_run
      FROM zeroth.runs r
     WHERE r.tenant_id = _end_past_run_deadline.tenant_id
       AND r.workspace_key = _end_past_run_deadline.workspace_key
       AND r.run_id = _end_past_run_deadline.run_id;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF v_run.admission_slot IS NOT NULL THEN
        v_slots := ARRAY(SELECT s.ctid FROM zeroth.admission_slots s
                          WHERE s.tenant_id = _end_past_run_deadline.tenant_id
                            AND s.workspace_key = _end_past_run_deadline.workspace_key
                            AND s.deployment_ref = v_run.deployment_ref
                            AND s.slot_no = v_run.admission_slot
                            FOR UPDATE SKIP LOCKED);
        -- (no such row at all, a DBA deleted it: nothing to free, go on)
        IF cardinality(v_slots) = 0
           AND EXISTS (SELECT 1 FROM zeroth.admission_slots s
                        WHERE s.tenant_id = _end_past_run_deadline.tenant_id
                          AND s.workspace_key = _end_past_run_deadline.workspace_key
                          AND s.deployment_ref = v_run.deployment_ref
                          AND s.slot_no = v_run.admission_slot) THEN
            RETURN false;
        END IF;
    END IF;
    SELECT r.ctid, r.lease_worker_id, r.lease_generation INTO v_run
      FROM zeroth.runs r
     WHERE r.tenant_id = _end_past_run_deadline.tenant_id
       AND r.workspace_key = _end_past_run_deadline.workspace_key
       AND r.run_id = _end_past_run_deadline.run_id
       AND r.status IN ('pending', 'waiting')
       AND r.thread_queued_at IS NULL
       AND r.run_deadline_at <= _end_past_run_deadline.at
       AND coalesce(r.lease_expires_at < _end_past_run_deadline.at, true)
       FOR UPDATE OF r SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- The slot naming this lease only (a slot reused by another lease since stays theirs).
    v_slots := ARRAY(SELECT s.ctid FROM zeroth.admission_slots s
                      WHERE s.ctid = ANY (v_slots)
                        AND s.run_id = _end_past_run_deadline.run_id
                        AND s.lease_generation = v_run.lease_generation);
    PERFORM 1
       FROM zeroth._settle(_end_past_run_deadline.tenant_id, _end_past_run_deadline.workspace_key,
                           v_run.lease_worker_id, ARRAY[_end_past_run_deadline.run_id],
                           ARRAY[v_run.lease_generation], ARRAY['deadline'], NULL, NULL, NULL,
                           NULL, NULL, ARRAY[v_run.ctid], v_slots, _end_past_run_deadline.at) s
      WHERE s.sqlstate IS NULL;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION zeroth._end_past_run_deadline(text, text, uuid, timestamptz) IS 'Internal: a pending or waiting run nobody holds a live lease on, past its run deadline → failed (edge run_timed_out, stop_reason run_timeout) through zeroth._settle (kind deadline): a lapsed claim''s attempt counted and recorded, lease cleared, slot freed; a waiting or sleeping run ends no attempt. Slot and run SKIP LOCKED and re-checked. True when it ended the run.';
ALTER FUNCTION zeroth._end_past_run_deadline(text, text, uuid, timestamptz) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._end_past_run_deadline(text, text, uuid, timestamptz) FROM PUBLIC;

-- zeroth._end_past_run_deadline in a subtransaction of its own, for the claims and the sweep: an
-- end that raises is rolled back alone and the run left as it was (pending or waiting), with a
-- WARNING naming it, never failing the caller nor stopping the others; the next claim or sweep
-- meets it again; so is one that gave up waiting for a lock (55P03, zeroth._lock_timed_out: a row
-- someone holds in an open transaction — a child's child_runs row its parent's wait_for_children
-- holds — must neither stall nor fail every claim and sweep; the end waits at most 2 s for one). Any other passing condition
-- (zeroth._transient_sqlstate: a serialization failure, a deadlock…) is raised again: it says
-- something about this moment, and the caller's next pass retries. Returns whether it ended the
-- run.
CREATE OR REPLACE FUNCTION zeroth._end_past_run_deadline_isolated(tenant_id text, workspace_key text,
                                                                  run_id uuid, at timestamptz)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_state   text;
    v_msg     text;
    v_timeout text := current_setting('lock_timeout');
    v_ended   boolean;
BEGIN
    -- The end waits at most 2 s for a lock (the claims run under no lock_timeout of their own):
    -- set for the call only, the caller's own kept when shorter; the rollback of this block's
    -- subtransaction puts it back when the end raises.
    IF v_timeout = '0' OR v_timeout::interval > interval '2 seconds' THEN
        PERFORM set_config('lock_timeout', '2s', true);
    END IF;
    v_ended := zeroth._end_past_run_deadline(_end_past_run_deadline_isolated.tenant_id,
                                             _end_past_run_deadline_isolated.workspace_key,
                                             _end_past_run_deadline_isolated.run_id,
                                             _end_past_run_deadline_isolated.at);
    PERFORM set_config('lock_timeout', v_timeout, true);
    RETURN v_ended;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_msg = MESSAGE_TEXT;
    -- Gave up waiting for a lock (the caller's lock_timeout: a row someone holds in a transaction
    -- left open): says nothing about this run nor the others, so neither fails the caller.
    IF zeroth._lock_timed_out(v_state) THEN
        RAISE WARNING 'zeroth: the end of run % past its run deadline waited too long for a lock (%); it is left as it was and tried again by the next claim or sweep',
            _end_past_run_deadline_isolated.run_id, left(v_msg, 500);
        RETURN false;
    ELSIF zeroth._transient_sqlstate(v_state) THEN
        RAISE;
    END IF;
    RAISE WARNING 'zeroth: the end of run % past its run deadline raised % (%); it is left as it was and tried again by the next claim or sweep',
        _end_past_run_deadline_isolated.run_id, v_state, left(v_msg, 500);
    RETURN false;
END
$$;
COMMENT ON FUNCTION zeroth._end_past_run_deadline_isolated(text, text, uuid, timestamptz) IS 'Internal: zeroth._end_past_run_deadline in a subtransaction of its own: an end that raises is rolled back alone, the run left as it was with a WARNING, as when it gave up waiting for a lock (55P03; it waits at most 2 s, or the caller''s shorter lock_timeout); any other passing condition is raised again. True when it ended the run.';
ALTER FUNCTION zeroth._end_past_run_deadline_isolated(text, text, uuid, timestamptz) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._end_past_run_deadline_isolated(text, text, uuid, timestamptz) FROM PUBLIC;

-- The room for one lease that is not a claim (admit_run's admit-and-own): what every claim obeys,
-- from the same helpers. The scope's zeroth.scope_limits row (there is no caller's
-- max_concurrency here): paused → no room; its rate_limit key → one start (_take_rate; none left:
-- retry_at); its max_concurrency → one free slot (_take_slots; none: no room). leasable: the
-- lease may be written; then the caller writes the run with admission_slot = slot and the slot
-- row naming (run, generation), and logs the start with zeroth._log_rate(rate_limit, 1,
-- decided_at). Locks: the rate key row, the slot row, SKIP LOCKED (never waits).
CREATE OR REPLACE FUNCTION zeroth._take_lease_room(
    tenant_id text, workspace_key text, deployment_ref text, at timestamptz,
    OUT leasable boolean, OUT slot integer, OUT rate_limit text, OUT retry_at timestamptz,
    OUT decided_at timestamptz)
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_limit  integer;
    v_paused boolean;
    v_rate   record;
    v_slots  integer[];
BEGIN
    leasable := false;
    decided_at := _take_lease_room.at;
    SELECT l.max_concurrency, l.paused, l.rate_limit INTO v_limit, v_paused, rate_limit
      FROM zeroth._scope_limit(_take_lease_room.tenant_id, _take_lease_room.workspace_key,
                               _take_lease_room.deployment_ref, NULL) AS l;
    IF v_paused THEN
        RETURN;
    END IF;
    IF rate_limit IS NOT NULL THEN
        SELECT t.granted, t.retry_at, t.decided_at INTO v_rate
          FROM zeroth._take_rate(rate_limit, 1, _take_lease_room.at) AS t;
        decided_at := v_rate.decided_at;
        IF v_rate.granted = 0 THEN
            retry_at := v_rate.retry_at;
            RETURN;
        END IF;
    END IF;
    IF v_limit IS NOT NULL THEN
        SELECT t.slots INTO v_slots
          FROM zeroth._take_slots(_take_lease_room.tenant_id, _take_lease_room.workspace_key,
                                  _take_lease_room.deployment_ref, v_limit, 1, decided_at) AS t;
        IF cardinality(v_slots) = 0 THEN
            RETURN;
        END IF;
        slot := v_slots[1];
    END IF;
    leasable := true;
END
$$;
COMMENT ON FUNCTION zeroth._take_lease_room(text, text, text, timestamptz) IS 'Internal: the room for one lease that is not a claim (admit-and-own), under the scope''s zeroth.scope_limits row as every claim: paused → none; one start of its rate key (none: retry_at); one free slot of its max_concurrency. SKIP LOCKED.';
ALTER FUNCTION zeroth._take_lease_room(text, text, text, timestamptz) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._take_lease_room(text, text, text, timestamptz) FROM PUBLIC;

-- The body of claim_pending and claim_and_start: check the arguments, resolve the scope's limits
-- (zeroth.scope_limits: a paused scope gives nothing; its max_concurrency replaces the caller's;
-- its rate_limit key caps the starts),
-- then claim in that one scope. Raises ZP006, ZP008.
-- code versions (issue 34, item 3): code_version added last (the signature before it dropped).
DROP FUNCTION IF EXISTS zeroth._claim_pending(text, text, text, text, integer, integer, double precision, boolean);
CREATE OR REPLACE FUNCTION zeroth._claim_pending(
    deployment_ref text, worker_id text, tenant_id text, workspace_id text, max_concurrency integer,
    batch_size integer, lease_seconds double precision, start boolean, code_version text DEFAULT NULL)
    RETURNS SETOF zeroth.claimed_run
    LANGUAGE plpgsql VOLATILE
    SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_now    timestamptz := zeroth._now();
    -- The lease and, with the lease NULL, the deployment's timeouts in the probe that reads it
    -- (issue 34 item 2; a given lease reads nothing here: _claim_in_scope reads them).
    v_policy record := zeroth._deployment_claim_policy(_claim_pending.deployment_ref, _claim_pending.lease_seconds);
    v_tenant text := zeroth._scope_tenant(_claim_pending.tenant_id, _claim_pending.workspace_id);
    v_wskey  text := zeroth._workspace_key(_claim_pending.workspace_id);
    v_limit  integer;
    v_version bigint := zeroth._declared_code_version(_claim_pending.code_version);  -- ZP008 if bad
    v_row    zeroth.claimed_run;
    v_leased boolean := false;
    v_paused boolean;
    v_rate   text;
BEGIN
    -- One statement, the checks in order (the first that fails raises): each PERFORM is a
    -- statement of its own, and every claim runs these (issue 30, sixth session).
    PERFORM zeroth._require_identifier(_claim_pending.deployment_ref, 'deployment_ref'),
            zeroth._require_identifier(_claim_pending.worker_id, 'worker_id'),
            zeroth._require(_claim_pending.batch_size BETWEEN 1 AND 1000, 'batch_size must be between 1 and 1000'),
            zeroth._require(_claim_pending.max_concurrency IS NULL OR _claim_pending.max_concurrency >= 1,
                            'max_concurrency must be NULL or at least 1');
    IF _claim_pending.max_concurrency IS NOT NULL AND v_tenant IS NULL THEN
        RAISE EXCEPTION 'distributed concurrency needs an exact scope: a workspace_id needs a tenant_id'
            USING ERRCODE = 'ZP006';
    END IF;

    SELECT l.max_concurrency, l.paused, l.rate_limit INTO v_limit, v_paused, v_rate
      FROM zeroth._scope_limit(v_tenant, v_wskey, _claim_pending.deployment_ref,
                               _claim_pending.max_concurrency) AS l;
    IF v_paused THEN  -- nothing this caller may claim: a definitive empty answer
        RETURN NEXT zeroth._claim_marker(0, false, v_limit);
        RETURN;
    END IF;
    FOR v_row IN SELECT * FROM zeroth._claim_in_scope(
        v_tenant, v_wskey, _claim_pending.deployment_ref, _claim_pending.worker_id, v_limit,
        v_rate, _claim_pending.batch_size, v_now, v_policy.lease, _claim_pending.start,
        v_policy.attempt_timeout_seconds, v_policy.run_timeout_seconds, v_policy.timeouts_known,
        -- code versions (issue 34): the claimer's version (checked, ZP008) and the run versions
        -- it may resume.
        v_version,
        zeroth._version_serves(_claim_pending.deployment_ref, _claim_pending.code_version)) LOOP
        v_leased := v_leased OR v_row.run_id IS NOT NULL;
        RETURN NEXT v_row;
    END LOOP;
    -- Its text recorded once a run may have recorded it: a claim that leased nothing writes
    -- nothing to zeroth.code_versions.
    IF v_leased AND _claim_pending.code_version IS NOT NULL THEN
        PERFORM zeroth._code_version_id(_claim_pending.code_version);
    END IF;
END
$$;
COMMENT ON FUNCTION zeroth._claim_pending(text, text, text, text, integer, integer, double precision, boolean, text) IS 'Internal: the body of claim_pending (start false) and claim_and_start (start true): arguments, the scope''s limits (zeroth.scope_limits), the runs code_version may resume (zeroth._version_serves), then _claim_in_scope.';
ALTER FUNCTION zeroth._claim_pending(text, text, text, text, integer, integer, double precision, boolean, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._claim_pending(text, text, text, text, integer, integer, double precision, boolean, text) FROM PUBLIC;
