-- sql/functions/internal/claims.sql: the shared body of claim_pending / claim_and_start and the leasing step of every claim.
-- Internal helpers: SECURITY INVOKER, executable by zeroth_owner only (they run inside the
-- SECURITY DEFINER public functions). Re-applied by every upgrade (sql/README.md).

CREATE OR REPLACE FUNCTION zeroth._latest_checkpoint_id(tenant_id text, workspace_key text, run_id uuid) RETURNS uuid
    LANGUAGE sql STABLE
    RETURN (SELECT k.checkpoint_id
              FROM zeroth.checkpoints k
             WHERE k.tenant_id = _latest_checkpoint_id.tenant_id
               AND k.workspace_key = _latest_checkpoint_id.workspace_key
               AND k.run_id = _latest_checkpoint_id.run_id
             ORDER BY k.checkpoint_order DESC
             LIMIT 1);
COMMENT ON FUNCTION zeroth._latest_checkpoint_id(text, text, uuid) IS 'Internal: the checkpoint with the highest checkpoint_order of a run, or NULL.';
ALTER FUNCTION zeroth._latest_checkpoint_id(text, text, uuid) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._latest_checkpoint_id(text, text, uuid) FROM PUBLIC;

CREATE OR REPLACE FUNCTION zeroth._claim_marker(active_count integer, saturated boolean, concurrency_limit integer)
    RETURNS zeroth.claimed_run
    LANGUAGE sql IMMUTABLE
    RETURN ROW(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
               active_count, saturated, concurrency_limit, NULL, NULL)::zeroth.claimed_run;
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
DROP FUNCTION IF EXISTS zeroth._lease_locked_runs(text, text, uuid[], integer[], text, timestamptz, interval, integer, integer, boolean);
-- code versions (issue 34, item 3): code_version added last (the signature before it dropped).
DROP FUNCTION IF EXISTS zeroth._lease_locked_runs(text, text, uuid[], tid[], integer[], text, timestamptz, interval, integer, integer, boolean);
CREATE OR REPLACE FUNCTION zeroth._lease_locked_runs(
    tenant_id text, workspace_key text, run_ids uuid[], rows tid[], slots integer[],
    worker_id text, at timestamptz, lease interval, active_count integer,
    concurrency_limit integer, start boolean, code_version_id bigint DEFAULT NULL)
    RETURNS SETOF zeroth.claimed_run
    LANGUAGE plpgsql VOLATILE
    SET enable_seqscan = off
    SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_count integer;
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
               lease_expires_at = _lease_locked_runs.at + _lease_locked_runs.lease,
               lease_generation = r.lease_generation + 1,
               admission_slot = _lease_locked_runs.slots[
                                    array_position(_lease_locked_runs.run_ids, r.run_id)],
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
               -- code versions (issue 34, item 3): a run not yet started takes the claimer's
               -- version (a lapsed unstarted claim's is replaced); a started one keeps its own.
               code_version_id = CASE WHEN r.started_at IS NULL
                                      THEN _lease_locked_runs.code_version_id
                                      ELSE r.code_version_id END,
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
           k.data, c.cancel_requested_at IS NOT NULL, _lease_locked_runs.active_count,
           false, _lease_locked_runs.concurrency_limit, NULL::timestamptz,
           NULL::double precision
      FROM claimed c
      LEFT JOIN zeroth.checkpoints k ON k.tenant_id = c.tenant_id AND k.workspace_key = c.workspace_key
                                     AND k.checkpoint_id = c.recovery_checkpoint_id
     ORDER BY c.position;

    GET DIAGNOSTICS v_count = ROW_COUNT;
    IF v_count = 0 THEN
        RETURN NEXT zeroth._claim_marker(_lease_locked_runs.active_count, false,
                                         _lease_locked_runs.concurrency_limit);
    END IF;
END
$$;
COMMENT ON FUNCTION zeroth._lease_locked_runs(text, text, uuid[], tid[], integer[], text, timestamptz, interval, integer, integer, boolean, bigint) IS 'Internal: lease runs (and slots) the caller already locked (rows: their addresses, reached by a TID scan); with start make pending ones running; count an attempt per start, per re-leased orphan and per lapsed unstarted claim re-leased; a run not yet started records the claimer''s code_version_id. The shared second half of claim_pending, claim_and_start and claim_orphaned.';
ALTER FUNCTION zeroth._lease_locked_runs(text, text, uuid[], tid[], integer[], text, timestamptz, interval, integer, integer, boolean, bigint) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._lease_locked_runs(text, text, uuid[], tid[], integer[], text, timestamptz, interval, integer, integer, boolean, bigint) FROM PUBLIC;

-- One scope's claim, arguments already checked and limits resolved (concurrency_limit: the
-- scope's effective max_concurrency, NULL for none; rate_limit: its zeroth.rate_limits key, NULL
-- for none): take starts from the rate limit, then free admission slots, lock up to that many
-- (at most `want`) pending, due runs with SKIP LOCKED, lease them (with start, make them
-- running) and log them as starts of the rate limit. A locked run whose previous claim lapsed
-- before start_run with no attempt left after counting that one is not leased but dead-lettered
-- (zeroth._take_over), and the claim locks more in its place: a payload that kills every
-- two-step worker before it starts ends after max_attempts claims and never blocks the runs
-- behind it. Locks: the rate key row, slot rows, run rows, all SKIP LOCKED, so no claimer ever
-- waits on another. The shared body of claim_pending,
-- claim_and_start and claim_and_start_scopes. (0012 added rate_limit; the old signature is
-- dropped first.)
DROP FUNCTION IF EXISTS zeroth._claim_in_scope(text, text, text, text, integer, integer, timestamptz, interval, boolean);
-- code versions (issue 34, item 3): code_version_id and serves added last (the signature before
-- them dropped). serves: zeroth._version_serves of the claimer, NULL = every run.
DROP FUNCTION IF EXISTS zeroth._claim_in_scope(text, text, text, text, integer, text, integer, timestamptz, interval, boolean);
CREATE OR REPLACE FUNCTION zeroth._claim_in_scope(
    tenant_id text, workspace_key text, deployment_ref text, worker_id text,
    concurrency_limit integer, rate_limit text, want integer, at timestamptz, lease interval,
    start boolean, code_version_id bigint DEFAULT NULL, serves bigint[] DEFAULT NULL)
    RETURNS SETOF zeroth.claimed_run
    LANGUAGE plpgsql VOLATILE
    SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_want   integer := _claim_in_scope.want;
    v_slots  integer[];
    v_active integer := 0;
    v_ids    uuid[] := '{}';
    v_rows   tid[] := '{}';
    v_more   uuid[];
    v_more_rows tid[];
    v_spent  uuid[];
    v_ended  uuid[] := '{}';
    v_rate   record;
    v_retry  timestamptz;
    v_row    zeroth.claimed_run;
    v_at     timestamptz := _claim_in_scope.at;
BEGIN
    IF _claim_in_scope.rate_limit IS NOT NULL THEN
        SELECT t.granted, t.retry_at, t.decided_at INTO v_rate
          FROM zeroth._take_rate(_claim_in_scope.rate_limit, v_want, _claim_in_scope.at) AS t;
        v_at := v_rate.decided_at;  -- the starts happen when the key was held (ascending)
        IF v_rate.granted = 0 THEN
            -- Held back only if work is really waiting; otherwise a definitive empty answer.
            IF zeroth._scope_has_due_run(_claim_in_scope.tenant_id, _claim_in_scope.workspace_key,
                                         _claim_in_scope.deployment_ref, v_at) THEN
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
    LOOP
        WITH locked AS MATERIALIZED (
            SELECT r.run_id, r.ctid, r.priority, r.run_after, r.created_at,
                   -- its last claim lapsed unstarted, and counting that attempt leaves none
                   r.lease_worker_id IS NOT NULL AND r.attempts + 1 >= r.max_attempts AS spent
              FROM zeroth.runs r
             WHERE r.tenant_id = _claim_in_scope.tenant_id
               AND r.workspace_key = _claim_in_scope.workspace_key
               AND r.deployment_ref = _claim_in_scope.deployment_ref
               AND r.status = 'pending'
               AND r.run_after <= v_at
               AND (r.lease_expires_at IS NULL OR r.lease_expires_at < v_at)
               AND r.run_id <> ALL (v_ids || v_ended)  -- an earlier pass's (our own locks)
               -- code versions (issue 34, item 3): a started run only for a version its
               -- deployment lets resume it. serves NULL (policy any, the default): always true,
               -- the same index scan as before; else a filter on the rows the scan reads, which
               -- passes over the due runs pinned to versions this worker may not serve
               -- (zeroth.pinned_runs counts them; retire_code_version clears them).
               AND (_claim_in_scope.serves IS NULL OR r.started_at IS NULL
                    OR r.code_version_id IS NULL
                    OR r.code_version_id = ANY (_claim_in_scope.serves))
             ORDER BY r.priority DESC, r.run_after, r.created_at
             LIMIT v_want - cardinality(v_ids)
               FOR UPDATE SKIP LOCKED
        )
        SELECT coalesce(array_agg(l.run_id ORDER BY l.priority DESC, l.run_after, l.created_at)
                            FILTER (WHERE NOT l.spent), '{}'),
               coalesce(array_agg(l.ctid ORDER BY l.priority DESC, l.run_after, l.created_at)
                            FILTER (WHERE NOT l.spent), '{}'),
               coalesce(array_agg(l.run_id) FILTER (WHERE l.spent), '{}')
          INTO v_more, v_more_rows, v_spent
          FROM locked l;
        v_ids := v_ids || v_more;
        v_rows := v_rows || v_more_rows;
        v_ended := v_ended || v_spent;
        EXIT WHEN cardinality(v_spent) = 0;
        -- Rare (a poison payload). Each pass sets at least one run aside for good (ended, or
        -- left alone when _take_over finds its slot busy: a later claim ends it), so this stops.
        -- Each in a subtransaction of its own (zeroth._take_over_isolated): a spent run whose
        -- end raises is dead-lettered alone (recovery_failed) and never fails this claim.
        FOR i IN 1 .. cardinality(v_spent) LOOP
            PERFORM zeroth._take_over_isolated(_claim_in_scope.tenant_id, _claim_in_scope.workspace_key,
                                               v_spent[i], interval '0', v_at, 'orphan_recovered', NULL);
        END LOOP;
        EXIT WHEN cardinality(v_ids) >= v_want;
    END LOOP;
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
        _claim_in_scope.concurrency_limit, _claim_in_scope.start, _claim_in_scope.code_version_id);
END
$$;
COMMENT ON FUNCTION zeroth._claim_in_scope(text, text, text, text, integer, text, integer, timestamptz, interval, boolean, bigint, bigint[]) IS 'Internal: claim up to `want` pending, due runs of one scope under its rate limit (starts from the key''s rolling window; none left: the marker with retry_at) and its effective concurrency limit (rate key, slots, runs, SKIP LOCKED); with start make them running; a started run only when serves (the claimer''s zeroth._version_serves) lets its code_version_id resume, a run not yet started records code_version_id. The shared body of claim_pending, claim_and_start and claim_and_start_scopes.';
ALTER FUNCTION zeroth._claim_in_scope(text, text, text, text, integer, text, integer, timestamptz, interval, boolean, bigint, bigint[]) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._claim_in_scope(text, text, text, text, integer, text, integer, timestamptz, interval, boolean, bigint, bigint[]) FROM PUBLIC;

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
    v_lease  interval := zeroth._deployment_lease(_claim_pending.deployment_ref, _claim_pending.lease_seconds);
    v_tenant text := zeroth._scope_tenant(_claim_pending.tenant_id, _claim_pending.workspace_id);
    v_wskey  text := zeroth._workspace_key(_claim_pending.workspace_id);
    v_limit  integer;
    v_paused boolean;
    v_rate   text;
BEGIN
    PERFORM zeroth._require_identifier(_claim_pending.deployment_ref, 'deployment_ref');
    PERFORM zeroth._require_identifier(_claim_pending.worker_id, 'worker_id');
    PERFORM zeroth._require(_claim_pending.batch_size BETWEEN 1 AND 1000, 'batch_size must be between 1 and 1000');
    PERFORM zeroth._require(_claim_pending.max_concurrency IS NULL OR _claim_pending.max_concurrency >= 1,
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
    RETURN QUERY SELECT * FROM zeroth._claim_in_scope(
        v_tenant, v_wskey, _claim_pending.deployment_ref, _claim_pending.worker_id, v_limit,
        v_rate, _claim_pending.batch_size, v_now, v_lease, _claim_pending.start,
        -- code versions (issue 34): the claimer's version (checked, ZP008; its text recorded once)
        -- and the run versions it may resume.
        zeroth._code_version_id(_claim_pending.code_version),
        zeroth._version_serves(_claim_pending.deployment_ref, _claim_pending.code_version));
END
$$;
COMMENT ON FUNCTION zeroth._claim_pending(text, text, text, text, integer, integer, double precision, boolean, text) IS 'Internal: the body of claim_pending (start false) and claim_and_start (start true): arguments, the scope''s limits (zeroth.scope_limits), the runs code_version may resume (zeroth._version_serves), then _claim_in_scope.';
ALTER FUNCTION zeroth._claim_pending(text, text, text, text, integer, integer, double precision, boolean, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._claim_pending(text, text, text, text, integer, integer, double precision, boolean, text) FROM PUBLIC;
