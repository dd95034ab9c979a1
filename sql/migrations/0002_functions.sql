-- 0002_functions: every transition of a run as one PL/pgSQL function in schema zeroth.
--
-- Rules that hold for every function here (sql/README.md has the full list):
--   * Database time only: v_now := zeroth._now(now_override), sampled once per call.
--     clock_timestamp() rather than now() because a caller may run several calls in one
--     transaction; now_override exists for tests and must not be passed in production.
--   * The fence is in the predicate: lease_worker_id + lease_generation + lease_expires_at >= v_now
--     sit in the WHERE of the UPDATE that writes, never in a read before it.
--   * Scope fails closed: tenant_id NULL with a workspace matches nothing; NULL workspace is real.
--   * Lock order: admission_slots row(s) before the runs row, in every function that may wait.
--     The claims take both with SKIP LOCKED and never wait, so no two sessions can deadlock.
--   * Errors use SQLSTATE class ZP; routine outcomes (nothing claimed, fenced out) are return values.

-- ---------------------------------------------------------------------------------------------
-- Result types
-- ---------------------------------------------------------------------------------------------

CREATE TYPE zeroth.claimed_run AS (
    run_id                 uuid,
    lease_generation       bigint,
    lease_expires_at       timestamptz,
    status                 zeroth.run_status,
    attempts               integer,
    max_attempts           integer,
    priority               integer,
    thread_id              text,
    idempotency_key        text,
    payload                jsonb,
    metadata               jsonb,
    recovery_checkpoint_id uuid,
    checkpoint_data        jsonb,
    cancel_requested       boolean,
    active_count           integer,
    concurrency_saturated  boolean,
    concurrency_limit      integer
);
COMMENT ON TYPE zeroth.claimed_run IS 'A row of claim_pending / claim_orphaned: one per claimed run, or a single row with run_id NULL that carries only the saturation the call observed.';

CREATE TYPE zeroth.enqueued_run AS (
    run_id  uuid,
    created boolean,
    status  zeroth.run_status
);
COMMENT ON TYPE zeroth.enqueued_run IS 'Result of enqueue_run(s): created is false when an idempotency key or caller-chosen run_id matched an existing run, which is returned instead.';

CREATE TYPE zeroth.lease_renewal AS (
    run_id           uuid,
    renewed          boolean,
    lease_expires_at timestamptz,
    cancel_requested boolean
);
COMMENT ON TYPE zeroth.lease_renewal IS 'Result row of renew_leases: one per requested (run_id, generation).';

-- ---------------------------------------------------------------------------------------------
-- Internal helpers (names start with an underscore; not part of the public API)
-- ---------------------------------------------------------------------------------------------

-- Database time. now_override is a test hook: it is refused unless the session (or database, or
-- role) sets zeroth.allow_now_override = on, so no worker can bring its own clock into a lease
-- decision in production.
CREATE FUNCTION zeroth._now(now_override timestamptz) RETURNS timestamptz
    LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF now_override IS NULL THEN
        RETURN clock_timestamp();
    END IF;
    IF coalesce(current_setting('zeroth.allow_now_override', true), '') <> 'on' THEN
        RAISE EXCEPTION 'now_override is a test hook; it needs zeroth.allow_now_override = on'
            USING ERRCODE = 'ZP008';
    END IF;
    IF NOT isfinite(now_override) THEN
        RAISE EXCEPTION 'now_override must be a finite timestamp' USING ERRCODE = 'ZP008';
    END IF;
    RETURN now_override;
END
$$;
COMMENT ON FUNCTION zeroth._now(timestamptz) IS 'Internal: clock_timestamp(), or a finite now_override when the test hook zeroth.allow_now_override = on (ZP008 otherwise).';

-- Seed scope rule (seed-spec §4): tenant NULL means 'default' unless a workspace is named, in which
-- case the scope is impossible and NULL is returned, so `tenant_id = NULL` matches nothing.
CREATE FUNCTION zeroth._scope_tenant(tenant_id text, workspace_id text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN CASE WHEN tenant_id IS NULL AND workspace_id IS NOT NULL THEN NULL
                ELSE coalesce(tenant_id, 'default') END;
COMMENT ON FUNCTION zeroth._scope_tenant(text, text) IS 'Internal: effective tenant of a call (NULL = the call can match nothing).';

CREATE FUNCTION zeroth._lease_interval(lease_seconds double precision) RETURNS interval
    LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF lease_seconds IS NULL OR lease_seconds = 'NaN'::float8 OR lease_seconds <= 0 OR lease_seconds > 86400 THEN
        RAISE EXCEPTION 'lease_seconds must be in (0, 86400], got %', coalesce(lease_seconds::text, 'NULL')
            USING ERRCODE = 'ZP008';
    END IF;
    RETURN make_interval(secs => lease_seconds);
END
$$;
COMMENT ON FUNCTION zeroth._lease_interval(double precision) IS 'Internal: validates a lease duration in seconds (ZP008 unless 0 < s <= 86400).';

CREATE FUNCTION zeroth._require(condition boolean, message text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF condition IS NOT TRUE THEN
        RAISE EXCEPTION '%', message USING ERRCODE = 'ZP008';
    END IF;
END
$$;
COMMENT ON FUNCTION zeroth._require(boolean, text) IS 'Internal: raises ZP008 invalid_argument with the message unless the condition is true.';

CREATE FUNCTION zeroth._require_identifier(value text, name text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF value IS NULL OR value = '' OR length(value) > 200 THEN
        RAISE EXCEPTION '% must be a non-empty string of at most 200 characters', name USING ERRCODE = 'ZP008';
    END IF;
END
$$;
COMMENT ON FUNCTION zeroth._require_identifier(text, text) IS 'Internal: ZP008 unless value is a non-empty identifier of at most 200 characters (keeps NOTIFY payloads far below 8000 bytes).';

-- Wakeups are hints. Postgres folds identical notifications within one transaction, so a batch
-- enqueue sends one notification per (deployment, tenant, workspace), and a later transaction
-- always notifies again.
CREATE FUNCTION zeroth._notify_wakeup(deployment_ref text, tenant_id text, workspace_id text) RETURNS void
    LANGUAGE sql VOLATILE
    BEGIN ATOMIC
        SELECT pg_notify('zeroth_wakeup', json_build_object(
            'deployment_ref', deployment_ref, 'tenant_id', tenant_id, 'workspace_id', workspace_id)::text);
    END;
COMMENT ON FUNCTION zeroth._notify_wakeup(text, text, text) IS 'Internal: NOTIFY zeroth_wakeup with {deployment_ref, tenant_id, workspace_id}.';

CREATE FUNCTION zeroth._latest_checkpoint_id(tenant_id text, workspace_key text, run_id uuid) RETURNS uuid
    LANGUAGE sql STABLE
    RETURN (SELECT k.checkpoint_id
              FROM zeroth.checkpoints k
             WHERE k.tenant_id = _latest_checkpoint_id.tenant_id
               AND k.workspace_key = _latest_checkpoint_id.workspace_key
               AND k.run_id = _latest_checkpoint_id.run_id
             ORDER BY k.checkpoint_order DESC
             LIMIT 1);
COMMENT ON FUNCTION zeroth._latest_checkpoint_id(text, text, uuid) IS 'Internal: the checkpoint with the highest checkpoint_order of a run, or NULL.';

-- Takes up to `wanted` free admission slots of a scope with FOR UPDATE SKIP LOCKED, creating the
-- scope's K slot rows on first use. active_count is the number of slots holding a live lease.
-- The slot limit is also bounded by max_concurrency - active_count so that slots numbered above K
-- (left by a claimer that used a larger K) still count against a smaller K.
CREATE FUNCTION zeroth._take_slots(
    tenant_id text, workspace_key text, deployment_ref text, max_concurrency integer, wanted integer,
    at timestamptz, OUT slots integer[], OUT active_count integer)
    LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- The scope becomes slot rows: bound what would be written (K rows, indexed keys).
    PERFORM zeroth._require(_take_slots.max_concurrency <= 10000, 'max_concurrency must be at most 10000');
    PERFORM zeroth._require_identifier(_take_slots.tenant_id, 'tenant_id');
    PERFORM zeroth._require(length(_take_slots.workspace_key) <= 202,
                            'workspace_id must be at most 200 characters');
    -- First use of a scope (or a larger K): create the slot rows. Only one session may do it at a
    -- time, and the others must not wait for its transaction (an INSERT that conflicts with an
    -- uncommitted row waits), so the creator takes a non-blocking advisory lock; a session that
    -- misses it finds no free slot this time and reports saturation until the rows commit.
    IF NOT EXISTS (SELECT 1
                     FROM zeroth.admission_slots s
                    WHERE s.tenant_id = _take_slots.tenant_id
                      AND s.workspace_key = _take_slots.workspace_key
                      AND s.deployment_ref = _take_slots.deployment_ref
                      AND s.slot_no = _take_slots.max_concurrency)
       AND pg_try_advisory_xact_lock(hashtextextended(
               _take_slots.tenant_id || chr(31) || _take_slots.workspace_key || chr(31)
               || _take_slots.deployment_ref, 7230)) THEN
        INSERT INTO zeroth.admission_slots (tenant_id, workspace_key, deployment_ref, slot_no)
        SELECT _take_slots.tenant_id, _take_slots.workspace_key, _take_slots.deployment_ref, g.n
          FROM generate_series(1, _take_slots.max_concurrency) AS g(n)
        ON CONFLICT DO NOTHING;
    END IF;

    SELECT count(*) FILTER (WHERE s.run_id IS NOT NULL AND s.lease_expires_at >= _take_slots.at)
      INTO active_count
      FROM zeroth.admission_slots s
     WHERE s.tenant_id = _take_slots.tenant_id
       AND s.workspace_key = _take_slots.workspace_key
       AND s.deployment_ref = _take_slots.deployment_ref;

    -- A slot row locked by another session is being claimed or renewed right now: skip it.
    WITH free AS MATERIALIZED (
        SELECT s.slot_no
          FROM zeroth.admission_slots s
         WHERE s.tenant_id = _take_slots.tenant_id
           AND s.workspace_key = _take_slots.workspace_key
           AND s.deployment_ref = _take_slots.deployment_ref
           AND s.slot_no <= _take_slots.max_concurrency
           AND (s.run_id IS NULL OR s.lease_expires_at < _take_slots.at)
         ORDER BY s.slot_no
         LIMIT greatest(least(_take_slots.wanted, _take_slots.max_concurrency - active_count), 0)
           FOR UPDATE SKIP LOCKED
    )
    SELECT coalesce(array_agg(f.slot_no ORDER BY f.slot_no), '{}') INTO slots FROM free f;
END
$$;
COMMENT ON FUNCTION zeroth._take_slots(text, text, text, integer, integer, timestamptz) IS 'Internal: lock up to `wanted` free concurrency slots of a scope (SKIP LOCKED) and report the live-slot count.';

-- Frees the slot held by exactly (run, worker, generation) — with `at`, only while that lease is
-- live, so a fenced write that is about to be refused leaves the slot as it was. Lock order:
-- called before the run's UPDATE.
CREATE FUNCTION zeroth._free_slot(tenant_id text, workspace_key text, run_id uuid, worker_id text, generation bigint,
                                  at timestamptz DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    UPDATE zeroth.admission_slots s
       SET run_id = NULL, lease_worker_id = NULL, lease_generation = NULL, lease_expires_at = NULL
     WHERE s.run_id = _free_slot.run_id
       AND s.tenant_id = _free_slot.tenant_id
       AND s.workspace_key = _free_slot.workspace_key
       AND s.lease_worker_id = _free_slot.worker_id
       AND s.lease_generation = _free_slot.generation
       AND (_free_slot.at IS NULL OR s.lease_expires_at >= _free_slot.at);
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION zeroth._free_slot(text, text, uuid, text, bigint, timestamptz) IS 'Internal: release the admission slot held by exactly this (run, worker, generation); with at, only while that lease is live.';

-- Locks the slot row(s) held by (run, worker, generation) without changing them: the first step
-- of a give-back that may still be refused, so the slot is freed only once the run's UPDATE
-- matched, and slot rows are still locked before the run row.
CREATE FUNCTION zeroth._lock_slot(tenant_id text, workspace_key text, run_id uuid, worker_id text, generation bigint)
    RETURNS void
    LANGUAGE sql VOLATILE
    BEGIN ATOMIC
        SELECT 1 FROM zeroth.admission_slots s
         WHERE s.run_id = _lock_slot.run_id
           AND s.tenant_id = _lock_slot.tenant_id
           AND s.workspace_key = _lock_slot.workspace_key
           AND s.lease_worker_id = _lock_slot.worker_id
           AND s.lease_generation = _lock_slot.generation
           FOR UPDATE;
    END;
COMMENT ON FUNCTION zeroth._lock_slot(text, text, uuid, text, bigint) IS 'Internal: lock the admission slot held by exactly this (run, worker, generation), changing nothing.';

-- Raises ZP003 invalid_transition when the caller still holds a live lease but the run's status
-- does not allow the edge; returns quietly when the caller was simply fenced out. Called only after
-- a fenced UPDATE matched nothing, so the routine path pays no extra read.
CREATE FUNCTION zeroth._explain_fenced_miss(
    tenant_id text, workspace_key text, run_id uuid, worker_id text, generation bigint, at timestamptz,
    transition text, allowed zeroth.run_status[])
    RETURNS void
    LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_status zeroth.run_status;
BEGIN
    SELECT r.status INTO v_status
      FROM zeroth.runs r
     WHERE r.tenant_id = _explain_fenced_miss.tenant_id
       AND r.workspace_key = _explain_fenced_miss.workspace_key
       AND r.run_id = _explain_fenced_miss.run_id
       AND r.lease_worker_id = _explain_fenced_miss.worker_id
       AND r.lease_generation = _explain_fenced_miss.generation
       AND r.lease_expires_at >= _explain_fenced_miss.at;
    IF FOUND AND NOT v_status = ANY (allowed) THEN
        RAISE EXCEPTION '% needs a run in status %, run % is %', transition, allowed, run_id, v_status
            USING ERRCODE = 'ZP003';
    END IF;
END
$$;
COMMENT ON FUNCTION zeroth._explain_fenced_miss(text, text, uuid, text, bigint, timestamptz, text, zeroth.run_status[]) IS 'Internal: after a fenced UPDATE matched nothing, raise ZP003 if the lease is still held (wrong status) rather than fenced out.';

-- ---------------------------------------------------------------------------------------------
-- Enqueue
-- ---------------------------------------------------------------------------------------------

-- enqueue_run: new → pending.
-- Inserts one run; a repeated idempotency key (per tenant, workspace and deployment) or a repeated
-- caller-chosen run_id returns the existing run with created = false instead of an error.
-- Locks: the unique-index entry only (a concurrent duplicate waits for the first to commit).
-- Raises ZP006 invalid_scope (workspace without tenant), ZP008 invalid_argument.
-- Notifies zeroth_wakeup when it creates a run. Time: clock_timestamp() (or now_override).
CREATE FUNCTION zeroth.enqueue_run(
    deployment_ref  text,
    payload         jsonb       DEFAULT '{}'::jsonb,
    tenant_id       text        DEFAULT NULL,
    workspace_id    text        DEFAULT NULL,
    priority        integer     DEFAULT 0,
    run_after       timestamptz DEFAULT NULL,
    max_attempts    integer     DEFAULT 3,
    idempotency_key text        DEFAULT NULL,
    metadata        jsonb       DEFAULT '{}'::jsonb,
    run_id          uuid        DEFAULT NULL,
    thread_id       text        DEFAULT NULL,
    now_override    timestamptz DEFAULT NULL)
    RETURNS zeroth.enqueued_run
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now    timestamptz := zeroth._now(now_override);
    v_tenant text := zeroth._scope_tenant(enqueue_run.tenant_id, enqueue_run.workspace_id);
    v_wskey  text := zeroth._workspace_key(enqueue_run.workspace_id);
    v_result zeroth.enqueued_run;
BEGIN
    IF v_tenant IS NULL THEN
        RAISE EXCEPTION 'a workspace_id needs a tenant_id' USING ERRCODE = 'ZP006';
    END IF;
    PERFORM zeroth._require_identifier(enqueue_run.deployment_ref, 'deployment_ref');
    PERFORM zeroth._require_identifier(v_tenant, 'tenant_id');
    IF enqueue_run.workspace_id IS NOT NULL THEN
        PERFORM zeroth._require_identifier(enqueue_run.workspace_id, 'workspace_id');
    END IF;
    PERFORM zeroth._require(jsonb_typeof(enqueue_run.payload) = 'object', 'payload must be a JSON object');
    PERFORM zeroth._require(jsonb_typeof(enqueue_run.metadata) = 'object', 'metadata must be a JSON object');
    PERFORM zeroth._require(enqueue_run.priority IS NOT NULL, 'priority must not be NULL');
    PERFORM zeroth._require(enqueue_run.max_attempts BETWEEN 1 AND 1000, 'max_attempts must be between 1 and 1000');
    PERFORM zeroth._require(enqueue_run.idempotency_key IS NULL
                            OR length(enqueue_run.idempotency_key) BETWEEN 1 AND 500,
                            'idempotency_key must be NULL or 1 to 500 characters');
    PERFORM zeroth._require(enqueue_run.run_after IS NULL OR isfinite(enqueue_run.run_after),
                            'run_after must be a finite timestamp');

    INSERT INTO zeroth.runs AS r (
        run_id, tenant_id, workspace_id, deployment_ref, thread_id, status, priority, run_after,
        max_attempts, created_at, updated_at, payload, metadata, idempotency_key)
    VALUES (
        coalesce(enqueue_run.run_id, gen_random_uuid()), v_tenant, enqueue_run.workspace_id,
        enqueue_run.deployment_ref, enqueue_run.thread_id, 'pending', enqueue_run.priority,
        coalesce(enqueue_run.run_after, v_now), enqueue_run.max_attempts, v_now, v_now,
        enqueue_run.payload, enqueue_run.metadata, enqueue_run.idempotency_key)
    ON CONFLICT DO NOTHING
    RETURNING r.run_id, true, r.status INTO v_result.run_id, v_result.created, v_result.status;

    IF FOUND THEN
        PERFORM zeroth._notify_wakeup(enqueue_run.deployment_ref, v_tenant, enqueue_run.workspace_id);
        RETURN v_result;
    END IF;

    -- A unique index said no: return the run that holds the key (or the caller's run_id).
    SELECT r.run_id, false, r.status INTO v_result.run_id, v_result.created, v_result.status
      FROM zeroth.runs r
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND ((enqueue_run.idempotency_key IS NOT NULL
             AND r.deployment_ref = enqueue_run.deployment_ref
             AND r.idempotency_key = enqueue_run.idempotency_key)
            OR r.run_id = enqueue_run.run_id)
     ORDER BY (r.run_id = enqueue_run.run_id) IS TRUE DESC
     LIMIT 1;
    RETURN v_result;
END
$$;
COMMENT ON FUNCTION zeroth.enqueue_run(text, jsonb, text, text, integer, timestamptz, integer, text, jsonb, uuid, text, timestamptz) IS
'enqueue_run: new → pending. Inserts one run; a repeated idempotency key (per tenant, workspace, deployment) or caller-chosen run_id returns the existing run with created = false. Raises ZP006 invalid_scope, ZP008 invalid_argument. Notifies zeroth_wakeup. Time: clock_timestamp().';

-- enqueue_runs: batch form of enqueue_run for one deployment and scope, in one transaction.
-- runs is a JSON array of objects with optional keys payload, priority, run_after, max_attempts,
-- idempotency_key, metadata, run_id, thread_id. Results come back in input order (ordinality).
-- Raises ZP006, ZP008 (the whole batch is rejected). Notifies zeroth_wakeup once per transaction.
CREATE FUNCTION zeroth.enqueue_runs(
    deployment_ref text,
    runs           jsonb,
    tenant_id      text        DEFAULT NULL,
    workspace_id   text        DEFAULT NULL,
    now_override   timestamptz DEFAULT NULL)
    RETURNS TABLE (ordinality bigint, run_id uuid, created boolean, status zeroth.run_status)
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_item    jsonb;
    v_index   bigint := 0;
    v_result  zeroth.enqueued_run;
    v_results zeroth.enqueued_run[];
    v_unknown text;
BEGIN
    -- The shared arguments are checked up front so an empty batch validates them too.
    IF zeroth._scope_tenant(enqueue_runs.tenant_id, enqueue_runs.workspace_id) IS NULL THEN
        RAISE EXCEPTION 'a workspace_id needs a tenant_id' USING ERRCODE = 'ZP006';
    END IF;
    PERFORM zeroth._require_identifier(enqueue_runs.deployment_ref, 'deployment_ref');
    PERFORM zeroth._require_identifier(coalesce(enqueue_runs.tenant_id, 'default'), 'tenant_id');
    IF enqueue_runs.workspace_id IS NOT NULL THEN
        PERFORM zeroth._require_identifier(enqueue_runs.workspace_id, 'workspace_id');
    END IF;
    PERFORM zeroth._require(jsonb_typeof(enqueue_runs.runs) = 'array', 'runs must be a JSON array');
    PERFORM zeroth._require(jsonb_array_length(enqueue_runs.runs) <= 10000, 'runs may hold at most 10000 items');
    -- Items are inserted in (idempotency_key, run_id) order, so two batches that share keys wait
    -- on each other in the same order and cannot deadlock; results still come back in input order.
    v_results := array_fill(NULL::zeroth.enqueued_run, ARRAY[jsonb_array_length(enqueue_runs.runs)]);
    FOR v_item, v_index IN
        SELECT e.item, e.position
          FROM jsonb_array_elements(enqueue_runs.runs) WITH ORDINALITY AS e(item, position)
         ORDER BY e.item ->> 'idempotency_key', e.item ->> 'run_id', e.position
    LOOP
        PERFORM zeroth._require(jsonb_typeof(v_item) = 'object', format('runs[%s] must be a JSON object', v_index));
        SELECT k INTO v_unknown FROM jsonb_object_keys(v_item) AS k
         WHERE k NOT IN ('payload', 'priority', 'run_after', 'max_attempts', 'idempotency_key',
                         'metadata', 'run_id', 'thread_id')
         LIMIT 1;
        PERFORM zeroth._require(v_unknown IS NULL, format('runs[%s] has an unknown key %L', v_index, v_unknown));
        v_result := zeroth.enqueue_run(
            deployment_ref  => enqueue_runs.deployment_ref,
            payload         => coalesce(v_item -> 'payload', '{}'::jsonb),
            tenant_id       => enqueue_runs.tenant_id,
            workspace_id    => enqueue_runs.workspace_id,
            priority        => coalesce((v_item ->> 'priority')::integer, 0),
            run_after       => (v_item ->> 'run_after')::timestamptz,
            max_attempts    => coalesce((v_item ->> 'max_attempts')::integer, 3),
            idempotency_key => v_item ->> 'idempotency_key',
            metadata        => coalesce(v_item -> 'metadata', '{}'::jsonb),
            run_id          => (v_item ->> 'run_id')::uuid,
            thread_id       => v_item ->> 'thread_id',
            now_override    => enqueue_runs.now_override);
        v_results[v_index] := v_result;
    END LOOP;
    RETURN QUERY
    SELECT x.position, x.run_id, x.created, x.status
      FROM unnest(v_results) WITH ORDINALITY AS x(run_id, created, status, position)
     ORDER BY x.position;
EXCEPTION
    WHEN invalid_text_representation OR numeric_value_out_of_range OR invalid_datetime_format
         OR datetime_field_overflow THEN
        RAISE EXCEPTION 'runs[%]: %', v_index, SQLERRM USING ERRCODE = 'ZP008';
END
$$;
COMMENT ON FUNCTION zeroth.enqueue_runs(text, jsonb, text, text, timestamptz) IS
'enqueue_runs: batch enqueue_run for one deployment and scope; runs is a JSON array of objects (payload, priority, run_after, max_attempts, idempotency_key, metadata, run_id, thread_id). Results in input order. Raises ZP006, ZP008 and rejects the whole batch. Notifies zeroth_wakeup.';

-- ---------------------------------------------------------------------------------------------
-- Claims
-- ---------------------------------------------------------------------------------------------

-- Leases runs the caller has already locked (FOR UPDATE SKIP LOCKED) and, under
-- max_concurrency, pairs run_ids[i] with the already locked slot slots[i]. Shared by
-- claim_pending and claim_orphaned: new generation, worker, times, slot, and the latest checkpoint
-- as recovery point. Returns the claimed rows in input order, or the run_id-NULL row that says
-- the scan found nothing claimable.
CREATE FUNCTION zeroth._lease_locked_runs(
    tenant_id text, workspace_key text, run_ids uuid[], slots integer[], worker_id text,
    at timestamptz, lease interval, active_count integer, concurrency_limit integer)
    RETURNS SETOF zeroth.claimed_run
    LANGUAGE plpgsql VOLATILE AS $$
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
COMMENT ON FUNCTION zeroth._lease_locked_runs(text, text, uuid[], integer[], text, timestamptz, interval, integer, integer) IS 'Internal: lease runs (and slots) the caller already locked; the shared second half of claim_pending and claim_orphaned.';

CREATE FUNCTION zeroth._claim_marker(active_count integer, saturated boolean, concurrency_limit integer)
    RETURNS zeroth.claimed_run
    LANGUAGE sql IMMUTABLE
    RETURN ROW(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
               active_count, saturated, concurrency_limit)::zeroth.claimed_run;
COMMENT ON FUNCTION zeroth._claim_marker(integer, boolean, integer) IS 'Internal: the run_id-NULL row a claim returns when it claimed nothing, carrying the saturation it saw.';

-- claim_pending: lease up to batch_size pending runs (status stays pending until start_run).
-- Order: priority DESC, run_after, created_at; only runs whose run_after has passed and that hold
-- no live lease. With max_concurrency, free admission slots are taken first with SKIP LOCKED (no
-- claimer waits on another); none free → one row with run_id NULL and concurrency_saturated.
-- Locks: slot rows, then run rows, all FOR UPDATE SKIP LOCKED. Bumps lease_generation per claim.
-- Raises ZP006 (max_concurrency in an impossible scope), ZP008. Time: clock_timestamp().
CREATE FUNCTION zeroth.claim_pending(
    deployment_ref  text,
    worker_id       text,
    tenant_id       text             DEFAULT NULL,
    workspace_id    text             DEFAULT NULL,
    max_concurrency integer          DEFAULT NULL,
    batch_size      integer          DEFAULT 1,
    lease_seconds   double precision DEFAULT 60,
    now_override    timestamptz      DEFAULT NULL)
    RETURNS SETOF zeroth.claimed_run
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now    timestamptz := zeroth._now(now_override);
    v_lease  interval := zeroth._lease_interval(claim_pending.lease_seconds);
    v_tenant text := zeroth._scope_tenant(claim_pending.tenant_id, claim_pending.workspace_id);
    v_wskey  text := zeroth._workspace_key(claim_pending.workspace_id);
    v_want   integer := claim_pending.batch_size;
    v_slots  integer[];
    v_active integer := 0;
    v_ids    uuid[];
BEGIN
    PERFORM zeroth._require_identifier(claim_pending.deployment_ref, 'deployment_ref');
    PERFORM zeroth._require_identifier(claim_pending.worker_id, 'worker_id');
    PERFORM zeroth._require(claim_pending.batch_size BETWEEN 1 AND 1000, 'batch_size must be between 1 and 1000');
    PERFORM zeroth._require(claim_pending.max_concurrency IS NULL OR claim_pending.max_concurrency >= 1,
                            'max_concurrency must be NULL or at least 1');

    IF claim_pending.max_concurrency IS NOT NULL THEN
        IF v_tenant IS NULL THEN
            RAISE EXCEPTION 'distributed concurrency needs an exact scope: a workspace_id needs a tenant_id'
                USING ERRCODE = 'ZP006';
        END IF;
        SELECT t.slots, t.active_count INTO v_slots, v_active
          FROM zeroth._take_slots(v_tenant, v_wskey, claim_pending.deployment_ref,
                                  claim_pending.max_concurrency, claim_pending.batch_size, v_now) AS t;
        IF cardinality(v_slots) = 0 THEN
            RETURN NEXT zeroth._claim_marker(v_active, true, claim_pending.max_concurrency);
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
           AND r.deployment_ref = claim_pending.deployment_ref
           AND r.status = 'pending'
           AND r.run_after <= v_now
           AND (r.lease_expires_at IS NULL OR r.lease_expires_at < v_now)
         ORDER BY r.priority DESC, r.run_after, r.created_at
         LIMIT v_want
           FOR UPDATE SKIP LOCKED
    )
    SELECT coalesce(array_agg(l.run_id ORDER BY l.priority DESC, l.run_after, l.created_at), '{}') INTO v_ids FROM locked l;
    RETURN QUERY SELECT * FROM zeroth._lease_locked_runs(
        v_tenant, v_wskey, v_ids, v_slots, claim_pending.worker_id, v_now, v_lease, v_active,
        claim_pending.max_concurrency);
END
$$;
COMMENT ON FUNCTION zeroth.claim_pending(text, text, text, text, integer, integer, double precision, timestamptz) IS
'claim_pending: lease up to batch_size pending runs (status stays pending; start_run makes it running). Order: priority DESC, run_after, created_at. With max_concurrency, takes free admission slots with SKIP LOCKED (claimers never queue on one row); a single run_id-NULL row reports saturation or an empty queue. Bumps lease_generation. Raises ZP006, ZP008. Time: clock_timestamp().';

-- claim_orphaned: take over running runs whose lease expired (crashed or stalled owners).
-- Each claimed run gets a new generation and recovery_checkpoint_id = its latest checkpoint.
-- claim_limit bounds the batch (NULL = all, or the free slots under max_concurrency). With no free
-- slot it probes for one orphan: saturated = an orphan is waiting; (run_id NULL, not saturated) is
-- a definitive empty scan. Locks: slot rows then run rows, SKIP LOCKED. Raises ZP006, ZP008.
-- Notifies nothing (it is the recovery path itself). Time: clock_timestamp().
CREATE FUNCTION zeroth.claim_orphaned(
    deployment_ref  text,
    worker_id       text,
    tenant_id       text             DEFAULT NULL,
    workspace_id    text             DEFAULT NULL,
    max_concurrency integer          DEFAULT NULL,
    claim_limit     integer          DEFAULT NULL,
    lease_seconds   double precision DEFAULT 60,
    now_override    timestamptz      DEFAULT NULL)
    RETURNS SETOF zeroth.claimed_run
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now    timestamptz := zeroth._now(now_override);
    v_lease  interval := zeroth._lease_interval(claim_orphaned.lease_seconds);
    v_tenant text := zeroth._scope_tenant(claim_orphaned.tenant_id, claim_orphaned.workspace_id);
    v_wskey  text := zeroth._workspace_key(claim_orphaned.workspace_id);
    v_want   integer := claim_orphaned.claim_limit;
    v_slots  integer[];
    v_active integer := 0;
    v_ids    uuid[];
BEGIN
    PERFORM zeroth._require_identifier(claim_orphaned.deployment_ref, 'deployment_ref');
    PERFORM zeroth._require_identifier(claim_orphaned.worker_id, 'worker_id');
    PERFORM zeroth._require(claim_orphaned.claim_limit IS NULL OR claim_orphaned.claim_limit BETWEEN 1 AND 1000,
                            'claim_limit must be NULL or between 1 and 1000');
    PERFORM zeroth._require(claim_orphaned.max_concurrency IS NULL OR claim_orphaned.max_concurrency >= 1,
                            'max_concurrency must be NULL or at least 1');

    IF claim_orphaned.max_concurrency IS NOT NULL THEN
        IF v_tenant IS NULL THEN
            RAISE EXCEPTION 'distributed concurrency needs an exact scope: a workspace_id needs a tenant_id'
                USING ERRCODE = 'ZP006';
        END IF;
        SELECT t.slots, t.active_count INTO v_slots, v_active
          FROM zeroth._take_slots(v_tenant, v_wskey, claim_orphaned.deployment_ref,
                                  claim_orphaned.max_concurrency,
                                  least(coalesce(claim_orphaned.claim_limit, claim_orphaned.max_concurrency),
                                        claim_orphaned.max_concurrency),
                                  v_now) AS t;
        IF cardinality(v_slots) = 0 THEN
            -- Report saturation only when work is really blocked: is any orphan waiting?
            RETURN NEXT zeroth._claim_marker(v_active, EXISTS (
                SELECT 1 FROM zeroth.runs r
                 WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey
                   AND r.deployment_ref = claim_orphaned.deployment_ref
                   AND r.status = 'running' AND r.lease_expires_at < v_now),
                claim_orphaned.max_concurrency);
            RETURN;
        END IF;
        v_want := cardinality(v_slots);
    END IF;

    -- Lock first (SKIP LOCKED: never wait on another claimer), then lease what was locked.
    WITH locked AS MATERIALIZED (
        SELECT r.run_id, r.lease_expires_at, r.started_at
          FROM zeroth.runs r
         WHERE r.tenant_id = v_tenant
           AND r.workspace_key = v_wskey
           AND r.deployment_ref = claim_orphaned.deployment_ref
           AND r.status = 'running'
           AND r.lease_expires_at < v_now
         ORDER BY r.lease_expires_at, r.started_at
         LIMIT v_want
           FOR UPDATE SKIP LOCKED
    )
    SELECT coalesce(array_agg(l.run_id ORDER BY l.lease_expires_at, l.started_at), '{}') INTO v_ids FROM locked l;
    RETURN QUERY SELECT * FROM zeroth._lease_locked_runs(
        v_tenant, v_wskey, v_ids, v_slots, claim_orphaned.worker_id, v_now, v_lease, v_active,
        claim_orphaned.max_concurrency);
END
$$;
COMMENT ON FUNCTION zeroth.claim_orphaned(text, text, text, text, integer, integer, double precision, timestamptz) IS
'claim_orphaned: take over running runs whose lease expired; each gets a new generation and recovery_checkpoint_id = its latest checkpoint. claim_limit bounds the batch. A single run_id-NULL row reports saturation (an orphan is waiting but no slot is free) or a definitive empty scan. SKIP LOCKED throughout. Raises ZP006, ZP008. Time: clock_timestamp().';

-- ---------------------------------------------------------------------------------------------
-- Lease upkeep
-- ---------------------------------------------------------------------------------------------

-- renew_lease: extend a live lease held by (worker_id, generation). An expired lease is never
-- renewed, even when nobody took the run: admission counts only live leases, so this is what
-- prevents a slot from being resurrected after reallocation. generation NULL = owner only (seed
-- compatibility). Locks: the run's admission slot (if any), then the run row. Returns false when
-- refused. Raises ZP008. Notifies nothing. Time: clock_timestamp().
CREATE FUNCTION zeroth.renew_lease(
    run_id        uuid,
    worker_id     text,
    generation    bigint           DEFAULT NULL,
    tenant_id     text             DEFAULT NULL,
    workspace_id  text             DEFAULT NULL,
    lease_seconds double precision DEFAULT 60,
    now_override  timestamptz      DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now     timestamptz := zeroth._now(now_override);
    v_expires timestamptz := v_now + zeroth._lease_interval(renew_lease.lease_seconds);
    v_tenant  text := zeroth._scope_tenant(renew_lease.tenant_id, renew_lease.workspace_id);
    v_wskey   text := zeroth._workspace_key(renew_lease.workspace_id);
    v_slot_ok boolean;
BEGIN
    PERFORM zeroth._require(renew_lease.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(renew_lease.worker_id, 'worker_id');

    UPDATE zeroth.admission_slots s
       SET lease_expires_at = v_expires
     WHERE s.run_id = renew_lease.run_id
       AND s.tenant_id = v_tenant
       AND s.workspace_key = v_wskey
       AND s.lease_worker_id = renew_lease.worker_id
       AND (renew_lease.generation IS NULL OR s.lease_generation = renew_lease.generation)
       AND s.lease_expires_at >= v_now;
    v_slot_ok := FOUND;

    UPDATE zeroth.runs r
       SET lease_expires_at = v_expires
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = renew_lease.run_id
       AND r.lease_worker_id = renew_lease.worker_id
       AND (renew_lease.generation IS NULL OR r.lease_generation = renew_lease.generation)
       AND r.lease_expires_at >= v_now
       AND (r.admission_slot IS NULL OR v_slot_ok);
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION zeroth.renew_lease(uuid, text, bigint, text, text, double precision, timestamptz) IS
'renew_lease: extend a live lease held by (worker_id, generation); an expired lease is never renewed, even if untaken. generation NULL = owner only. Locks the run''s admission slot, then the run. Returns false when refused. Raises ZP008. Time: clock_timestamp().';

-- renew_leases: one call renews all of a worker's leases. run_ids[i] is renewed only while
-- generations[i] is live and held by worker_id. Returns one row per requested run with the new
-- expiry and whether a cancel was requested, so a worker learns of losses and cancels together.
-- Locks: the slots, then the runs. Raises ZP008 (arrays of different lengths, NULLs). Time:
-- clock_timestamp().
CREATE FUNCTION zeroth.renew_leases(
    worker_id     text,
    run_ids       uuid[],
    generations   bigint[],
    tenant_id     text             DEFAULT NULL,
    workspace_id  text             DEFAULT NULL,
    lease_seconds double precision DEFAULT 60,
    now_override  timestamptz      DEFAULT NULL)
    RETURNS SETOF zeroth.lease_renewal
    LANGUAGE plpgsql VOLATILE AS $$
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

    WITH requested AS (
        SELECT q.run_id, q.generation
          FROM unnest(renew_leases.run_ids, renew_leases.generations) AS q(run_id, generation)
    ), renewed AS (
        UPDATE zeroth.admission_slots s
           SET lease_expires_at = v_expires
          FROM requested q
         WHERE s.run_id = q.run_id
           AND s.tenant_id = v_tenant
           AND s.workspace_key = v_wskey
           AND s.lease_worker_id = renew_leases.worker_id
           AND s.lease_generation = q.generation
           AND s.lease_expires_at >= v_now
        RETURNING s.run_id
    )
    SELECT coalesce(array_agg(x.run_id), '{}') INTO v_slot_runs FROM renewed x;

    RETURN QUERY
    WITH requested AS (
        SELECT q.run_id, q.generation, q.position
          FROM unnest(renew_leases.run_ids, renew_leases.generations) WITH ORDINALITY AS q(run_id, generation, position)
    ), renewed AS (
        UPDATE zeroth.runs r
           SET lease_expires_at = v_expires
          FROM requested q
         WHERE r.tenant_id = v_tenant
           AND r.workspace_key = v_wskey
           AND r.run_id = q.run_id
           AND r.lease_worker_id = renew_leases.worker_id
           AND r.lease_generation = q.generation
           AND r.lease_expires_at >= v_now
           AND (r.admission_slot IS NULL OR r.run_id = ANY (v_slot_runs))
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
'renew_leases: batch renew_lease for one worker; run_ids[i] is renewed only while generations[i] is live and held by worker_id. One row per requested run (renewed, new expiry, cancel_requested), in input order. Raises ZP008. Time: clock_timestamp().';

-- current_generation / current_holder / get_recovery_checkpoint_id: scoped reads, no locks.
CREATE FUNCTION zeroth.current_generation(run_id uuid, tenant_id text DEFAULT NULL, workspace_id text DEFAULT NULL)
    RETURNS bigint
    LANGUAGE sql STABLE
    RETURN (SELECT r.lease_generation FROM zeroth.runs r
             WHERE r.tenant_id = zeroth._scope_tenant(current_generation.tenant_id, current_generation.workspace_id)
               AND r.workspace_key = zeroth._workspace_key(current_generation.workspace_id)
               AND r.run_id = current_generation.run_id);
COMMENT ON FUNCTION zeroth.current_generation(uuid, text, text) IS
'current_generation: the run''s lease generation (0 before its first claim), or NULL when no run has this id in this scope. Read only.';

CREATE FUNCTION zeroth.current_holder(run_id uuid, tenant_id text DEFAULT NULL, workspace_id text DEFAULT NULL)
    RETURNS text
    LANGUAGE sql STABLE
    RETURN (SELECT r.lease_worker_id FROM zeroth.runs r
             WHERE r.tenant_id = zeroth._scope_tenant(current_holder.tenant_id, current_holder.workspace_id)
               AND r.workspace_key = zeroth._workspace_key(current_holder.workspace_id)
               AND r.run_id = current_holder.run_id);
COMMENT ON FUNCTION zeroth.current_holder(uuid, text, text) IS
'current_holder: the worker id named in the run''s lease (live or expired but not yet taken over), or NULL. Read only.';

CREATE FUNCTION zeroth.get_recovery_checkpoint_id(run_id uuid, tenant_id text DEFAULT NULL, workspace_id text DEFAULT NULL)
    RETURNS uuid
    LANGUAGE sql STABLE
    RETURN (SELECT r.recovery_checkpoint_id FROM zeroth.runs r
             WHERE r.tenant_id = zeroth._scope_tenant(get_recovery_checkpoint_id.tenant_id, get_recovery_checkpoint_id.workspace_id)
               AND r.workspace_key = zeroth._workspace_key(get_recovery_checkpoint_id.workspace_id)
               AND r.run_id = get_recovery_checkpoint_id.run_id);
COMMENT ON FUNCTION zeroth.get_recovery_checkpoint_id(uuid, text, text) IS
'get_recovery_checkpoint_id: the checkpoint the current lease holder should resume from (set by a claim when the run has checkpoints), or NULL. Read only.';

-- ---------------------------------------------------------------------------------------------
-- Fenced writes by the lease holder
-- ---------------------------------------------------------------------------------------------

-- commit_fenced: write allowlisted run columns (output, error, metadata, progress) while holding
-- (worker_id, generation) with a live lease. Lease, fence, status and identity columns are never
-- writable, however spelled (ZP004); any other name is unknown (ZP005). No dynamic SQL: each
-- allowlisted column has its own CASE. Returns false when fenced out. Raises ZP004, ZP005, ZP008.
-- Locks: the run row. Time: clock_timestamp().
CREATE FUNCTION zeroth.commit_fenced(
    run_id       uuid,
    worker_id    text,
    generation   bigint,
    columns      jsonb,
    tenant_id    text        DEFAULT NULL,
    workspace_id text        DEFAULT NULL,
    now_override timestamptz DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now    timestamptz := zeroth._now(now_override);
    v_tenant text := zeroth._scope_tenant(commit_fenced.tenant_id, commit_fenced.workspace_id);
    v_wskey  text := zeroth._workspace_key(commit_fenced.workspace_id);
    v_key    text;
    v_name   text;
BEGIN
    PERFORM zeroth._require(commit_fenced.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(commit_fenced.worker_id, 'worker_id');
    PERFORM zeroth._require(commit_fenced.generation IS NOT NULL, 'generation must not be NULL');
    PERFORM zeroth._require(jsonb_typeof(commit_fenced.columns) = 'object' AND commit_fenced.columns <> '{}'::jsonb,
                            'columns must be a non-empty JSON object');
    FOR v_key IN SELECT k FROM jsonb_object_keys(commit_fenced.columns) AS k ORDER BY k LOOP
        -- Normalise the way an attacker would hope SQL does: case, quotes, whitespace.
        v_name := lower(btrim(v_key, E' \t\r\n"`'''));
        IF v_name IN ('lease_worker_id', 'lease_generation', 'lease_acquired_at', 'lease_expires_at',
                      'admission_slot', 'recovery_checkpoint_id', 'status', 'run_id', 'tenant_id',
                      'workspace_id', 'workspace_key', 'deployment_ref', 'attempts', 'max_attempts',
                      'created_at', 'updated_at', 'started_at', 'finished_at', 'cancel_action',
                      'cancel_requested_at', 'dead_lettered_at', 'checkpoint_seq', 'run_after',
                      'priority', 'idempotency_key', 'thread_id', 'wait_reason', 'payload') THEN
            RAISE EXCEPTION 'commit_fenced may not write lease, fence, status or identity column %', quote_literal(v_key)
                USING ERRCODE = 'ZP004';
        ELSIF v_key NOT IN ('output', 'error', 'metadata', 'progress') THEN
            RAISE EXCEPTION 'commit_fenced: unknown run column %; writable columns are output, error, metadata, progress',
                quote_literal(v_key) USING ERRCODE = 'ZP005';
        END IF;
    END LOOP;
    PERFORM zeroth._require(NOT commit_fenced.columns ? 'metadata'
                            OR jsonb_typeof(commit_fenced.columns -> 'metadata') = 'object',
                            'metadata must be a JSON object');

    UPDATE zeroth.runs r
       SET output   = CASE WHEN commit_fenced.columns ? 'output'
                           THEN nullif(commit_fenced.columns -> 'output', 'null'::jsonb) ELSE r.output END,
           error    = CASE WHEN commit_fenced.columns ? 'error'
                           THEN nullif(commit_fenced.columns -> 'error', 'null'::jsonb) ELSE r.error END,
           progress = CASE WHEN commit_fenced.columns ? 'progress'
                           THEN nullif(commit_fenced.columns -> 'progress', 'null'::jsonb) ELSE r.progress END,
           metadata = CASE WHEN commit_fenced.columns ? 'metadata'
                           THEN commit_fenced.columns -> 'metadata' ELSE r.metadata END,
           updated_at = v_now
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = commit_fenced.run_id
       AND r.lease_worker_id = commit_fenced.worker_id
       AND r.lease_generation = commit_fenced.generation
       AND r.lease_expires_at >= v_now;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION zeroth.commit_fenced(uuid, text, bigint, jsonb, text, text, timestamptz) IS
'commit_fenced: write allowlisted run columns (output, error, metadata, progress) only while (worker_id, generation) holds a live lease; the fence is in the UPDATE predicate. Lease/fence/status/identity columns raise ZP004 however spelled; other names raise ZP005. Returns false when fenced out. Raises ZP008. Time: clock_timestamp().';

-- start_run: pending → running, fenced. Counts an attempt. Idempotent for the holder of a running
-- run (a recovered run is already running), so a worker may call it on every drive.
-- Locks: the run row. Returns false when fenced out. Raises ZP008. Time: clock_timestamp().
CREATE FUNCTION zeroth.start_run(
    run_id       uuid,
    worker_id    text,
    generation   bigint,
    tenant_id    text        DEFAULT NULL,
    workspace_id text        DEFAULT NULL,
    now_override timestamptz DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now    timestamptz := zeroth._now(now_override);
    v_tenant text := zeroth._scope_tenant(start_run.tenant_id, start_run.workspace_id);
    v_wskey  text := zeroth._workspace_key(start_run.workspace_id);
BEGIN
    PERFORM zeroth._require(start_run.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(start_run.worker_id, 'worker_id');
    PERFORM zeroth._require(start_run.generation IS NOT NULL, 'generation must not be NULL');

    UPDATE zeroth.runs r
       SET status = 'running',
           attempts = CASE WHEN r.status = 'pending' THEN r.attempts + 1 ELSE r.attempts END,
           started_at = CASE WHEN r.status = 'pending' THEN v_now ELSE r.started_at END,
           updated_at = v_now
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = start_run.run_id
       AND r.lease_worker_id = start_run.worker_id
       AND r.lease_generation = start_run.generation
       AND r.lease_expires_at >= v_now
       AND r.status IN ('pending', 'running');
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION zeroth.start_run(uuid, text, bigint, text, text, timestamptz) IS
'start_run: pending → running for the live lease (worker_id, generation); counts an attempt and sets started_at. Idempotent for the holder of a running run. Returns false when fenced out. Raises ZP008. Time: clock_timestamp().';

-- save_checkpoint: append (or, with a known checkpoint_id, replace) a checkpoint of a running run,
-- fenced. The run row's checkpoint_seq and the checkpoint row are written in one call, so a refused
-- write leaves no checkpoint behind. Returns the checkpoint id, or NULL when fenced out.
-- Raises ZP003 (run not running), ZP007 (checkpoint_id of another run), ZP008. Time: clock_timestamp().
CREATE FUNCTION zeroth.save_checkpoint(
    run_id        uuid,
    worker_id     text,
    generation    bigint,
    data          jsonb,
    checkpoint_id uuid        DEFAULT NULL,
    tenant_id     text        DEFAULT NULL,
    workspace_id  text        DEFAULT NULL,
    now_override  timestamptz DEFAULT NULL)
    RETURNS uuid
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now    timestamptz := zeroth._now(now_override);
    v_tenant text := zeroth._scope_tenant(save_checkpoint.tenant_id, save_checkpoint.workspace_id);
    v_wskey  text := zeroth._workspace_key(save_checkpoint.workspace_id);
    v_seq    bigint;
    v_id     uuid;
BEGIN
    PERFORM zeroth._require(save_checkpoint.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(save_checkpoint.worker_id, 'worker_id');
    PERFORM zeroth._require(save_checkpoint.generation IS NOT NULL, 'generation must not be NULL');
    PERFORM zeroth._require(save_checkpoint.data IS NOT NULL, 'data must not be NULL');

    UPDATE zeroth.runs r
       SET checkpoint_seq = r.checkpoint_seq + 1,
           updated_at = v_now
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = save_checkpoint.run_id
       AND r.lease_worker_id = save_checkpoint.worker_id
       AND r.lease_generation = save_checkpoint.generation
       AND r.lease_expires_at >= v_now
       AND r.status = 'running'
    RETURNING r.checkpoint_seq INTO v_seq;
    IF NOT FOUND THEN
        PERFORM zeroth._explain_fenced_miss(v_tenant, v_wskey, save_checkpoint.run_id, save_checkpoint.worker_id,
                                            save_checkpoint.generation, v_now, 'save_checkpoint', '{running}');
        RETURN NULL;
    END IF;

    INSERT INTO zeroth.checkpoints AS k (checkpoint_id, tenant_id, workspace_key, run_id, checkpoint_order,
                                         lease_generation, data, created_at)
    VALUES (coalesce(save_checkpoint.checkpoint_id, gen_random_uuid()), v_tenant, v_wskey, save_checkpoint.run_id,
            v_seq, save_checkpoint.generation, save_checkpoint.data, v_now)
    ON CONFLICT ON CONSTRAINT checkpoints_pkey DO UPDATE
       SET data = excluded.data, checkpoint_order = excluded.checkpoint_order,
           lease_generation = excluded.lease_generation, created_at = excluded.created_at
     WHERE k.tenant_id = excluded.tenant_id AND k.workspace_key = excluded.workspace_key AND k.run_id = excluded.run_id
    RETURNING k.checkpoint_id INTO v_id;
    IF v_id IS NULL THEN
        RAISE EXCEPTION 'checkpoint % belongs to another run', save_checkpoint.checkpoint_id USING ERRCODE = 'ZP007';
    END IF;
    RETURN v_id;
END
$$;
COMMENT ON FUNCTION zeroth.save_checkpoint(uuid, text, bigint, jsonb, uuid, text, text, timestamptz) IS
'save_checkpoint: append a checkpoint (or replace one by checkpoint_id) of a running run, fenced by (worker_id, generation, live lease); run row and checkpoint written together. Returns the checkpoint id, or NULL when fenced out. Raises ZP003 (not running), ZP007 (checkpoint of another run), ZP008. Time: clock_timestamp().';

-- complete_run: running → completed, fenced; stores output (SQL NULL keeps what commit_fenced
-- wrote, JSON null clears it), clears the lease, frees the slot.
-- Locks: the admission slot, then the run. Returns false when fenced out. Raises ZP003 (holder but
-- not running), ZP008. Notifies zeroth_wakeup when a concurrency slot was freed. Time: clock_timestamp().
CREATE FUNCTION zeroth.complete_run(
    run_id       uuid,
    worker_id    text,
    generation   bigint,
    output       jsonb       DEFAULT NULL,
    tenant_id    text        DEFAULT NULL,
    workspace_id text        DEFAULT NULL,
    now_override timestamptz DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now      timestamptz := zeroth._now(now_override);
    v_tenant   text := zeroth._scope_tenant(complete_run.tenant_id, complete_run.workspace_id);
    v_wskey    text := zeroth._workspace_key(complete_run.workspace_id);
    v_freed    boolean;
    v_run      record;
BEGIN
    PERFORM zeroth._require(complete_run.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(complete_run.worker_id, 'worker_id');
    PERFORM zeroth._require(complete_run.generation IS NOT NULL, 'generation must not be NULL');

    v_freed := zeroth._free_slot(v_tenant, v_wskey, complete_run.run_id, complete_run.worker_id, complete_run.generation,
                                v_now);
    UPDATE zeroth.runs r
       SET status = 'completed',
           output = CASE WHEN complete_run.output IS NULL THEN r.output
                         ELSE nullif(complete_run.output, 'null'::jsonb) END,
           finished_at = v_now,
           updated_at = v_now,
           lease_worker_id = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
           admission_slot = NULL, recovery_checkpoint_id = NULL
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = complete_run.run_id
       AND r.lease_worker_id = complete_run.worker_id
       AND r.lease_generation = complete_run.generation
       AND r.lease_expires_at >= v_now
       AND r.status = 'running'
    RETURNING r.deployment_ref, r.workspace_id INTO v_run;
    IF NOT FOUND THEN
        PERFORM zeroth._explain_fenced_miss(v_tenant, v_wskey, complete_run.run_id, complete_run.worker_id,
                                            complete_run.generation, v_now, 'complete_run', '{running}');
        RETURN false;
    END IF;
    IF v_freed THEN
        PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_tenant, v_run.workspace_id);
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION zeroth.complete_run(uuid, text, bigint, jsonb, text, text, timestamptz) IS
'complete_run: running → completed for the live lease (worker_id, generation); stores output (SQL NULL keeps the committed output, JSON null clears it), clears the lease, frees the admission slot. Returns false when fenced out. Raises ZP003 (holder but not running), ZP008. Notifies zeroth_wakeup when a slot was freed. Time: clock_timestamp().';

-- fail_run: running → pending (retryable, attempts < max_attempts: run_after = now + exponential
-- backoff with jitter) or → failed (non-retryable), or → failed and dead-lettered (retryable but
-- attempts exhausted). Fenced; clears the lease and frees the slot. Returns 'retry_scheduled',
-- 'failed' or 'dead_lettered', or NULL when fenced out. Raises ZP003, ZP008. Notifies
-- zeroth_wakeup (a retry or a freed slot may make work claimable). Time: clock_timestamp().
CREATE FUNCTION zeroth.fail_run(
    run_id             uuid,
    worker_id          text,
    generation         bigint,
    error              jsonb            DEFAULT NULL,
    retryable          boolean          DEFAULT true,
    retry_base_seconds double precision DEFAULT 1,
    retry_max_seconds  double precision DEFAULT 300,
    tenant_id          text             DEFAULT NULL,
    workspace_id       text             DEFAULT NULL,
    now_override       timestamptz      DEFAULT NULL)
    RETURNS text
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now     timestamptz := zeroth._now(now_override);
    v_tenant  text := zeroth._scope_tenant(fail_run.tenant_id, fail_run.workspace_id);
    v_wskey   text := zeroth._workspace_key(fail_run.workspace_id);
    v_outcome text;
    v_deploy  text;
    v_ws      text;
BEGIN
    PERFORM zeroth._require(fail_run.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(fail_run.worker_id, 'worker_id');
    PERFORM zeroth._require(fail_run.generation IS NOT NULL, 'generation must not be NULL');
    PERFORM zeroth._require(fail_run.retryable IS NOT NULL, 'retryable must not be NULL');
    PERFORM zeroth._require(fail_run.retry_base_seconds >= 0 AND fail_run.retry_max_seconds >= fail_run.retry_base_seconds
                            AND fail_run.retry_max_seconds <= 86400 * 30,
                            'need 0 <= retry_base_seconds <= retry_max_seconds <= 30 days');

    PERFORM zeroth._free_slot(v_tenant, v_wskey, fail_run.run_id, fail_run.worker_id, fail_run.generation, v_now);
    -- SET expressions read the row as it was; RETURNING reads it as written, so the outcome is
    -- derived from what this UPDATE decided and nothing is read before the fenced write.
    UPDATE zeroth.runs r
       SET status = CASE WHEN fail_run.retryable AND r.attempts < r.max_attempts
                         THEN 'pending'::zeroth.run_status ELSE 'failed'::zeroth.run_status END,
           run_after = CASE WHEN fail_run.retryable AND r.attempts < r.max_attempts
                            -- Exponential backoff with equal jitter: half fixed, half random.
                            THEN v_now + make_interval(secs => least(
                                     fail_run.retry_max_seconds,
                                     fail_run.retry_base_seconds * power(2, greatest(r.attempts - 1, 0)::double precision))
                                 * (0.5 + random() / 2))
                            ELSE r.run_after END,
           finished_at = CASE WHEN fail_run.retryable AND r.attempts < r.max_attempts THEN NULL ELSE v_now END,
           dead_lettered_at = CASE WHEN fail_run.retryable AND r.attempts >= r.max_attempts THEN v_now END,
           error = fail_run.error,
           updated_at = v_now,
           lease_worker_id = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
           admission_slot = NULL, recovery_checkpoint_id = NULL
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = fail_run.run_id
       AND r.lease_worker_id = fail_run.worker_id
       AND r.lease_generation = fail_run.generation
       AND r.lease_expires_at >= v_now
       AND r.status = 'running'
    RETURNING CASE WHEN r.status = 'pending' THEN 'retry_scheduled'
                   WHEN r.dead_lettered_at IS NOT NULL THEN 'dead_lettered'
                   ELSE 'failed' END,
              r.deployment_ref, r.workspace_id
         INTO v_outcome, v_deploy, v_ws;
    IF v_outcome IS NULL THEN
        PERFORM zeroth._explain_fenced_miss(v_tenant, v_wskey, fail_run.run_id, fail_run.worker_id,
                                            fail_run.generation, v_now, 'fail_run', '{running}');
        RETURN NULL;
    END IF;
    PERFORM zeroth._notify_wakeup(v_deploy, v_tenant, v_ws);
    RETURN v_outcome;
END
$$;
COMMENT ON FUNCTION zeroth.fail_run(uuid, text, bigint, jsonb, boolean, double precision, double precision, text, text, timestamptz) IS
'fail_run: running → pending with exponential backoff + jitter (retryable, attempts < max_attempts), → failed (not retryable), or → failed + dead_lettered_at (retries exhausted). Fenced; clears the lease, frees the slot. Returns retry_scheduled | failed | dead_lettered, or NULL when fenced out. Raises ZP003, ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';

-- ---------------------------------------------------------------------------------------------
-- Giving a lease back (exact generation; none of these bumps the generation)
-- ---------------------------------------------------------------------------------------------

-- release_lease: give up exactly (worker_id, generation), with no status or expiry check, so
-- cleanup of generation N can never touch generation N+1 even when the same worker holds it.
-- A pending run becomes claimable at once (lease cleared). A running run keeps its holder and
-- gets an expired lease instead (a running run without a lease would be stranded, F-02), so
-- claim_orphaned recovers it. Frees the slot. Locks: slot, then run. Returns false on no match.
-- Raises ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().
CREATE FUNCTION zeroth.release_lease(
    run_id       uuid,
    worker_id    text,
    generation   bigint,
    tenant_id    text        DEFAULT NULL,
    workspace_id text        DEFAULT NULL,
    now_override timestamptz DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now    timestamptz := zeroth._now(now_override);
    v_tenant text := zeroth._scope_tenant(release_lease.tenant_id, release_lease.workspace_id);
    v_wskey  text := zeroth._workspace_key(release_lease.workspace_id);
    v_run    record;
BEGIN
    PERFORM zeroth._require(release_lease.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(release_lease.worker_id, 'worker_id');
    PERFORM zeroth._require(release_lease.generation IS NOT NULL, 'generation must not be NULL');

    PERFORM zeroth._free_slot(v_tenant, v_wskey, release_lease.run_id, release_lease.worker_id, release_lease.generation);
    UPDATE zeroth.runs r
       SET lease_worker_id   = CASE WHEN r.status = 'running' THEN r.lease_worker_id END,
           lease_acquired_at = CASE WHEN r.status = 'running' THEN r.lease_acquired_at END,
           lease_expires_at  = CASE WHEN r.status = 'running'
                                    THEN least(r.lease_expires_at, v_now - interval '1 microsecond') END,
           admission_slot = NULL,
           recovery_checkpoint_id = NULL,
           updated_at = v_now
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = release_lease.run_id
       AND r.lease_worker_id = release_lease.worker_id
       AND r.lease_generation = release_lease.generation
    RETURNING r.deployment_ref, r.workspace_id INTO v_run;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_tenant, v_run.workspace_id);
    RETURN true;
END
$$;
COMMENT ON FUNCTION zeroth.release_lease(uuid, text, bigint, text, text, timestamptz) IS
'release_lease: give up exactly (worker_id, generation), no status or expiry check, never bumps the generation. Pending: lease cleared, claimable at once. Running: holder kept, lease expired in place so claim_orphaned recovers it (never a running run without a lease). Frees the slot. Returns false on no match. Raises ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';

-- hand_back_to_pending: running → pending for exactly (worker_id, generation), with no expiry
-- check (graceful shutdown, contention). The attempt is given back. An admin cancel that got there
-- first wins: the run is no longer running, so nothing matches. Clears the lease and recovery id,
-- frees the slot. Locks: slot, then run. Returns false on no match. Raises ZP008. Notifies
-- zeroth_wakeup. Time: clock_timestamp().
CREATE FUNCTION zeroth.hand_back_to_pending(
    run_id       uuid,
    worker_id    text,
    generation   bigint,
    tenant_id    text        DEFAULT NULL,
    workspace_id text        DEFAULT NULL,
    now_override timestamptz DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now    timestamptz := zeroth._now(now_override);
    v_tenant text := zeroth._scope_tenant(hand_back_to_pending.tenant_id, hand_back_to_pending.workspace_id);
    v_wskey  text := zeroth._workspace_key(hand_back_to_pending.workspace_id);
    v_run    record;
BEGIN
    PERFORM zeroth._require(hand_back_to_pending.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(hand_back_to_pending.worker_id, 'worker_id');
    PERFORM zeroth._require(hand_back_to_pending.generation IS NOT NULL, 'generation must not be NULL');

    -- Lock the slot first (lock order), free it only if the run's UPDATE matches below.
    PERFORM zeroth._lock_slot(v_tenant, v_wskey, hand_back_to_pending.run_id, hand_back_to_pending.worker_id, hand_back_to_pending.generation);
    UPDATE zeroth.runs r
       SET status = 'pending',
           attempts = greatest(r.attempts - 1, 0),
           lease_worker_id = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
           admission_slot = NULL, recovery_checkpoint_id = NULL,
           updated_at = v_now
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = hand_back_to_pending.run_id
       AND r.lease_worker_id = hand_back_to_pending.worker_id
       AND r.lease_generation = hand_back_to_pending.generation
       AND r.status = 'running'
    RETURNING r.deployment_ref, r.workspace_id INTO v_run;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM zeroth._free_slot(v_tenant, v_wskey, hand_back_to_pending.run_id, hand_back_to_pending.worker_id, hand_back_to_pending.generation);
    PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_tenant, v_run.workspace_id);
    RETURN true;
END
$$;
COMMENT ON FUNCTION zeroth.hand_back_to_pending(uuid, text, bigint, text, text, timestamptz) IS
'hand_back_to_pending: running → pending for exactly (worker_id, generation), no expiry check; gives the attempt back, clears the lease, frees the slot. An admin cancel that came first wins (no match). Returns false on no match. Raises ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';

-- expire_recovery_lease: make owned running work immediately reclaimable without losing anything:
-- lease_expires_at := now - 1 µs, holder and recovery checkpoint kept, slot freed. Used when the
-- setup of a recovered run fails (the run must stay claimable, never released to a NULL lease).
-- Locks: slot, then run. Returns false on no match. Raises ZP008. Notifies zeroth_wakeup.
-- Time: clock_timestamp().
CREATE FUNCTION zeroth.expire_recovery_lease(
    run_id       uuid,
    worker_id    text,
    generation   bigint,
    tenant_id    text        DEFAULT NULL,
    workspace_id text        DEFAULT NULL,
    now_override timestamptz DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now    timestamptz := zeroth._now(now_override);
    v_tenant text := zeroth._scope_tenant(expire_recovery_lease.tenant_id, expire_recovery_lease.workspace_id);
    v_wskey  text := zeroth._workspace_key(expire_recovery_lease.workspace_id);
    v_run    record;
BEGIN
    PERFORM zeroth._require(expire_recovery_lease.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(expire_recovery_lease.worker_id, 'worker_id');
    PERFORM zeroth._require(expire_recovery_lease.generation IS NOT NULL, 'generation must not be NULL');

    -- Lock the slot first (lock order), free it only if the run's UPDATE matches below.
    PERFORM zeroth._lock_slot(v_tenant, v_wskey, expire_recovery_lease.run_id, expire_recovery_lease.worker_id, expire_recovery_lease.generation);
    UPDATE zeroth.runs r
       SET lease_expires_at = least(r.lease_expires_at, v_now - interval '1 microsecond'),
           admission_slot = NULL,
           updated_at = v_now
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = expire_recovery_lease.run_id
       AND r.lease_worker_id = expire_recovery_lease.worker_id
       AND r.lease_generation = expire_recovery_lease.generation
       AND r.status = 'running'
    RETURNING r.deployment_ref, r.workspace_id INTO v_run;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM zeroth._free_slot(v_tenant, v_wskey, expire_recovery_lease.run_id, expire_recovery_lease.worker_id, expire_recovery_lease.generation);
    PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_tenant, v_run.workspace_id);
    RETURN true;
END
$$;
COMMENT ON FUNCTION zeroth.expire_recovery_lease(uuid, text, bigint, text, text, timestamptz) IS
'expire_recovery_lease: for exactly (worker_id, generation) of a running run, set lease_expires_at to now - 1 µs, keeping holder and recovery checkpoint, freeing the slot: immediately reclaimable by claim_orphaned. Returns false on no match. Raises ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';

-- ---------------------------------------------------------------------------------------------
-- Admin transitions (unfenced, scoped)
-- ---------------------------------------------------------------------------------------------

-- Raises ZP001 when no run has this id in this scope, else ZP003 naming the status that refused.
CREATE FUNCTION zeroth._explain_admin_miss(tenant_id text, workspace_key text, run_id uuid, transition text,
                                           allowed zeroth.run_status[])
    RETURNS void
    LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_status zeroth.run_status;
BEGIN
    SELECT r.status INTO v_status FROM zeroth.runs r
     WHERE r.tenant_id = _explain_admin_miss.tenant_id
       AND r.workspace_key = _explain_admin_miss.workspace_key
       AND r.run_id = _explain_admin_miss.run_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % not found in this scope', run_id USING ERRCODE = 'ZP001';
    END IF;
    RAISE EXCEPTION '% needs a run in status %, run % is %', transition, allowed, run_id, v_status
        USING ERRCODE = 'ZP003';
END
$$;
COMMENT ON FUNCTION zeroth._explain_admin_miss(text, text, uuid, text, zeroth.run_status[]) IS 'Internal: raise ZP001 (no such run in scope) or ZP003 (wrong status) after an admin UPDATE matched nothing.';

-- clear_lease: admin, unfenced. Pending: the lease is cleared. Running: the holder is kept and the
-- lease expired in place, so the run stays recoverable (clearing it would strand it, F-02). Frees
-- every slot the run holds. Locks: slots, then run. Returns false when the run held no lease.
-- Raises ZP001 (unknown run), ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().
CREATE FUNCTION zeroth.clear_lease(
    run_id       uuid,
    tenant_id    text        DEFAULT NULL,
    workspace_id text        DEFAULT NULL,
    now_override timestamptz DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now    timestamptz := zeroth._now(now_override);
    v_tenant text := zeroth._scope_tenant(clear_lease.tenant_id, clear_lease.workspace_id);
    v_wskey  text := zeroth._workspace_key(clear_lease.workspace_id);
    v_run    record;
BEGIN
    PERFORM zeroth._require(clear_lease.run_id IS NOT NULL, 'run_id must not be NULL');

    UPDATE zeroth.admission_slots s
       SET run_id = NULL, lease_worker_id = NULL, lease_generation = NULL, lease_expires_at = NULL
     WHERE s.run_id = clear_lease.run_id AND s.tenant_id = v_tenant AND s.workspace_key = v_wskey;
    UPDATE zeroth.runs r
       SET lease_worker_id   = CASE WHEN r.status = 'running' THEN r.lease_worker_id END,
           lease_acquired_at = CASE WHEN r.status = 'running' THEN r.lease_acquired_at END,
           lease_expires_at  = CASE WHEN r.status = 'running'
                                    THEN least(r.lease_expires_at, v_now - interval '1 microsecond') END,
           admission_slot = NULL,
           recovery_checkpoint_id = NULL,
           updated_at = v_now
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = clear_lease.run_id
       AND r.lease_worker_id IS NOT NULL
    RETURNING r.deployment_ref, r.workspace_id INTO v_run;
    IF NOT FOUND THEN
        IF NOT EXISTS (SELECT 1 FROM zeroth.runs r WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey
                                                      AND r.run_id = clear_lease.run_id) THEN
            RAISE EXCEPTION 'run % not found in this scope', clear_lease.run_id USING ERRCODE = 'ZP001';
        END IF;
        RETURN false;
    END IF;
    PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_tenant, v_run.workspace_id);
    RETURN true;
END
$$;
COMMENT ON FUNCTION zeroth.clear_lease(uuid, text, text, timestamptz) IS
'clear_lease: admin, unfenced. Pending: lease cleared. Running: holder kept, lease expired in place so claim_orphaned recovers it (never stranded). Frees the run''s slots. Returns false when there was no lease. Raises ZP001, ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';

-- request_cancel: admin or user cancel. Outcomes: 'cancelled' (pending, waiting, or running whose
-- lease expired: terminal at once, lease cleared, every later fenced write of the old holder is
-- refused); 'cancel_requested' (running with a live lease: durable flag set, owner notified on
-- zeroth_control; the first action wins); 'not_cancellable' (terminal); 'unknown' (no such run in
-- scope). Locks: the run's slots, then the run. Raises ZP008. Notifies zeroth_wakeup when an
-- immediate cancel freed a concurrency slot. Time: clock_timestamp().
CREATE FUNCTION zeroth.request_cancel(
    run_id       uuid,
    tenant_id    text        DEFAULT NULL,
    workspace_id text        DEFAULT NULL,
    action       text        DEFAULT 'cancel',
    now_override timestamptz DEFAULT NULL)
    RETURNS text
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now    timestamptz := zeroth._now(now_override);
    v_tenant text := zeroth._scope_tenant(request_cancel.tenant_id, request_cancel.workspace_id);
    v_wskey  text := zeroth._workspace_key(request_cancel.workspace_id);
    v_run    record;
    v_freed  boolean;
BEGIN
    PERFORM zeroth._require(request_cancel.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require(request_cancel.action IN ('cancel', 'interrupt', 'rollback'),
                            'action must be cancel, interrupt or rollback');

    -- Slot rows before the run row: the same lock order as renewals and completions.
    PERFORM 1 FROM zeroth.admission_slots s
     WHERE s.run_id = request_cancel.run_id AND s.tenant_id = v_tenant AND s.workspace_key = v_wskey
       FOR UPDATE;
    SELECT r.status, r.lease_worker_id, r.lease_generation, r.lease_expires_at, r.deployment_ref
      INTO v_run
      FROM zeroth.runs r
     WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey AND r.run_id = request_cancel.run_id
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'unknown';
    ELSIF v_run.status IN ('completed', 'failed', 'cancelled') THEN
        RETURN 'not_cancellable';
    ELSIF v_run.status = 'running' AND v_run.lease_expires_at >= v_now THEN
        UPDATE zeroth.runs r
           SET cancel_requested_at = coalesce(r.cancel_requested_at, v_now),
               cancel_action = coalesce(r.cancel_action, request_cancel.action),
               updated_at = v_now
         WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey AND r.run_id = request_cancel.run_id;
        PERFORM pg_notify('zeroth_control', json_build_object(
            'type', 'cancel', 'run_id', request_cancel.run_id, 'worker_id', v_run.lease_worker_id,
            'lease_generation', v_run.lease_generation)::text);
        RETURN 'cancel_requested';
    END IF;

    UPDATE zeroth.admission_slots s
       SET run_id = NULL, lease_worker_id = NULL, lease_generation = NULL, lease_expires_at = NULL
     WHERE s.run_id = request_cancel.run_id AND s.tenant_id = v_tenant AND s.workspace_key = v_wskey;
    v_freed := FOUND;
    UPDATE zeroth.runs r
       SET status = 'cancelled',
           cancel_requested_at = coalesce(r.cancel_requested_at, v_now),
           cancel_action = coalesce(r.cancel_action, request_cancel.action),
           wait_reason = NULL,
           finished_at = v_now,
           updated_at = v_now,
           lease_worker_id = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
           admission_slot = NULL, recovery_checkpoint_id = NULL
     WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey AND r.run_id = request_cancel.run_id;
    IF v_freed THEN
        PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_tenant, request_cancel.workspace_id);
    END IF;
    RETURN 'cancelled';
END
$$;
COMMENT ON FUNCTION zeroth.request_cancel(uuid, text, text, text, timestamptz) IS
'request_cancel: returns cancelled (pending, waiting, or running with an expired lease: terminal at once, lease cleared so the old holder''s fenced writes are refused) | cancel_requested (running with a live lease: durable flag, first action wins, NOTIFY zeroth_control to the owner) | not_cancellable (terminal) | unknown (no such run in scope). Raises ZP008. Notifies zeroth_wakeup when an immediate cancel freed a slot. Time: clock_timestamp().';

-- cancel_run: the lease holder ends its run as cancelled (after seeing a cancel request, or on its
-- own). pending or running → cancelled, fenced; clears the lease and frees the slot. Returns false
-- when fenced out. Raises ZP008. Notifies zeroth_wakeup when a slot was freed. Time: clock_timestamp().
CREATE FUNCTION zeroth.cancel_run(
    run_id       uuid,
    worker_id    text,
    generation   bigint,
    tenant_id    text        DEFAULT NULL,
    workspace_id text        DEFAULT NULL,
    now_override timestamptz DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now    timestamptz := zeroth._now(now_override);
    v_tenant text := zeroth._scope_tenant(cancel_run.tenant_id, cancel_run.workspace_id);
    v_wskey  text := zeroth._workspace_key(cancel_run.workspace_id);
    v_freed  boolean;
    v_run    record;
BEGIN
    PERFORM zeroth._require(cancel_run.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(cancel_run.worker_id, 'worker_id');
    PERFORM zeroth._require(cancel_run.generation IS NOT NULL, 'generation must not be NULL');

    v_freed := zeroth._free_slot(v_tenant, v_wskey, cancel_run.run_id, cancel_run.worker_id, cancel_run.generation,
                                v_now);
    UPDATE zeroth.runs r
       SET status = 'cancelled',
           cancel_requested_at = coalesce(r.cancel_requested_at, v_now),
           cancel_action = coalesce(r.cancel_action, 'cancel'),
           finished_at = v_now,
           updated_at = v_now,
           lease_worker_id = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
           admission_slot = NULL, recovery_checkpoint_id = NULL
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = cancel_run.run_id
       AND r.lease_worker_id = cancel_run.worker_id
       AND r.lease_generation = cancel_run.generation
       AND r.lease_expires_at >= v_now
    RETURNING r.deployment_ref, r.workspace_id INTO v_run;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF v_freed THEN
        PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_tenant, v_run.workspace_id);
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION zeroth.cancel_run(uuid, text, bigint, text, text, timestamptz) IS
'cancel_run: the live lease holder (worker_id, generation) ends its pending or running run as cancelled; clears the lease, frees the slot. Returns false when fenced out. Raises ZP008. Notifies zeroth_wakeup when a slot was freed. Time: clock_timestamp().';

-- pause_run: running → waiting (approval, interrupt, …), fenced. The lease is released (a waiting
-- run is claimed by nobody) and the slot freed; resume_run makes it pending again. Returns false
-- when fenced out. Raises ZP003 (holder but not running), ZP008. Notifies zeroth_wakeup when a slot
-- was freed. Time: clock_timestamp().
CREATE FUNCTION zeroth.pause_run(
    run_id       uuid,
    worker_id    text,
    generation   bigint,
    reason       text,
    tenant_id    text        DEFAULT NULL,
    workspace_id text        DEFAULT NULL,
    now_override timestamptz DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now    timestamptz := zeroth._now(now_override);
    v_tenant text := zeroth._scope_tenant(pause_run.tenant_id, pause_run.workspace_id);
    v_wskey  text := zeroth._workspace_key(pause_run.workspace_id);
    v_freed  boolean;
    v_run    record;
BEGIN
    PERFORM zeroth._require(pause_run.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(pause_run.worker_id, 'worker_id');
    PERFORM zeroth._require(pause_run.generation IS NOT NULL, 'generation must not be NULL');
    PERFORM zeroth._require_identifier(pause_run.reason, 'reason');

    v_freed := zeroth._free_slot(v_tenant, v_wskey, pause_run.run_id, pause_run.worker_id, pause_run.generation,
                                v_now);
    UPDATE zeroth.runs r
       SET status = 'waiting',
           wait_reason = pause_run.reason,
           updated_at = v_now,
           lease_worker_id = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
           admission_slot = NULL, recovery_checkpoint_id = NULL
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = pause_run.run_id
       AND r.lease_worker_id = pause_run.worker_id
       AND r.lease_generation = pause_run.generation
       AND r.lease_expires_at >= v_now
       AND r.status = 'running'
    RETURNING r.deployment_ref, r.workspace_id INTO v_run;
    IF NOT FOUND THEN
        PERFORM zeroth._explain_fenced_miss(v_tenant, v_wskey, pause_run.run_id, pause_run.worker_id,
                                            pause_run.generation, v_now, 'pause_run', '{running}');
        RETURN false;
    END IF;
    IF v_freed THEN
        PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_tenant, v_run.workspace_id);
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION zeroth.pause_run(uuid, text, bigint, text, text, text, timestamptz) IS
'pause_run: running → waiting with a reason, for the live lease (worker_id, generation); releases the lease and slot. Returns false when fenced out. Raises ZP003 (holder but not running), ZP008. Notifies zeroth_wakeup when a slot was freed. Time: clock_timestamp().';

-- resume_run: waiting → pending (approval given, interrupt resolved). input, when given, is stored
-- as metadata.resume_input for the next drive. Locks: the run row. Returns true. Raises ZP001
-- (unknown run), ZP003 (not waiting), ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().
CREATE FUNCTION zeroth.resume_run(
    run_id       uuid,
    tenant_id    text        DEFAULT NULL,
    workspace_id text        DEFAULT NULL,
    input        jsonb       DEFAULT NULL,
    now_override timestamptz DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now    timestamptz := zeroth._now(now_override);
    v_tenant text := zeroth._scope_tenant(resume_run.tenant_id, resume_run.workspace_id);
    v_wskey  text := zeroth._workspace_key(resume_run.workspace_id);
    v_run    record;
BEGIN
    PERFORM zeroth._require(resume_run.run_id IS NOT NULL, 'run_id must not be NULL');

    UPDATE zeroth.runs r
       SET status = 'pending',
           wait_reason = NULL,
           run_after = v_now,
           metadata = CASE WHEN resume_run.input IS NULL THEN r.metadata
                           ELSE r.metadata || jsonb_build_object('resume_input', resume_run.input) END,
           updated_at = v_now
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = resume_run.run_id
       AND r.status = 'waiting'
    RETURNING r.deployment_ref, r.workspace_id INTO v_run;
    IF NOT FOUND THEN
        PERFORM zeroth._explain_admin_miss(v_tenant, v_wskey, resume_run.run_id, 'resume_run', '{waiting}');
    END IF;
    PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_tenant, v_run.workspace_id);
    RETURN true;
END
$$;
COMMENT ON FUNCTION zeroth.resume_run(uuid, text, text, jsonb, timestamptz) IS
'resume_run: waiting → pending; input (if given) is stored as metadata.resume_input. Raises ZP001 (unknown run), ZP003 (not waiting), ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';

-- redrive_run: failed or cancelled → pending (dead-letter redrive, operator replay). Resets
-- attempts, error, output, cancel and dead-letter marks; never the lease generation, so fencing
-- stays monotonic across replays. Checkpoints are kept: the next claim hands the latest one to
-- the handler, which decides whether to resume from it. Locks: the run row. Returns true. Raises ZP001 (unknown run),
-- ZP003 (not failed/cancelled), ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().
CREATE FUNCTION zeroth.redrive_run(
    run_id       uuid,
    tenant_id    text        DEFAULT NULL,
    workspace_id text        DEFAULT NULL,
    now_override timestamptz DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now    timestamptz := zeroth._now(now_override);
    v_tenant text := zeroth._scope_tenant(redrive_run.tenant_id, redrive_run.workspace_id);
    v_wskey  text := zeroth._workspace_key(redrive_run.workspace_id);
    v_run    record;
BEGIN
    PERFORM zeroth._require(redrive_run.run_id IS NOT NULL, 'run_id must not be NULL');

    UPDATE zeroth.runs r
       SET status = 'pending',
           attempts = 0,
           run_after = v_now,
           error = NULL, output = NULL, finished_at = NULL, dead_lettered_at = NULL,
           cancel_action = NULL, cancel_requested_at = NULL,
           updated_at = v_now
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = redrive_run.run_id
       AND r.status IN ('failed', 'cancelled')
    RETURNING r.deployment_ref, r.workspace_id INTO v_run;
    IF NOT FOUND THEN
        PERFORM zeroth._explain_admin_miss(v_tenant, v_wskey, redrive_run.run_id, 'redrive_run', '{failed,cancelled}');
    END IF;
    PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_tenant, v_run.workspace_id);
    RETURN true;
END
$$;
COMMENT ON FUNCTION zeroth.redrive_run(uuid, text, text, timestamptz) IS
'redrive_run: failed or cancelled → pending; resets attempts, error, output, cancel and dead-letter marks, never lease_generation. Raises ZP001 (unknown run), ZP003 (not failed/cancelled), ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';
