-- 0007_fast_path: the worker's lifecycle in two statements per batch instead of three per run.
--
--   * claim_and_start — claim_pending for a caller that starts what it claims at once (the
--     RunWorker always does): the lease is taken and pending → running in the same UPDATE, so the
--     separate start_run round trip disappears. claim_pending and claim_and_start now share one
--     body, zeroth._claim_pending(..., start).
--   * complete_runs — complete_run for many (run_id, generation) pairs in one statement, fenced per
--     row in the UPDATE's predicate exactly as complete_run is, so a worker can acknowledge the
--     runs that finished together with one round trip.
--   * renew_leases is re-created to lock its slot rows and run rows in run_id order, the order
--     complete_runs uses: a worker may renew and complete overlapping sets of its own runs on two
--     connections at once without a deadlock.
--   * The claim statements are planned once per session (plan_cache_mode = force_generic_plan on
--     the two internal functions): PL/pgSQL kept re-planning them for every call because a custom
--     plan always looked cheaper, and the planning cost more than the execution (bench/, issue 6).
--
-- Released migrations are immutable; every function changed here is re-created in full.

-- ---------------------------------------------------------------------------------------------
-- Claiming
-- ---------------------------------------------------------------------------------------------

-- Leases runs the caller has already locked (FOR UPDATE SKIP LOCKED) and, under
-- max_concurrency, pairs run_ids[i] with the already locked slot slots[i]: new generation, worker,
-- times, slot, the latest checkpoint as recovery point. With start, a pending run also becomes
-- running in the same UPDATE (an attempt is counted, started_at set), as start_run would.
-- Returns the claimed rows in input order, or the run_id-NULL row that says nothing was claimable.
CREATE FUNCTION zeroth._lease_locked_runs(
    tenant_id text, workspace_key text, run_ids uuid[], slots integer[], worker_id text,
    at timestamptz, lease interval, active_count integer, concurrency_limit integer, start boolean)
    RETURNS SETOF zeroth.claimed_run
    LANGUAGE plpgsql VOLATILE
    SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_count integer;
BEGIN
    RETURN QUERY
    WITH wanted AS (
        SELECT w.run_id, w.position, _lease_locked_runs.slots[w.position] AS slot_no
          FROM unnest(_lease_locked_runs.run_ids) WITH ORDINALITY AS w(run_id, position)
    ), claimed AS (
        UPDATE zeroth.runs r
           SET lease_worker_id = _lease_locked_runs.worker_id,
               lease_acquired_at = _lease_locked_runs.at,
               lease_expires_at = _lease_locked_runs.at + _lease_locked_runs.lease,
               lease_generation = r.lease_generation + 1,
               admission_slot = w.slot_no,
               recovery_checkpoint_id = CASE WHEN r.checkpoint_seq > 0
                   THEN zeroth._latest_checkpoint_id(r.tenant_id, r.workspace_key, r.run_id) END,
               status = CASE WHEN _lease_locked_runs.start THEN 'running' ELSE r.status END,
               attempts = CASE WHEN _lease_locked_runs.start AND r.status = 'pending'
                               THEN r.attempts + 1 ELSE r.attempts END,
               started_at = CASE WHEN _lease_locked_runs.start AND r.status = 'pending'
                                 THEN _lease_locked_runs.at ELSE r.started_at END,
               updated_at = _lease_locked_runs.at
          FROM wanted w
         WHERE r.tenant_id = _lease_locked_runs.tenant_id
           AND r.workspace_key = _lease_locked_runs.workspace_key
           AND r.run_id = w.run_id
        RETURNING r.*, w.position
    ), slotted AS (
        UPDATE zeroth.admission_slots s
           SET run_id = c.run_id, lease_worker_id = c.lease_worker_id,
               lease_generation = c.lease_generation, lease_expires_at = c.lease_expires_at
          FROM claimed c
         WHERE s.tenant_id = c.tenant_id AND s.workspace_key = c.workspace_key
           AND s.deployment_ref = c.deployment_ref AND s.slot_no = c.admission_slot
        RETURNING s.slot_no
    )
    SELECT c.run_id, c.lease_generation, c.lease_expires_at, c.status, c.attempts, c.max_attempts,
           c.priority, c.thread_id, c.idempotency_key, c.payload, c.metadata, c.recovery_checkpoint_id,
           k.data, c.cancel_requested_at IS NOT NULL, _lease_locked_runs.active_count,
           false, _lease_locked_runs.concurrency_limit
      FROM claimed c
      LEFT JOIN zeroth.checkpoints k ON k.checkpoint_id = c.recovery_checkpoint_id
     ORDER BY c.position;

    GET DIAGNOSTICS v_count = ROW_COUNT;
    IF v_count = 0 THEN
        RETURN NEXT zeroth._claim_marker(_lease_locked_runs.active_count, false,
                                         _lease_locked_runs.concurrency_limit);
    END IF;
END
$$;
COMMENT ON FUNCTION zeroth._lease_locked_runs(text, text, uuid[], integer[], text, timestamptz, interval, integer, integer, boolean) IS 'Internal: lease runs (and slots) the caller already locked, and with start make pending ones running; the shared second half of claim_pending, claim_and_start and claim_orphaned.';

-- The nine-argument form stays for claim_orphaned (0004), which takes over runs that are running.
CREATE OR REPLACE FUNCTION zeroth._lease_locked_runs(
    tenant_id text, workspace_key text, run_ids uuid[], slots integer[], worker_id text,
    at timestamptz, lease interval, active_count integer, concurrency_limit integer)
    RETURNS SETOF zeroth.claimed_run
    LANGUAGE sql VOLATILE
    BEGIN ATOMIC
        SELECT * FROM zeroth._lease_locked_runs(tenant_id, workspace_key, run_ids, slots, worker_id,
                                                at, lease, active_count, concurrency_limit, false);
    END;
COMMENT ON FUNCTION zeroth._lease_locked_runs(text, text, uuid[], integer[], text, timestamptz, interval, integer, integer) IS 'Internal: lease runs (and slots) the caller already locked, status unchanged; used by claim_orphaned.';

-- The body of claim_pending and claim_and_start: take free admission slots (max_concurrency),
-- lock up to that many pending runs with SKIP LOCKED, lease them (and with start, make them
-- running). Locks: slot rows, then run rows, all FOR UPDATE SKIP LOCKED, so no claimer ever waits
-- on another. Raises ZP006, ZP008.
CREATE FUNCTION zeroth._claim_pending(
    deployment_ref text, worker_id text, tenant_id text, workspace_id text, max_concurrency integer,
    batch_size integer, lease_seconds double precision, now_override timestamptz, start boolean)
    RETURNS SETOF zeroth.claimed_run
    LANGUAGE plpgsql VOLATILE
    SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_now    timestamptz := zeroth._now(_claim_pending.now_override);
    v_lease  interval := zeroth._lease_interval(_claim_pending.lease_seconds);
    v_tenant text := zeroth._scope_tenant(_claim_pending.tenant_id, _claim_pending.workspace_id);
    v_wskey  text := zeroth._workspace_key(_claim_pending.workspace_id);
    v_want   integer := _claim_pending.batch_size;
    v_slots  integer[];
    v_active integer := 0;
    v_ids    uuid[];
BEGIN
    PERFORM zeroth._require_identifier(_claim_pending.deployment_ref, 'deployment_ref');
    PERFORM zeroth._require_identifier(_claim_pending.worker_id, 'worker_id');
    PERFORM zeroth._require(_claim_pending.batch_size BETWEEN 1 AND 1000, 'batch_size must be between 1 and 1000');
    PERFORM zeroth._require(_claim_pending.max_concurrency IS NULL OR _claim_pending.max_concurrency >= 1,
                            'max_concurrency must be NULL or at least 1');

    IF _claim_pending.max_concurrency IS NOT NULL THEN
        IF v_tenant IS NULL THEN
            RAISE EXCEPTION 'distributed concurrency needs an exact scope: a workspace_id needs a tenant_id'
                USING ERRCODE = 'ZP006';
        END IF;
        SELECT t.slots, t.active_count INTO v_slots, v_active
          FROM zeroth._take_slots(v_tenant, v_wskey, _claim_pending.deployment_ref,
                                  _claim_pending.max_concurrency, _claim_pending.batch_size, v_now) AS t;
        IF cardinality(v_slots) = 0 THEN
            RETURN NEXT zeroth._claim_marker(v_active, true, _claim_pending.max_concurrency);
            RETURN;
        END IF;
        v_want := cardinality(v_slots);
    END IF;

    -- Lock first (SKIP LOCKED: never wait on another claimer), then lease what was locked.
    WITH locked AS MATERIALIZED (
        SELECT r.run_id, r.priority, r.run_after, r.created_at
          FROM zeroth.runs r
         WHERE r.tenant_id = v_tenant
           AND r.workspace_key = v_wskey
           AND r.deployment_ref = _claim_pending.deployment_ref
           AND r.status = 'pending'
           AND r.run_after <= v_now
           AND (r.lease_expires_at IS NULL OR r.lease_expires_at < v_now)
         ORDER BY r.priority DESC, r.run_after, r.created_at
         LIMIT v_want
           FOR UPDATE SKIP LOCKED
    )
    SELECT coalesce(array_agg(l.run_id ORDER BY l.priority DESC, l.run_after, l.created_at), '{}') INTO v_ids FROM locked l;
    RETURN QUERY SELECT * FROM zeroth._lease_locked_runs(
        v_tenant, v_wskey, v_ids, v_slots, _claim_pending.worker_id, v_now, v_lease, v_active,
        _claim_pending.max_concurrency, _claim_pending.start);
END
$$;
COMMENT ON FUNCTION zeroth._claim_pending(text, text, text, text, integer, integer, double precision, timestamptz, boolean) IS 'Internal: the body of claim_pending (start false) and claim_and_start (start true).';

-- claim_pending: lease up to batch_size pending runs (status stays pending until start_run).
-- Order: priority DESC, run_after, created_at; only runs whose run_after has passed and that hold
-- no live lease. With max_concurrency, free admission slots are taken first with SKIP LOCKED (no
-- claimer waits on another); none free → one row with run_id NULL and concurrency_saturated.
-- Locks: slot rows, then run rows, all FOR UPDATE SKIP LOCKED. Bumps lease_generation per claim.
-- Raises ZP006 (max_concurrency in an impossible scope), ZP008. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.claim_pending(
    deployment_ref  text,
    worker_id       text,
    tenant_id       text             DEFAULT NULL,
    workspace_id    text             DEFAULT NULL,
    max_concurrency integer          DEFAULT NULL,
    batch_size      integer          DEFAULT 1,
    lease_seconds   double precision DEFAULT 60,
    now_override    timestamptz      DEFAULT NULL)
    RETURNS SETOF zeroth.claimed_run
    LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    BEGIN ATOMIC
        SELECT * FROM zeroth._claim_pending(deployment_ref, worker_id, tenant_id, workspace_id,
                                            max_concurrency, batch_size, lease_seconds, now_override,
                                            false);
    END;
COMMENT ON FUNCTION zeroth.claim_pending(text, text, text, text, integer, integer, double precision, timestamptz) IS
'claim_pending: lease up to batch_size pending runs (status stays pending; start_run makes it running). Order: priority DESC, run_after, created_at. With max_concurrency, takes free admission slots with SKIP LOCKED (claimers never queue on one row); a single run_id-NULL row reports saturation or an empty queue. Bumps lease_generation. Raises ZP006, ZP008. Time: clock_timestamp().';

-- claim_and_start: claim_pending, and every claimed run is running when the call returns —
-- attempts counted and started_at set, in the claiming UPDATE (no start_run round trip). Same
-- order, arguments, saturation row and locks as claim_pending. Raises ZP006, ZP008.
-- Time: clock_timestamp().
CREATE FUNCTION zeroth.claim_and_start(
    deployment_ref  text,
    worker_id       text,
    tenant_id       text             DEFAULT NULL,
    workspace_id    text             DEFAULT NULL,
    max_concurrency integer          DEFAULT NULL,
    batch_size      integer          DEFAULT 1,
    lease_seconds   double precision DEFAULT 60,
    now_override    timestamptz      DEFAULT NULL)
    RETURNS SETOF zeroth.claimed_run
    LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    BEGIN ATOMIC
        SELECT * FROM zeroth._claim_pending(deployment_ref, worker_id, tenant_id, workspace_id,
                                            max_concurrency, batch_size, lease_seconds, now_override,
                                            true);
    END;
COMMENT ON FUNCTION zeroth.claim_and_start(text, text, text, text, integer, integer, double precision, timestamptz) IS
'claim_and_start: claim_pending and start_run in one call — up to batch_size pending runs are leased (new generation) and made running (attempt counted, started_at set) by one UPDATE. Same order, max_concurrency slots, saturation row and SKIP LOCKED locking as claim_pending. Raises ZP006, ZP008. Time: clock_timestamp().';

-- ---------------------------------------------------------------------------------------------
-- Batched completion and renewal, both locking in run_id order
-- ---------------------------------------------------------------------------------------------

-- Checks the (run_ids, generations) arrays of a batch call: same length, no NULL, no repeated
-- run, at most 1000 entries (one statement's worth). Raises ZP008.
CREATE FUNCTION zeroth._require_lease_batch(run_ids uuid[], generations bigint[]) RETURNS void
    LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM zeroth._require(run_ids IS NOT NULL AND generations IS NOT NULL
                            AND cardinality(run_ids) = cardinality(generations),
                            'run_ids and generations must be arrays of the same length');
    PERFORM zeroth._require(array_position(run_ids, NULL) IS NULL
                            AND array_position(generations, NULL) IS NULL,
                            'run_ids and generations must not contain NULL');
    PERFORM zeroth._require(cardinality(run_ids) <= 1000, 'at most 1000 runs per call');
    PERFORM zeroth._require(cardinality(run_ids) = (SELECT count(DISTINCT u) FROM unnest(run_ids) AS u),
                            'run_ids must not repeat a run');
END
$$;
COMMENT ON FUNCTION zeroth._require_lease_batch(uuid[], bigint[]) IS 'Internal: ZP008 unless run_ids and generations are equal-length, NULL-free, at most 1000 long, without a repeated run.';

-- complete_runs: complete_run for a batch of one worker's runs. runs[i] = (run_ids[i],
-- generations[i]) completes only while that exact lease is live, held by worker_id, and the run is
-- running; outputs[i] as in complete_run (SQL NULL — or no outputs array — keeps the output written
-- with commit_fenced, JSON null clears it). Returns one row per requested run, in input order,
-- with completed = false for a refused one (fenced out, or not running: complete_run explains
-- which). Locks: the admission slots, then the runs, each in run_id order. Raises ZP008.
-- Notifies zeroth_wakeup once per deployment when concurrency slots were freed.
-- Time: clock_timestamp().
CREATE FUNCTION zeroth.complete_runs(
    worker_id    text,
    run_ids      uuid[],
    generations  bigint[],
    outputs      jsonb[]     DEFAULT NULL,
    tenant_id    text        DEFAULT NULL,
    workspace_id text        DEFAULT NULL,
    now_override timestamptz DEFAULT NULL)
    RETURNS TABLE (run_id uuid, completed boolean)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_now        timestamptz := zeroth._now(complete_runs.now_override);
    v_tenant     text := zeroth._scope_tenant(complete_runs.tenant_id, complete_runs.workspace_id);
    v_wskey      text := zeroth._workspace_key(complete_runs.workspace_id);
    v_done       uuid[];
    v_freed_deps text[];
BEGIN
    PERFORM zeroth._require_identifier(complete_runs.worker_id, 'worker_id');
    PERFORM zeroth._require_lease_batch(complete_runs.run_ids, complete_runs.generations);
    PERFORM zeroth._require(complete_runs.outputs IS NULL
                            OR cardinality(complete_runs.outputs) = cardinality(complete_runs.run_ids),
                            'outputs must be NULL or as long as run_ids');

    -- Slot rows first, in run_id order (renew_leases takes them in the same order).
    PERFORM 1
       FROM zeroth.admission_slots s
       JOIN unnest(complete_runs.run_ids, complete_runs.generations) AS q(run_id, generation)
         ON s.run_id = q.run_id AND s.lease_generation = q.generation
      WHERE s.tenant_id = v_tenant AND s.workspace_key = v_wskey
        AND s.lease_worker_id = complete_runs.worker_id
        AND s.lease_expires_at >= v_now
      ORDER BY s.run_id
        FOR UPDATE OF s;

    -- The run rows are found by primary key (run_id = ANY: an index condition, whatever the
    -- statistics say). No predicate here or in the UPDATE names the status, so the planner cannot
    -- prefer runs_running_idx (every running run of the scope, scanned once per requested run when
    -- its row estimate is stale); the status comes from the locked row.
    WITH requested AS (
        SELECT q.run_id, q.generation, complete_runs.outputs[q.position] AS output
          FROM unnest(complete_runs.run_ids, complete_runs.generations)
               WITH ORDINALITY AS q(run_id, generation, position)
    ), locked AS MATERIALIZED (
        SELECT r.run_id, r.status
          FROM zeroth.runs r
          JOIN requested q ON r.run_id = q.run_id AND r.lease_generation = q.generation
         WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey
           AND r.run_id = ANY (complete_runs.run_ids)
           AND r.lease_worker_id = complete_runs.worker_id
           AND r.lease_expires_at >= v_now
         ORDER BY r.run_id
           FOR UPDATE OF r
    ), done AS (
        UPDATE zeroth.runs r
           SET status = 'completed',
               output = CASE WHEN q.output IS NULL THEN r.output
                             ELSE nullif(q.output, 'null'::jsonb) END,
               finished_at = v_now,
               updated_at = v_now,
               lease_worker_id = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
               admission_slot = NULL, recovery_checkpoint_id = NULL
          FROM locked l
          JOIN requested q ON q.run_id = l.run_id
         WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey AND r.run_id = l.run_id
           AND l.status = 'running'
           AND r.lease_worker_id = complete_runs.worker_id
           AND r.lease_generation = q.generation
           AND r.lease_expires_at >= v_now
        RETURNING r.run_id, q.generation
    ), freed AS (
        UPDATE zeroth.admission_slots s
           SET run_id = NULL, lease_worker_id = NULL, lease_generation = NULL, lease_expires_at = NULL
          FROM done d
         WHERE s.run_id = d.run_id
           AND s.tenant_id = v_tenant AND s.workspace_key = v_wskey
           AND s.lease_worker_id = complete_runs.worker_id
           AND s.lease_generation = d.generation
        RETURNING s.deployment_ref
    )
    SELECT (SELECT coalesce(array_agg(d.run_id), '{}') FROM done d),
           (SELECT coalesce(array_agg(DISTINCT f.deployment_ref), '{}') FROM freed f)
      INTO v_done, v_freed_deps;

    PERFORM zeroth._notify_wakeup(d.deployment_ref, v_tenant, complete_runs.workspace_id)
       FROM unnest(v_freed_deps) AS d(deployment_ref);

    RETURN QUERY
    SELECT q.run_id, q.run_id = ANY (v_done)
      FROM unnest(complete_runs.run_ids) WITH ORDINALITY AS q(run_id, position)
     ORDER BY q.position;
END
$$;
COMMENT ON FUNCTION zeroth.complete_runs(text, uuid[], bigint[], jsonb[], text, text, timestamptz) IS
'complete_runs: complete_run for a batch of one worker''s runs in one statement; run_ids[i] completes only while generations[i] is live, held by worker_id and running; outputs[i] as complete_run''s output. One row per requested run in input order, completed = false when refused. Locks slots then runs, each in run_id order. Raises ZP008. Notifies zeroth_wakeup (once per deployment) when slots were freed. Time: clock_timestamp().';

-- renew_leases: one call renews all of a worker's leases. run_ids[i] is renewed only while
-- generations[i] is live and held by worker_id. Returns one row per requested run with the new
-- expiry and whether a cancel was requested, so a worker learns of losses and cancels together.
-- Locks: the slots, then the runs, each in run_id order (as complete_runs). Raises ZP008 (arrays
-- of different lengths, NULLs). Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.renew_leases(
    worker_id     text,
    run_ids       uuid[],
    generations   bigint[],
    tenant_id     text             DEFAULT NULL,
    workspace_id  text             DEFAULT NULL,
    lease_seconds double precision DEFAULT 60,
    now_override  timestamptz      DEFAULT NULL)
    RETURNS SETOF zeroth.lease_renewal
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now        timestamptz := zeroth._now(now_override);
    v_expires    timestamptz := v_now + zeroth._lease_interval(renew_leases.lease_seconds);
    v_tenant     text := zeroth._scope_tenant(renew_leases.tenant_id, renew_leases.workspace_id);
    v_wskey      text := zeroth._workspace_key(renew_leases.workspace_id);
    v_slot_runs  uuid[];
BEGIN
    PERFORM zeroth._require_identifier(renew_leases.worker_id, 'worker_id');
    PERFORM zeroth._require(renew_leases.run_ids IS NOT NULL AND renew_leases.generations IS NOT NULL
                            AND cardinality(renew_leases.run_ids) = cardinality(renew_leases.generations),
                            'run_ids and generations must be arrays of the same length');
    PERFORM zeroth._require(array_position(renew_leases.run_ids, NULL) IS NULL
                            AND array_position(renew_leases.generations, NULL) IS NULL,
                            'run_ids and generations must not contain NULL');

    WITH locked AS MATERIALIZED (
        SELECT s.tenant_id, s.workspace_key, s.deployment_ref, s.slot_no
          FROM zeroth.admission_slots s
          JOIN unnest(renew_leases.run_ids, renew_leases.generations) AS q(run_id, generation)
            ON s.run_id = q.run_id AND s.lease_generation = q.generation
         WHERE s.tenant_id = v_tenant AND s.workspace_key = v_wskey
           AND s.lease_worker_id = renew_leases.worker_id
           AND s.lease_expires_at >= v_now
         ORDER BY s.run_id
           FOR UPDATE OF s
    ), renewed AS (
        UPDATE zeroth.admission_slots s
           SET lease_expires_at = v_expires
          FROM locked l
         WHERE s.tenant_id = l.tenant_id AND s.workspace_key = l.workspace_key
           AND s.deployment_ref = l.deployment_ref AND s.slot_no = l.slot_no
        RETURNING s.run_id
    )
    SELECT coalesce(array_agg(x.run_id), '{}') INTO v_slot_runs FROM renewed x;

    RETURN QUERY
    WITH requested AS (
        SELECT q.run_id, q.generation, q.position
          FROM unnest(renew_leases.run_ids, renew_leases.generations) WITH ORDINALITY AS q(run_id, generation, position)
    ), locked AS MATERIALIZED (
        SELECT r.run_id
          FROM zeroth.runs r
          JOIN requested q ON r.run_id = q.run_id AND r.lease_generation = q.generation
         WHERE r.tenant_id = v_tenant
           AND r.workspace_key = v_wskey
           AND r.lease_worker_id = renew_leases.worker_id
           AND r.lease_expires_at >= v_now
           AND (r.admission_slot IS NULL OR r.run_id = ANY (v_slot_runs))
         ORDER BY r.run_id
           FOR UPDATE OF r
    ), renewed AS (
        UPDATE zeroth.runs r
           SET lease_expires_at = v_expires
          FROM locked l
         WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey AND r.run_id = l.run_id
           AND r.lease_worker_id = renew_leases.worker_id
           AND r.lease_expires_at >= v_now
        RETURNING r.run_id, r.lease_generation, r.lease_expires_at, r.cancel_requested_at
    )
    SELECT q.run_id, n.run_id IS NOT NULL, n.lease_expires_at,
           coalesce(n.cancel_requested_at IS NOT NULL, false)
      FROM requested q
      LEFT JOIN renewed n ON n.run_id = q.run_id AND n.lease_generation = q.generation
     ORDER BY q.position;
END
$$;
COMMENT ON FUNCTION zeroth.renew_leases(text, uuid[], bigint[], text, text, double precision, timestamptz) IS
'renew_leases: batch renew_lease for one worker; run_ids[i] is renewed only while generations[i] is live and held by worker_id. One row per requested run (renewed, new expiry, cancel_requested), in input order. Locks slots then runs, each in run_id order. Raises ZP008. Time: clock_timestamp().';

-- ---------------------------------------------------------------------------------------------
-- Ownership and grants (as 0006): new functions belong to zeroth_owner, PUBLIC may not run them.
-- ---------------------------------------------------------------------------------------------

ALTER FUNCTION zeroth._lease_locked_runs(text, text, uuid[], integer[], text, timestamptz, interval, integer, integer, boolean)
    OWNER TO zeroth_owner;
ALTER FUNCTION zeroth._claim_pending(text, text, text, text, integer, integer, double precision, timestamptz, boolean)
    OWNER TO zeroth_owner;
ALTER FUNCTION zeroth._require_lease_batch(uuid[], bigint[]) OWNER TO zeroth_owner;
ALTER FUNCTION zeroth.claim_and_start(text, text, text, text, integer, integer, double precision, timestamptz)
    OWNER TO zeroth_owner;
ALTER FUNCTION zeroth.complete_runs(text, uuid[], bigint[], jsonb[], text, text, timestamptz) OWNER TO zeroth_owner;

REVOKE EXECUTE ON FUNCTION
    zeroth._lease_locked_runs(text, text, uuid[], integer[], text, timestamptz, interval, integer, integer, boolean),
    zeroth._claim_pending(text, text, text, text, integer, integer, double precision, timestamptz, boolean),
    zeroth._require_lease_batch(uuid[], bigint[]),
    zeroth.claim_and_start(text, text, text, text, integer, integer, double precision, timestamptz),
    zeroth.complete_runs(text, uuid[], bigint[], jsonb[], text, text, timestamptz)
    FROM PUBLIC;

GRANT EXECUTE ON FUNCTION zeroth.claim_and_start, zeroth.complete_runs TO zeroth_worker;
