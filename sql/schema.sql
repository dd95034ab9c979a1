-- sql/schema.sql: the schema as the migrations leave it. Generated; do not edit.
-- Regenerate with `python -m zeroth_pg.migrate dump-schema`;
-- tests/migrations/test_schema_drift.py fails when it drifts.

--
-- Name: zeroth; Type: SCHEMA; Schema: -; Owner: -
--
CREATE SCHEMA zeroth;

--
-- Name: SCHEMA zeroth; Type: COMMENT; Schema: -; Owner: -
--
COMMENT ON SCHEMA zeroth IS 'zeroth_pg: a Postgres-native durable run dispatcher. The public API is the functions in this schema.';

--
-- Name: run_status; Type: TYPE; Schema: zeroth; Owner: -
--
CREATE TYPE zeroth.run_status AS ENUM (
    'pending',
    'running',
    'waiting',
    'completed',
    'failed',
    'cancelled'
);

--
-- Name: TYPE run_status; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON TYPE zeroth.run_status IS 'Status axis of a run. The lease axis (lease_* columns) is orthogonal: see docs/state-machine.md.';

--
-- Name: admission; Type: TYPE; Schema: zeroth; Owner: -
--
CREATE TYPE zeroth.admission AS (
	outcome text,
	run_id uuid,
	status zeroth.run_status,
	lease_generation bigint,
	lease_expires_at timestamp with time zone,
	active_run_id uuid,
	retry_after_s integer,
	displaced jsonb
);

--
-- Name: TYPE admission; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON TYPE zeroth.admission IS 'Result of admit_run. outcome: admitted | queued | busy | reused. lease_* are set when the caller holds the run (admit-and-own); active_run_id and retry_after_s name the run the thread waits for (busy, queued); displaced lists the runs an interrupt/rollback cancelled or asked to stop: [{run_id, outcome, worker_id, lease_generation}].';

--
-- Name: cancel_result; Type: TYPE; Schema: zeroth; Owner: -
--
CREATE TYPE zeroth.cancel_result AS (
	outcome text,
	run_id uuid,
	status zeroth.run_status,
	cancel_action text,
	lease_worker_id text,
	lease_generation bigint,
	retry_after_s integer
);

--
-- Name: TYPE cancel_result; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON TYPE zeroth.cancel_result IS 'Result of request_cancel_v2. outcome: cancelled | cancel_requested | taken_over | not_cancellable | unknown; status after the call; the winning cancel_action; the owner asked to stop or displaced; retry_after_s = seconds until the owner''s lease + grace runs out (a cancel retried then takes over).';

--
-- Name: claimed_run; Type: TYPE; Schema: zeroth; Owner: -
--
CREATE TYPE zeroth.claimed_run AS (
	run_id uuid,
	lease_generation bigint,
	lease_expires_at timestamp with time zone,
	status zeroth.run_status,
	attempts integer,
	max_attempts integer,
	priority integer,
	thread_id text,
	idempotency_key text,
	payload jsonb,
	metadata jsonb,
	recovery_checkpoint_id uuid,
	checkpoint_data jsonb,
	cancel_requested boolean,
	active_count integer,
	concurrency_saturated boolean,
	concurrency_limit integer
);

--
-- Name: TYPE claimed_run; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON TYPE zeroth.claimed_run IS 'A row of claim_pending / claim_orphaned: one per claimed run, or a single row with run_id NULL that carries only the saturation the call observed.';

--
-- Name: enqueue_item; Type: TYPE; Schema: zeroth; Owner: -
--
CREATE TYPE zeroth.enqueue_item AS (
	"position" bigint,
	payload jsonb,
	priority integer,
	run_after timestamp with time zone,
	max_attempts integer,
	idempotency_key text,
	metadata jsonb,
	run_id uuid,
	thread_id text,
	new_run_id uuid
);

--
-- Name: TYPE enqueue_item; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON TYPE zeroth.enqueue_item IS 'Internal: one parsed item of an enqueue_runs batch; new_run_id is the caller''s run_id or a fresh one.';

--
-- Name: enqueued_run; Type: TYPE; Schema: zeroth; Owner: -
--
CREATE TYPE zeroth.enqueued_run AS (
	run_id uuid,
	created boolean,
	status zeroth.run_status
);

--
-- Name: TYPE enqueued_run; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON TYPE zeroth.enqueued_run IS 'Result of enqueue_run(s): created is false when an idempotency key or caller-chosen run_id matched an existing run, which is returned instead.';

--
-- Name: lease_renewal; Type: TYPE; Schema: zeroth; Owner: -
--
CREATE TYPE zeroth.lease_renewal AS (
	run_id uuid,
	renewed boolean,
	lease_expires_at timestamp with time zone,
	cancel_requested boolean
);

--
-- Name: TYPE lease_renewal; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON TYPE zeroth.lease_renewal IS 'Result row of renew_leases: one per requested (run_id, generation).';

--
-- Name: takeover; Type: TYPE; Schema: zeroth; Owner: -
--
CREATE TYPE zeroth.takeover AS (
	run_id uuid,
	thread_id text,
	outcome text,
	status zeroth.run_status,
	previous_worker_id text,
	previous_generation bigint
);

--
-- Name: TYPE takeover; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON TYPE zeroth.takeover IS 'A run ended or handed back by claim_for_takeover / reconcile_thread_runs / claim_orphaned. outcome: failed (not resumable) | cancelled (a cancel was requested) | requeued (resumable: back to pending for another worker, the interrupted attempt still counted) | dead_lettered (resumable but out of attempts).';

--
-- Name: thread_run; Type: TYPE; Schema: zeroth; Owner: -
--
CREATE TYPE zeroth.thread_run AS (
	run_id uuid,
	thread_id text,
	deployment_ref text,
	status zeroth.run_status,
	queued boolean,
	wait_reason text,
	attempts integer,
	max_attempts integer,
	resumable boolean,
	created_at timestamp with time zone,
	started_at timestamp with time zone,
	finished_at timestamp with time zone,
	updated_at timestamp with time zone,
	lease_worker_id text,
	lease_generation bigint,
	lease_expires_at timestamp with time zone,
	cancel_action text,
	cancel_requested_at timestamp with time zone,
	idempotency_key text,
	payload jsonb,
	metadata jsonb,
	output jsonb,
	error jsonb,
	progress jsonb,
	accounting jsonb
);

--
-- Name: TYPE thread_run; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON TYPE zeroth.thread_run IS 'A run as list_thread_runs / get_thread_run report it; queued = waiting behind the active run of its thread.';

--
-- Name: _admission_reuse(text, text, text, text, text, uuid, text, boolean); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._admission_reuse(tenant_id text, workspace_key text, deployment_ref text, thread_id text, idempotency_key text, run_id uuid, worker_id text, strict boolean) RETURNS zeroth.admission
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    v_run    record;
    v_result zeroth.admission;
BEGIN
    IF _admission_reuse.idempotency_key IS NULL AND _admission_reuse.run_id IS NULL THEN
        RETURN v_result;
    END IF;
    -- One branch per unique index (the primary key, the key's index), the run_id match first. An
    -- OR of the two is no index condition: a generic plan made while the table was small read
    -- the whole scope through runs_pkey and filtered it, every run of its history per admission.
    SELECT x.run_id, x.thread_id, x.status, x.lease_worker_id, x.lease_generation, x.lease_expires_at
      INTO v_run
      FROM (SELECT r.run_id, r.thread_id, r.status, r.lease_worker_id, r.lease_generation,
                   r.lease_expires_at, true AS by_run_id
              FROM zeroth.runs r
             WHERE r.tenant_id = _admission_reuse.tenant_id
               AND r.workspace_key = _admission_reuse.workspace_key
               AND r.run_id = _admission_reuse.run_id
            UNION ALL
            SELECT r.run_id, r.thread_id, r.status, r.lease_worker_id, r.lease_generation,
                   r.lease_expires_at, false
              FROM zeroth.runs r
             WHERE r.tenant_id = _admission_reuse.tenant_id
               AND r.workspace_key = _admission_reuse.workspace_key
               AND r.deployment_ref = _admission_reuse.deployment_ref
               AND r.idempotency_key = _admission_reuse.idempotency_key) x
     ORDER BY x.by_run_id DESC
     LIMIT 1;
    IF NOT FOUND THEN
        RETURN v_result;
    END IF;
    IF _admission_reuse.strict AND v_run.thread_id IS DISTINCT FROM _admission_reuse.thread_id THEN
        RAISE EXCEPTION 'run % (same idempotency key or run_id) belongs to thread %, not %',
            v_run.run_id, coalesce(quote_literal(v_run.thread_id), 'none'), quote_literal(_admission_reuse.thread_id)
            USING ERRCODE = 'ZP008';
    END IF;
    v_result := ROW('reused', v_run.run_id, v_run.status, NULL, NULL, NULL, NULL, '[]'::jsonb)::zeroth.admission;
    IF v_run.lease_worker_id = _admission_reuse.worker_id THEN
        v_result.lease_generation := v_run.lease_generation;
        v_result.lease_expires_at := v_run.lease_expires_at;
    END IF;
    RETURN v_result;
END
$$;

--
-- Name: FUNCTION _admission_reuse(tenant_id text, workspace_key text, deployment_ref text, thread_id text, idempotency_key text, run_id uuid, worker_id text, strict boolean); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._admission_reuse(tenant_id text, workspace_key text, deployment_ref text, thread_id text, idempotency_key text, run_id uuid, worker_id text, strict boolean) IS 'Internal: the run an admission returns as reused (same idempotency key or run_id; the first admission wins whatever the payload), or a NULL outcome.';

--
-- Name: _admit(text, text, text, text, boolean, text, jsonb, jsonb, integer, timestamp with time zone, integer, text, uuid, boolean, interval, interval, timestamp with time zone, boolean, jsonb); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._admit(tenant_id text, workspace_id text, deployment_ref text, thread_id text, queue_when_busy boolean, worker_id text, payload jsonb, metadata jsonb, priority integer, run_after timestamp with time zone, max_attempts integer, idempotency_key text, run_id uuid, resumable boolean, lease interval, grace interval, at timestamp with time zone, strict boolean, displaced jsonb DEFAULT '[]'::jsonb) RETURNS zeroth.admission
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_wskey  text := zeroth._workspace_key(_admit.workspace_id);
    v_result zeroth.admission;
    v_active zeroth.runs;
    v_queue  boolean;
    v_owned  boolean;
    v_new    record;
BEGIN
    -- A retried admission needs no lock...
    v_result := zeroth._admission_reuse(_admit.tenant_id, v_wskey, _admit.deployment_ref, _admit.thread_id,
                                        _admit.idempotency_key, _admit.run_id, _admit.worker_id, _admit.strict);
    IF v_result.outcome IS NOT NULL THEN
        RETURN v_result;
    END IF;
    PERFORM zeroth._lock_thread(_admit.tenant_id, v_wskey, _admit.thread_id);
    -- ...unless its first attempt was in flight: under the lock, that one has committed.
    v_result := zeroth._admission_reuse(_admit.tenant_id, v_wskey, _admit.deployment_ref, _admit.thread_id,
                                        _admit.idempotency_key, _admit.run_id, _admit.worker_id, _admit.strict);
    IF v_result.outcome IS NOT NULL THEN
        RETURN v_result;
    END IF;

    FOR v_attempt IN 1..100 LOOP
        v_active := zeroth._lock_thread_active(_admit.tenant_id, v_wskey, _admit.thread_id, _admit.at);
        v_queue := v_active.run_id IS NOT NULL;
        IF v_queue AND NOT _admit.queue_when_busy THEN
            RETURN ROW('busy', NULL, NULL, NULL, NULL, v_active.run_id,
                       zeroth._retry_after(v_active.lease_expires_at, _admit.grace, _admit.at),
                       _admit.displaced)::zeroth.admission;
        END IF;

        v_owned := _admit.worker_id IS NOT NULL AND NOT v_queue;
        INSERT INTO zeroth.runs AS r (
            run_id, tenant_id, workspace_id, deployment_ref, thread_id, status, wait_reason, thread_queued_at,
            priority, run_after, max_attempts, created_at, updated_at, payload, metadata, idempotency_key,
            resumable, lease_worker_id, lease_acquired_at, lease_expires_at, lease_generation)
        VALUES (
            coalesce(_admit.run_id, gen_random_uuid()), _admit.tenant_id, _admit.workspace_id, _admit.deployment_ref,
            _admit.thread_id,
            CASE WHEN v_queue THEN 'waiting'::zeroth.run_status ELSE 'pending'::zeroth.run_status END,
            CASE WHEN v_queue THEN 'thread_queue' END,
            CASE WHEN v_queue THEN zeroth._queue_position(_admit.tenant_id, v_wskey, _admit.thread_id, _admit.at) END,
            _admit.priority, coalesce(_admit.run_after, _admit.at), _admit.max_attempts, _admit.at, _admit.at,
            _admit.payload, _admit.metadata, _admit.idempotency_key, _admit.resumable,
            CASE WHEN v_owned THEN _admit.worker_id END,
            CASE WHEN v_owned THEN _admit.at END,
            CASE WHEN v_owned THEN _admit.at + _admit.lease END,
            CASE WHEN v_owned THEN 1 ELSE 0 END)
        ON CONFLICT DO NOTHING
        RETURNING r.run_id, r.status, r.lease_generation, r.lease_expires_at, r.run_after INTO v_new;
        IF FOUND THEN
            IF v_queue THEN
                PERFORM zeroth._mark_queue_changed(_admit.tenant_id, v_wskey, v_active.run_id);
            END IF;
            IF NOT v_queue AND NOT v_owned AND v_new.run_after <= _admit.at THEN
                PERFORM zeroth._notify_wakeup(_admit.deployment_ref, _admit.tenant_id, _admit.workspace_id);
            END IF;
            RETURN ROW(CASE WHEN v_queue THEN 'queued' ELSE 'admitted' END, v_new.run_id, v_new.status,
                       CASE WHEN v_owned THEN v_new.lease_generation END, v_new.lease_expires_at,
                       v_active.run_id, zeroth._retry_after(v_active.lease_expires_at, _admit.grace, _admit.at),
                       _admit.displaced)::zeroth.admission;
        END IF;
        -- A unique index said no: the same key or run_id arrived concurrently, or an active run
        -- appeared (only a finishing run's promotion can do that): look again.
        v_result := zeroth._admission_reuse(_admit.tenant_id, v_wskey, _admit.deployment_ref, _admit.thread_id,
                                            _admit.idempotency_key, _admit.run_id, _admit.worker_id, _admit.strict);
        IF v_result.outcome IS NOT NULL THEN
            RETURN v_result;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'the active run of thread % kept changing', thread_id USING ERRCODE = '40001';
END
$$;

--
-- Name: FUNCTION _admit(tenant_id text, workspace_id text, deployment_ref text, thread_id text, queue_when_busy boolean, worker_id text, payload jsonb, metadata jsonb, priority integer, run_after timestamp with time zone, max_attempts integer, idempotency_key text, run_id uuid, resumable boolean, lease interval, grace interval, at timestamp with time zone, strict boolean, displaced jsonb); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._admit(tenant_id text, workspace_id text, deployment_ref text, thread_id text, queue_when_busy boolean, worker_id text, payload jsonb, metadata jsonb, priority integer, run_after timestamp with time zone, max_attempts integer, idempotency_key text, run_id uuid, resumable boolean, lease interval, grace interval, at timestamp with time zone, strict boolean, displaced jsonb) IS 'Internal: the admission of admit_run and of enqueue_run(s) with a thread_id: admitted, queued, busy or reused.';

--
-- Name: _cancel(text, text, uuid, text, interval, timestamp with time zone, text, bigint); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._cancel(tenant_id text, workspace_key text, run_id uuid, action text, grace interval, at timestamp with time zone, caller_worker_id text DEFAULT NULL::text, caller_generation bigint DEFAULT NULL::bigint) RETURNS zeroth.cancel_result
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_run    record;
    v_owner  boolean;
    v_freed  boolean;
    v_result zeroth.cancel_result;
    v_at     timestamptz;
BEGIN
    PERFORM 1 FROM zeroth.admission_slots s
     WHERE s.run_id = _cancel.run_id AND s.tenant_id = _cancel.tenant_id AND s.workspace_key = _cancel.workspace_key
       FOR UPDATE;
    SELECT r.status, r.lease_worker_id, r.lease_generation, r.lease_expires_at, r.deployment_ref,
           r.workspace_id, r.cancel_action
      INTO v_run
      FROM zeroth.runs r
     WHERE r.tenant_id = _cancel.tenant_id AND r.workspace_key = _cancel.workspace_key AND r.run_id = _cancel.run_id
       FOR UPDATE;
    -- Decide with the clock read under the row lock, not the caller's `at` from before it: a
    -- caller that waited for the row must not count an owner whose lease expired meanwhile.
    v_at := greatest(_cancel.at, zeroth._now());
    v_result.run_id := _cancel.run_id;
    IF NOT FOUND THEN
        v_result.outcome := 'unknown';
        RETURN v_result;
    END IF;
    v_result.lease_worker_id := v_run.lease_worker_id;
    v_result.lease_generation := v_run.lease_generation;
    IF v_run.status IN ('completed', 'failed', 'cancelled') THEN
        v_result.outcome := 'not_cancellable';
        v_result.status := v_run.status;
        v_result.cancel_action := v_run.cancel_action;
        RETURN v_result;
    END IF;

    -- A worker id is only a label: owning the run means holding its live lease generation.
    v_owner := v_run.lease_worker_id = _cancel.caller_worker_id
               AND v_run.lease_generation = _cancel.caller_generation
               AND v_run.lease_expires_at >= v_at;
    IF v_run.status = 'running' AND v_run.lease_expires_at + _cancel.grace >= v_at
       AND v_owner IS NOT TRUE THEN
        UPDATE zeroth.runs r
           SET cancel_requested_at = coalesce(r.cancel_requested_at, v_at),
               cancel_action = coalesce(r.cancel_action, _cancel.action),
               updated_at = v_at
         WHERE r.tenant_id = _cancel.tenant_id AND r.workspace_key = _cancel.workspace_key AND r.run_id = _cancel.run_id
        RETURNING r.cancel_action INTO v_result.cancel_action;
        PERFORM zeroth._notify_control(v_run.lease_worker_id);
        v_result.outcome := 'cancel_requested';
        v_result.status := 'running';
        v_result.retry_after_s := zeroth._retry_after(v_run.lease_expires_at, _cancel.grace, v_at);
        RETURN v_result;
    END IF;

    UPDATE zeroth.admission_slots s
       SET run_id = NULL, lease_generation = NULL
     WHERE s.run_id = _cancel.run_id AND s.tenant_id = _cancel.tenant_id AND s.workspace_key = _cancel.workspace_key;
    v_freed := FOUND;
    v_result.outcome := CASE WHEN v_run.status = 'running' AND v_owner IS NOT TRUE
                             THEN 'taken_over' ELSE 'cancelled' END;
    UPDATE zeroth.runs r
       SET status = 'cancelled',
           cancel_requested_at = coalesce(r.cancel_requested_at, v_at),
           cancel_action = coalesce(r.cancel_action, _cancel.action),
           error = CASE WHEN v_result.outcome = 'taken_over'
                        THEN zeroth._stop_error('taken_over', format(
                                 'cancelled after worker %s stopped renewing its lease (expired at %s)',
                                 r.lease_worker_id, r.lease_expires_at), r.lease_worker_id, r.lease_generation, r.error)
                        ELSE r.error END,
           wait_reason = NULL,
           thread_queued_at = NULL,
           finished_at = v_at,
           updated_at = v_at,
           lease_worker_id = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
           admission_slot = NULL, recovery_checkpoint_id = NULL
     WHERE r.tenant_id = _cancel.tenant_id AND r.workspace_key = _cancel.workspace_key AND r.run_id = _cancel.run_id
    RETURNING r.status, r.cancel_action INTO v_result.status, v_result.cancel_action;
    IF v_freed THEN
        PERFORM zeroth._notify_wakeup(v_run.deployment_ref, _cancel.tenant_id, v_run.workspace_id);
    END IF;
    RETURN v_result;
END
$$;

--
-- Name: FUNCTION _cancel(tenant_id text, workspace_key text, run_id uuid, action text, grace interval, at timestamp with time zone, caller_worker_id text, caller_generation bigint); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._cancel(tenant_id text, workspace_key text, run_id uuid, action text, grace interval, at timestamp with time zone, caller_worker_id text, caller_generation bigint) IS 'Internal: the cancel decision of request_cancel(_v2) and admit_run: cancelled | cancel_requested | taken_over | not_cancellable | unknown. The caller counts as the owner only with the live (worker id, generation).';

--
-- Name: _claim_marker(integer, boolean, integer); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._claim_marker(active_count integer, saturated boolean, concurrency_limit integer) RETURNS zeroth.claimed_run
    LANGUAGE sql IMMUTABLE
    RETURN ROW(NULL::uuid, NULL::bigint, NULL::timestamp with time zone, NULL::zeroth.run_status, NULL::integer, NULL::integer, NULL::integer, NULL::text, NULL::text, NULL::jsonb, NULL::jsonb, NULL::uuid, NULL::jsonb, NULL::boolean, active_count, saturated, concurrency_limit)::zeroth.claimed_run;

--
-- Name: FUNCTION _claim_marker(active_count integer, saturated boolean, concurrency_limit integer); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._claim_marker(active_count integer, saturated boolean, concurrency_limit integer) IS 'Internal: the run_id-NULL row a claim returns when it claimed nothing, carrying the saturation it saw.';

--
-- Name: _claim_pending(text, text, text, text, integer, integer, double precision, boolean); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._claim_pending(deployment_ref text, worker_id text, tenant_id text, workspace_id text, max_concurrency integer, batch_size integer, lease_seconds double precision, start boolean) RETURNS SETOF zeroth.claimed_run
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
DECLARE
    v_now    timestamptz := zeroth._now();
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

--
-- Name: FUNCTION _claim_pending(deployment_ref text, worker_id text, tenant_id text, workspace_id text, max_concurrency integer, batch_size integer, lease_seconds double precision, start boolean); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._claim_pending(deployment_ref text, worker_id text, tenant_id text, workspace_id text, max_concurrency integer, batch_size integer, lease_seconds double precision, start boolean) IS 'Internal: the body of claim_pending (start false) and claim_and_start (start true).';

--
-- Name: _displace(text, text, text, text, interval, timestamp with time zone, text, bigint); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._displace(tenant_id text, workspace_key text, thread_id text, action text, grace interval, at timestamp with time zone, worker_id text, owner_generation bigint) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_active    zeroth.runs := zeroth._lock_thread_active(_displace.tenant_id, _displace.workspace_key,
                                                          _displace.thread_id, _displace.at);
    v_queued    uuid;
    v_cancel    zeroth.cancel_result;
    v_displaced jsonb := '[]'::jsonb;
BEGIN
    IF v_active.run_id IS NULL THEN
        RETURN v_displaced;
    END IF;
    FOR v_queued IN
        SELECT r.run_id FROM zeroth.runs r
         WHERE r.tenant_id = _displace.tenant_id AND r.workspace_key = _displace.workspace_key
           AND r.thread_id = _displace.thread_id AND r.thread_queued_at IS NOT NULL
         ORDER BY r.thread_queued_at, r.run_id
           FOR UPDATE
    LOOP
        v_cancel := zeroth._cancel(_displace.tenant_id, _displace.workspace_key, v_queued, _displace.action,
                                   _displace.grace, _displace.at);
        v_displaced := v_displaced || jsonb_build_array(jsonb_build_object(
            'run_id', v_cancel.run_id, 'outcome', v_cancel.outcome, 'worker_id', NULL, 'lease_generation', NULL));
    END LOOP;
    v_cancel := zeroth._cancel(_displace.tenant_id, _displace.workspace_key, v_active.run_id, _displace.action,
                               _displace.grace, _displace.at, _displace.worker_id, _displace.owner_generation);
    RETURN v_displaced || jsonb_build_array(jsonb_build_object(
        'run_id', v_cancel.run_id, 'outcome', v_cancel.outcome, 'worker_id', v_cancel.lease_worker_id,
        'lease_generation', v_cancel.lease_generation));
END
$$;

--
-- Name: FUNCTION _displace(tenant_id text, workspace_key text, thread_id text, action text, grace interval, at timestamp with time zone, worker_id text, owner_generation bigint); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._displace(tenant_id text, workspace_key text, thread_id text, action text, grace interval, at timestamp with time zone, worker_id text, owner_generation bigint) IS 'Internal: interrupt / rollback of a thread: cancel its queue, then cancel (or ask the live owner to stop) its active run; returns the displaced runs.';

--
-- Name: _enqueue_batch(text, text, text, text, zeroth.enqueue_item[], timestamp with time zone); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._enqueue_batch(tenant_id text, workspace_key text, workspace_id text, deployment_ref text, items zeroth.enqueue_item[], at timestamp with time zone, OUT created uuid[], OUT keys text[], OUT t_pos bigint[], OUT t_run uuid[], OUT t_created boolean[], OUT t_status zeroth.run_status[]) RETURNS record
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_item     zeroth.enqueue_item;
    v_thread   text;
    v_admitted zeroth.admission;
BEGIN
    t_pos := '{}'; t_run := '{}'; t_created := '{}'; t_status := '{}';
    -- Every thread lock first, in stripe order (what the lock really is), so two batches naming
    -- the same threads in any order take them in one order.
    FOR v_thread IN
        SELECT t.thread_id
          FROM (SELECT DISTINCT i.thread_id,
                       zeroth._thread_stripe(_enqueue_batch.tenant_id, _enqueue_batch.workspace_key,
                                             i.thread_id) AS stripe
                  FROM unnest(_enqueue_batch.items) AS i
                 WHERE i.thread_id IS NOT NULL) t
         ORDER BY t.stripe, t.thread_id
    LOOP
        PERFORM zeroth._lock_thread(_enqueue_batch.tenant_id, _enqueue_batch.workspace_key, v_thread);
    END LOOP;

    -- The runs without a thread: one INSERT, in key order.
    WITH inserted AS (
        INSERT INTO zeroth.runs AS r (
            run_id, tenant_id, workspace_id, deployment_ref, status, priority, run_after,
            max_attempts, created_at, updated_at, payload, metadata, idempotency_key)
        SELECT i.new_run_id, _enqueue_batch.tenant_id, _enqueue_batch.workspace_id,
               _enqueue_batch.deployment_ref, 'pending', i.priority,
               coalesce(i.run_after, _enqueue_batch.at), i.max_attempts, _enqueue_batch.at,
               _enqueue_batch.at, i.payload, i.metadata, i.idempotency_key
          FROM unnest(_enqueue_batch.items) AS i
         WHERE i.thread_id IS NULL
         ORDER BY i.idempotency_key, i.run_id, i.position
        ON CONFLICT DO NOTHING
        RETURNING r.run_id, r.idempotency_key
    )
    SELECT coalesce(array_agg(x.run_id), '{}'), coalesce(array_agg(x.idempotency_key), '{}')
      INTO created, keys
      FROM inserted x;

    -- The runs with a thread: each admitted (or queued) under the locks already held.
    FOR v_item IN SELECT i.* FROM unnest(_enqueue_batch.items) AS i WHERE i.thread_id IS NOT NULL ORDER BY i.position LOOP
        v_admitted := zeroth._admit(_enqueue_batch.tenant_id, _enqueue_batch.workspace_id, _enqueue_batch.deployment_ref,
                                    v_item.thread_id, true, NULL, v_item.payload, v_item.metadata, v_item.priority,
                                    v_item.run_after, v_item.max_attempts, v_item.idempotency_key, v_item.run_id,
                                    true, NULL, interval '0', _enqueue_batch.at, false);
        t_pos := t_pos || v_item.position;
        t_run := t_run || v_admitted.run_id;
        t_created := t_created || (v_admitted.outcome <> 'reused');
        t_status := t_status || v_admitted.status;
    END LOOP;
END
$$;

--
-- Name: FUNCTION _enqueue_batch(tenant_id text, workspace_key text, workspace_id text, deployment_ref text, items zeroth.enqueue_item[], at timestamp with time zone, OUT created uuid[], OUT keys text[], OUT t_pos bigint[], OUT t_run uuid[], OUT t_created boolean[], OUT t_status zeroth.run_status[]); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._enqueue_batch(tenant_id text, workspace_key text, workspace_id text, deployment_ref text, items zeroth.enqueue_item[], at timestamp with time zone, OUT created uuid[], OUT keys text[], OUT t_pos bigint[], OUT t_run uuid[], OUT t_created boolean[], OUT t_status zeroth.run_status[]) IS 'Internal: the writes of one enqueue_runs batch (thread locks in stripe order, one INSERT for the runs without a thread, one admission per thread item); returns what was created.';

--
-- Name: _enqueue_items(jsonb); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._enqueue_items(runs jsonb) RETURNS zeroth.enqueue_item[]
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_items zeroth.enqueue_item[];
    v_item  jsonb;
    v_index bigint;
    v_error text;
BEGIN
    PERFORM zeroth._require(jsonb_typeof(_enqueue_items.runs) = 'array', 'runs must be a JSON array');
    PERFORM zeroth._require(jsonb_array_length(_enqueue_items.runs) <= 10000, 'runs may hold at most 10000 items');
    SELECT format('runs[%s] %s', e.position,
                  CASE WHEN jsonb_typeof(e.item) <> 'object' THEN 'must be a JSON object'
                       ELSE format('has an unknown key %L',
                                   (SELECT k FROM jsonb_object_keys(e.item) AS k
                                     WHERE k NOT IN ('payload', 'priority', 'run_after', 'max_attempts',
                                                     'idempotency_key', 'metadata', 'run_id', 'thread_id')
                                     ORDER BY k LIMIT 1)) END)
      INTO v_error
      FROM jsonb_array_elements(_enqueue_items.runs) WITH ORDINALITY AS e(item, position)
     WHERE jsonb_typeof(e.item) <> 'object'
        OR EXISTS (SELECT 1 FROM jsonb_object_keys(e.item) AS k
                    WHERE k NOT IN ('payload', 'priority', 'run_after', 'max_attempts', 'idempotency_key',
                                    'metadata', 'run_id', 'thread_id'))
     ORDER BY e.position
     LIMIT 1;
    PERFORM zeroth._require(v_error IS NULL, v_error);

    BEGIN
        v_items := ARRAY(
            SELECT ROW(e.position,
                       coalesce(e.item -> 'payload', '{}'::jsonb),
                       coalesce((e.item ->> 'priority')::integer, 0),
                       (e.item ->> 'run_after')::timestamptz,
                       coalesce((e.item ->> 'max_attempts')::integer, 3),
                       e.item ->> 'idempotency_key',
                       coalesce(e.item -> 'metadata', '{}'::jsonb),
                       (e.item ->> 'run_id')::uuid,
                       e.item ->> 'thread_id',
                       coalesce((e.item ->> 'run_id')::uuid, gen_random_uuid()))::zeroth.enqueue_item
              FROM jsonb_array_elements(_enqueue_items.runs) WITH ORDINALITY AS e(item, position)
             ORDER BY e.position);
    EXCEPTION
        WHEN invalid_text_representation OR numeric_value_out_of_range OR invalid_datetime_format
             OR datetime_field_overflow THEN
            FOR v_item, v_index IN
                SELECT e.item, e.position
                  FROM jsonb_array_elements(_enqueue_items.runs) WITH ORDINALITY AS e(item, position)
                 ORDER BY e.position
            LOOP
                BEGIN
                    PERFORM (v_item ->> 'priority')::integer, (v_item ->> 'run_after')::timestamptz,
                            (v_item ->> 'max_attempts')::integer, (v_item ->> 'run_id')::uuid;
                EXCEPTION
                    WHEN invalid_text_representation OR numeric_value_out_of_range OR invalid_datetime_format
                         OR datetime_field_overflow THEN
                        RAISE EXCEPTION 'runs[%]: %', v_index, SQLERRM USING ERRCODE = 'ZP008';
                END;
            END LOOP;
            RAISE;
    END;

    SELECT format('runs[%s]: %s', i.position,
                  CASE WHEN jsonb_typeof(i.payload) IS DISTINCT FROM 'object' THEN 'payload must be a JSON object'
                       WHEN jsonb_typeof(i.metadata) IS DISTINCT FROM 'object' THEN 'metadata must be a JSON object'
                       WHEN i.max_attempts NOT BETWEEN 1 AND 1000 THEN 'max_attempts must be between 1 and 1000'
                       WHEN NOT isfinite(i.run_after) THEN 'run_after must be a finite timestamp'
                       WHEN length(i.idempotency_key) NOT BETWEEN 1 AND 500
                           THEN 'idempotency_key must be NULL or 1 to 500 characters'
                       ELSE 'thread_id must be a non-empty string of at most 200 characters' END)
      INTO v_error
      FROM unnest(v_items) AS i
     WHERE jsonb_typeof(i.payload) IS DISTINCT FROM 'object'
        OR jsonb_typeof(i.metadata) IS DISTINCT FROM 'object'
        OR i.max_attempts NOT BETWEEN 1 AND 1000
        OR NOT isfinite(i.run_after)
        OR length(i.idempotency_key) NOT BETWEEN 1 AND 500
        OR i.thread_id = '' OR length(i.thread_id) > 200
     ORDER BY i.position
     LIMIT 1;
    PERFORM zeroth._require(v_error IS NULL, v_error);
    RETURN v_items;
END
$$;

--
-- Name: FUNCTION _enqueue_items(runs jsonb); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._enqueue_items(runs jsonb) IS 'Internal: the items of an enqueue_runs batch, parsed and checked (ZP008 naming the first bad one), each with the run_id it will get.';

--
-- Name: _explain_admin_miss(text, text, uuid, text, zeroth.run_status[]); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._explain_admin_miss(tenant_id text, workspace_key text, run_id uuid, transition text, allowed zeroth.run_status[]) RETURNS void
    LANGUAGE plpgsql STABLE
    AS $$
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

--
-- Name: FUNCTION _explain_admin_miss(tenant_id text, workspace_key text, run_id uuid, transition text, allowed zeroth.run_status[]); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._explain_admin_miss(tenant_id text, workspace_key text, run_id uuid, transition text, allowed zeroth.run_status[]) IS 'Internal: raise ZP001 (no such run in scope) or ZP003 (wrong status) after an admin UPDATE matched nothing.';

--
-- Name: _explain_fenced_miss(text, text, uuid, text, bigint, timestamp with time zone, text, zeroth.run_status[]); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._explain_fenced_miss(tenant_id text, workspace_key text, run_id uuid, worker_id text, generation bigint, at timestamp with time zone, transition text, allowed zeroth.run_status[]) RETURNS void
    LANGUAGE plpgsql STABLE
    AS $$
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

--
-- Name: FUNCTION _explain_fenced_miss(tenant_id text, workspace_key text, run_id uuid, worker_id text, generation bigint, at timestamp with time zone, transition text, allowed zeroth.run_status[]); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._explain_fenced_miss(tenant_id text, workspace_key text, run_id uuid, worker_id text, generation bigint, at timestamp with time zone, transition text, allowed zeroth.run_status[]) IS 'Internal: after a fenced UPDATE matched nothing, raise ZP003 if the lease is still held (wrong status) rather than fenced out.';

--
-- Name: _free_slot(text, text, uuid, bigint); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._free_slot(tenant_id text, workspace_key text, run_id uuid, generation bigint) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
BEGIN
    UPDATE zeroth.admission_slots s
       SET run_id = NULL, lease_generation = NULL
     WHERE s.run_id = _free_slot.run_id
       AND s.tenant_id = _free_slot.tenant_id
       AND s.workspace_key = _free_slot.workspace_key
       AND s.lease_generation = _free_slot.generation;
    RETURN FOUND;
END
$$;

--
-- Name: FUNCTION _free_slot(tenant_id text, workspace_key text, run_id uuid, generation bigint); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._free_slot(tenant_id text, workspace_key text, run_id uuid, generation bigint) IS 'Internal: free the admission slot naming exactly this (run, generation); true when one was freed.';

--
-- Name: _grace_interval(double precision); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._grace_interval(grace_seconds double precision) RETURNS interval
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF grace_seconds IS NULL OR grace_seconds = 'NaN'::float8 OR grace_seconds < 0 OR grace_seconds > 86400 THEN
        RAISE EXCEPTION 'grace_seconds must be in [0, 86400], got %', coalesce(grace_seconds::text, 'NULL')
            USING ERRCODE = 'ZP008';
    END IF;
    RETURN make_interval(secs => grace_seconds);
END
$$;

--
-- Name: FUNCTION _grace_interval(grace_seconds double precision); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._grace_interval(grace_seconds double precision) IS 'Internal: validates a takeover grace in seconds (ZP008 unless 0 <= s <= 86400).';

--
-- Name: checkpoints; Type: TABLE; Schema: zeroth; Owner: -
--
CREATE TABLE zeroth.checkpoints (
    checkpoint_id uuid NOT NULL,
    tenant_id text NOT NULL,
    workspace_key text NOT NULL,
    run_id uuid NOT NULL,
    checkpoint_order bigint NOT NULL,
    lease_generation bigint NOT NULL,
    data jsonb NOT NULL,
    created_at timestamp with time zone NOT NULL
);

--
-- Name: TABLE checkpoints; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON TABLE zeroth.checkpoints IS 'Ordered checkpoints per run, written fenced by save_checkpoint; claim_orphaned hands the latest to the next owner.';

--
-- Name: _latest_checkpoint_id(text, text, uuid); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._latest_checkpoint_id(tenant_id text, workspace_key text, run_id uuid) RETURNS uuid
    LANGUAGE sql STABLE
    RETURN (SELECT k.checkpoint_id FROM zeroth.checkpoints k WHERE ((k.tenant_id = _latest_checkpoint_id.tenant_id) AND (k.workspace_key = _latest_checkpoint_id.workspace_key) AND (k.run_id = _latest_checkpoint_id.run_id)) ORDER BY k.checkpoint_order DESC LIMIT 1);

--
-- Name: FUNCTION _latest_checkpoint_id(tenant_id text, workspace_key text, run_id uuid); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._latest_checkpoint_id(tenant_id text, workspace_key text, run_id uuid) IS 'Internal: the checkpoint with the highest checkpoint_order of a run, or NULL.';

--
-- Name: _lease_interval(double precision); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._lease_interval(lease_seconds double precision) RETURNS interval
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF lease_seconds IS NULL OR lease_seconds = 'NaN'::float8 OR lease_seconds <= 0 OR lease_seconds > 86400 THEN
        RAISE EXCEPTION 'lease_seconds must be in (0, 86400], got %', coalesce(lease_seconds::text, 'NULL')
            USING ERRCODE = 'ZP008';
    END IF;
    RETURN make_interval(secs => lease_seconds);
END
$$;

--
-- Name: FUNCTION _lease_interval(lease_seconds double precision); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._lease_interval(lease_seconds double precision) IS 'Internal: validates a lease duration in seconds (ZP008 unless 0 < s <= 86400).';

--
-- Name: _lease_locked_runs(text, text, uuid[], integer[], text, timestamp with time zone, interval, integer, integer, boolean); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._lease_locked_runs(tenant_id text, workspace_key text, run_ids uuid[], slots integer[], worker_id text, at timestamp with time zone, lease interval, active_count integer, concurrency_limit integer, start boolean) RETURNS SETOF zeroth.claimed_run
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
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
               attempts = CASE WHEN r.status = 'running' OR _lease_locked_runs.start
                               THEN r.attempts + 1 ELSE r.attempts END,
               started_at = CASE WHEN _lease_locked_runs.start AND r.status = 'pending'
                                 THEN _lease_locked_runs.at ELSE r.started_at END,
               updated_at = _lease_locked_runs.at
          FROM wanted w
         WHERE r.tenant_id = _lease_locked_runs.tenant_id
           AND r.workspace_key = _lease_locked_runs.workspace_key
           -- By primary key with the array (a generic plan is made once per session, maybe
           -- while the table was empty; it must not come to scan the scope per claimed run).
           AND r.run_id = ANY (_lease_locked_runs.run_ids)
           AND r.run_id = w.run_id
        RETURNING r.*, w.position
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
           false, _lease_locked_runs.concurrency_limit
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

--
-- Name: FUNCTION _lease_locked_runs(tenant_id text, workspace_key text, run_ids uuid[], slots integer[], worker_id text, at timestamp with time zone, lease interval, active_count integer, concurrency_limit integer, start boolean); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._lease_locked_runs(tenant_id text, workspace_key text, run_ids uuid[], slots integer[], worker_id text, at timestamp with time zone, lease interval, active_count integer, concurrency_limit integer, start boolean) IS 'Internal: lease runs (and slots) the caller already locked; with start make pending ones running; count an attempt per start and per re-leased orphan. The shared second half of claim_pending, claim_and_start and claim_orphaned.';

--
-- Name: _now(); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._now() RETURNS timestamp with time zone
    LANGUAGE sql
    RETURN clock_timestamp();

--
-- Name: FUNCTION _now(); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._now() IS 'Internal: the database clock, clock_timestamp() (not now(): a caller may make several calls in one transaction).';

--
-- Name: runs; Type: TABLE; Schema: zeroth; Owner: -
--
CREATE TABLE zeroth.runs (
    run_id uuid NOT NULL,
    tenant_id text NOT NULL,
    workspace_id text,
    workspace_key text GENERATED ALWAYS AS (
CASE
    WHEN (workspace_id IS NULL) THEN ''::text
    ELSE ('w:'::text || workspace_id)
END) STORED NOT NULL,
    deployment_ref text NOT NULL,
    thread_id text,
    status zeroth.run_status DEFAULT 'pending'::zeroth.run_status NOT NULL,
    wait_reason text,
    priority integer DEFAULT 0 NOT NULL,
    run_after timestamp with time zone NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    max_attempts integer DEFAULT 3 NOT NULL,
    created_at timestamp with time zone NOT NULL,
    updated_at timestamp with time zone NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    payload jsonb DEFAULT '{}'::jsonb NOT NULL,
    output jsonb,
    error jsonb,
    metadata jsonb DEFAULT '{}'::jsonb NOT NULL,
    progress jsonb,
    idempotency_key text,
    checkpoint_seq bigint DEFAULT 0 NOT NULL,
    lease_worker_id text,
    lease_acquired_at timestamp with time zone,
    lease_expires_at timestamp with time zone,
    lease_generation bigint DEFAULT 0 NOT NULL,
    admission_slot integer,
    recovery_checkpoint_id uuid,
    cancel_action text,
    cancel_requested_at timestamp with time zone,
    dead_lettered_at timestamp with time zone,
    thread_queued_at timestamp with time zone,
    resumable boolean DEFAULT true NOT NULL,
    accounting jsonb,
    hand_backs integer DEFAULT 0 NOT NULL,
    CONSTRAINT runs_accounting_object CHECK (((accounting IS NULL) OR (jsonb_typeof(accounting) = 'object'::text))),
    CONSTRAINT runs_attempts_valid CHECK (((attempts >= 0) AND (max_attempts >= 1))),
    CONSTRAINT runs_cancel_action_valid CHECK (((cancel_action IS NULL) OR (cancel_action = ANY (ARRAY['cancel'::text, 'interrupt'::text, 'rollback'::text])))),
    CONSTRAINT runs_deployment_nonempty CHECK ((deployment_ref <> ''::text)),
    CONSTRAINT runs_generation_nonnegative CHECK ((lease_generation >= 0)),
    CONSTRAINT runs_hand_backs_nonnegative CHECK ((hand_backs >= 0)),
    CONSTRAINT runs_lease_complete CHECK ((((lease_worker_id IS NULL) = (lease_expires_at IS NULL)) AND ((lease_worker_id IS NULL) = (lease_acquired_at IS NULL)))),
    CONSTRAINT runs_lease_only_on_active CHECK (((lease_worker_id IS NULL) OR (status = ANY (ARRAY['pending'::zeroth.run_status, 'running'::zeroth.run_status])))),
    CONSTRAINT runs_metadata_object CHECK ((jsonb_typeof(metadata) = 'object'::text)),
    CONSTRAINT runs_payload_object CHECK ((jsonb_typeof(payload) = 'object'::text)),
    CONSTRAINT runs_running_has_lease CHECK (((status <> 'running'::zeroth.run_status) OR (lease_worker_id IS NOT NULL))),
    CONSTRAINT runs_slot_needs_lease CHECK (((admission_slot IS NULL) OR (lease_worker_id IS NOT NULL))),
    CONSTRAINT runs_tenant_nonempty CHECK ((tenant_id <> ''::text)),
    CONSTRAINT runs_thread_queue_waits CHECK (((thread_queued_at IS NULL) OR ((status = 'waiting'::zeroth.run_status) AND (thread_id IS NOT NULL)))),
    CONSTRAINT runs_wait_reason_only_waiting CHECK (((wait_reason IS NULL) OR (status = 'waiting'::zeroth.run_status)))
)
WITH (fillfactor='80', autovacuum_vacuum_scale_factor='0.01', autovacuum_vacuum_threshold='1000', autovacuum_vacuum_insert_scale_factor='0.05', autovacuum_analyze_scale_factor='0.02', autovacuum_analyze_threshold='1000');

--
-- Name: TABLE runs; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON TABLE zeroth.runs IS 'One row per run. Write it only through the zeroth.* functions; every lease-holder write is fenced by (lease_worker_id, lease_generation, lease_expires_at).';

--
-- Name: COLUMN runs.attempts; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON COLUMN zeroth.runs.attempts IS 'Number of attempts: counted when a run starts (start_run, claim_and_start) and when an orphan is re-leased after its lease expired (claim_orphaned). Given back only by the live holder stopping gracefully: pause_run (waiting is not a failure) and the first max_attempts hand-backs (hand_back_to_pending). So attempts never exceed max_attempts through the functions.';

--
-- Name: COLUMN runs.checkpoint_seq; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON COLUMN zeroth.runs.checkpoint_seq IS 'Number of checkpoints saved; the next checkpoint_order.';

--
-- Name: COLUMN runs.lease_generation; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON COLUMN zeroth.runs.lease_generation IS 'Fencing token: bumped by every change of owner (claim_pending, claim_orphaned); never decreases, never reset.';

--
-- Name: COLUMN runs.admission_slot; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON COLUMN zeroth.runs.admission_slot IS 'The admission_slots.slot_no this lease holds when it was claimed under max_concurrency; NULL otherwise.';

--
-- Name: COLUMN runs.thread_queued_at; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON COLUMN zeroth.runs.thread_queued_at IS 'Set while the run waits behind the active run of its thread (status waiting); the queue is ordered by it. Cleared when the run is promoted to pending or cancelled.';

--
-- Name: COLUMN runs.resumable; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON COLUMN zeroth.runs.resumable IS 'When its owner dies: true = another worker re-executes it (claim_orphaned, claim_for_takeover hands it back); false = claim_for_takeover / reconcile_thread_runs end it as failed with a stop reason (deer-flow). admit_run defaults to false for admit-and-own runs.';

--
-- Name: COLUMN runs.accounting; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON COLUMN zeroth.runs.accounting IS 'Caller-defined JSON object (token and message counts, …) merged by update_run_progress.';

--
-- Name: COLUMN runs.hand_backs; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON COLUMN zeroth.runs.hand_backs IS 'How many times a live holder handed the run back (hand_back_to_pending). The first max_attempts hand-backs give their attempt back; later ones keep it counted, and one that finds the attempts used up dead-letters the run (stop_reason attempts_exhausted). redrive_run resets it.';

--
-- Name: _lock_leased_run(text, text, uuid, text, bigint); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._lock_leased_run(tenant_id text, workspace_key text, run_id uuid, worker_id text, generation bigint) RETURNS zeroth.run_status
    LANGUAGE sql
    BEGIN ATOMIC
 SELECT r.status
    FROM zeroth.runs r
   WHERE ((r.tenant_id = _lock_leased_run.tenant_id) AND (r.workspace_key = _lock_leased_run.workspace_key) AND (r.run_id = _lock_leased_run.run_id) AND (r.lease_worker_id = _lock_leased_run.worker_id) AND (r.lease_generation = _lock_leased_run.generation) AND (r.lease_expires_at >= zeroth._now()))
  FOR UPDATE OF r;
END;

--
-- Name: FUNCTION _lock_leased_run(tenant_id text, workspace_key text, run_id uuid, worker_id text, generation bigint); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._lock_leased_run(tenant_id text, workspace_key text, run_id uuid, worker_id text, generation bigint) IS 'Internal: lock the run row a fenced write names when its lease is (worker_id, generation) and not expired; return its status (NULL: not that lease). Callers read the clock after it.';

--
-- Name: admission_slots; Type: TABLE; Schema: zeroth; Owner: -
--
CREATE TABLE zeroth.admission_slots (
    tenant_id text NOT NULL,
    workspace_key text NOT NULL,
    deployment_ref text NOT NULL,
    slot_no integer NOT NULL,
    run_id uuid,
    lease_generation bigint,
    CONSTRAINT admission_slots_holder_complete CHECK (((run_id IS NULL) = (lease_generation IS NULL))),
    CONSTRAINT admission_slots_slot_positive CHECK ((slot_no >= 1))
)
WITH (fillfactor='50');

--
-- Name: TABLE admission_slots; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON TABLE zeroth.admission_slots IS 'Concurrency slots per (tenant, workspace, deployment). A slot names (run_id, lease_generation); it is held while that run holds that generation''s lease in this slot (runs.admission_slot) and the lease is live. The run row is the only copy of the lease.';

--
-- Name: _lock_slot(text, text, uuid, bigint); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._lock_slot(tenant_id text, workspace_key text, run_id uuid, generation bigint) RETURNS void
    LANGUAGE sql
    BEGIN ATOMIC
 SELECT 1
    FROM zeroth.admission_slots s
   WHERE ((s.run_id = _lock_slot.run_id) AND (s.tenant_id = _lock_slot.tenant_id) AND (s.workspace_key = _lock_slot.workspace_key) AND (s.lease_generation = _lock_slot.generation))
  FOR UPDATE OF s;
END;

--
-- Name: FUNCTION _lock_slot(tenant_id text, workspace_key text, run_id uuid, generation bigint); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._lock_slot(tenant_id text, workspace_key text, run_id uuid, generation bigint) IS 'Internal: lock the admission slot naming exactly this (run, generation), changing nothing.';

--
-- Name: _thread_stripe(text, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._thread_stripe(tenant_id text, workspace_key text, thread_id text) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN ((hashtextextended((ARRAY[tenant_id, workspace_key, thread_id])::text, (1516464242)::bigint) & (16383)::bigint))::integer;

--
-- Name: FUNCTION _thread_stripe(tenant_id text, workspace_key text, thread_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._thread_stripe(tenant_id text, workspace_key text, thread_id text) IS 'Internal: the zeroth.lock_stripes row (0..16383) that serialises admissions of this thread.';

--
-- Name: lock_stripes; Type: TABLE; Schema: zeroth; Owner: -
--
CREATE TABLE zeroth.lock_stripes (
    stripe integer NOT NULL
);

--
-- Name: TABLE lock_stripes; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON TABLE zeroth.lock_stripes IS 'Row locks that serialise the admissions of one thread (stripes 0..16383) and the creation of a scope''s admission slots (16384..17407), by hash. Locked by zeroth functions only: no role but zeroth_owner can read or lock it.';

--
-- Name: _lock_thread(text, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._lock_thread(tenant_id text, workspace_key text, thread_id text) RETURNS void
    LANGUAGE sql
    BEGIN ATOMIC
 SELECT 1
    FROM zeroth.lock_stripes l
   WHERE (l.stripe = zeroth._thread_stripe(_lock_thread.tenant_id, _lock_thread.workspace_key, _lock_thread.thread_id))
  FOR UPDATE OF l;
END;

--
-- Name: FUNCTION _lock_thread(tenant_id text, workspace_key text, thread_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._lock_thread(tenant_id text, workspace_key text, thread_id text) IS 'Internal: lock the thread''s stripe of zeroth.lock_stripes until the transaction ends (admissions, redrive).';

--
-- Name: _lock_thread_active(text, text, text, timestamp with time zone); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._lock_thread_active(tenant_id text, workspace_key text, thread_id text, at timestamp with time zone) RETURNS zeroth.runs
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_id  uuid;
    v_run zeroth.runs;
BEGIN
    FOR v_attempt IN 1..100 LOOP
        SELECT r.run_id INTO v_id
          FROM zeroth.runs r
         WHERE r.tenant_id = _lock_thread_active.tenant_id
           AND r.workspace_key = _lock_thread_active.workspace_key
           AND r.thread_id = _lock_thread_active.thread_id
           AND r.status IN ('pending', 'running', 'waiting')
           AND r.thread_queued_at IS NULL;
        IF NOT FOUND THEN
            IF zeroth._promote_thread_head(_lock_thread_active.tenant_id, _lock_thread_active.workspace_key,
                                           _lock_thread_active.thread_id, _lock_thread_active.at) IS NULL THEN
                RETURN v_run;
            END IF;
            CONTINUE;
        END IF;
        PERFORM 1 FROM zeroth.admission_slots s
         WHERE s.run_id = v_id AND s.tenant_id = _lock_thread_active.tenant_id
           AND s.workspace_key = _lock_thread_active.workspace_key
           FOR UPDATE;
        SELECT r.* INTO v_run
          FROM zeroth.runs r
         WHERE r.tenant_id = _lock_thread_active.tenant_id
           AND r.workspace_key = _lock_thread_active.workspace_key
           AND r.run_id = v_id
           AND r.status IN ('pending', 'running', 'waiting')
           AND r.thread_queued_at IS NULL
           FOR UPDATE;
        IF FOUND THEN
            RETURN v_run;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'the active run of thread % kept changing', thread_id USING ERRCODE = '40001';
END
$$;

--
-- Name: FUNCTION _lock_thread_active(tenant_id text, workspace_key text, thread_id text, at timestamp with time zone); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._lock_thread_active(tenant_id text, workspace_key text, thread_id text, at timestamp with time zone) IS 'Internal: lock (slots, then run) and return the active run of a thread, or a NULL row when idle; promotes a stranded queue head.';

--
-- Name: _mark_queue_changed(text, text, uuid); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._mark_queue_changed(tenant_id text, workspace_key text, run_id uuid) RETURNS void
    LANGUAGE sql
    BEGIN ATOMIC
 UPDATE zeroth.runs r SET updated_at = r.updated_at
   WHERE ((r.tenant_id = _mark_queue_changed.tenant_id) AND (r.workspace_key = _mark_queue_changed.workspace_key) AND (r.run_id = _mark_queue_changed.run_id));
END;

--
-- Name: FUNCTION _mark_queue_changed(tenant_id text, workspace_key text, run_id uuid); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._mark_queue_changed(tenant_id text, workspace_key text, run_id uuid) IS 'Internal: write the thread''s active run row (no column changed) when a run joins its queue, so a REPEATABLE READ / SERIALIZABLE finisher with an older snapshot fails with 40001 instead of stranding the queue.';

--
-- Name: notification_secret; Type: TABLE; Schema: zeroth; Owner: -
--
CREATE TABLE zeroth.notification_secret (
    id boolean DEFAULT true NOT NULL,
    secret text NOT NULL,
    CONSTRAINT notification_secret_long CHECK ((length(secret) >= 32)),
    CONSTRAINT notification_secret_one_row CHECK (id)
);

--
-- Name: TABLE notification_secret; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON TABLE zeroth.notification_secret IS 'The per-database random secret that NOTIFY payload keys are derived from (zeroth._notify_key). Readable by zeroth_owner only.';

--
-- Name: _notify_key(text, text[]); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._notify_key(kind text, subject text[]) RETURNS text
    LANGUAGE sql STABLE
    RETURN (SELECT "left"(encode(sha256(convert_to(((((s.secret || chr(31)) || _notify_key.kind) || chr(31)) || (_notify_key.subject)::text), 'UTF8'::name)), 'hex'::text), 32) AS "left" FROM zeroth.notification_secret s);

--
-- Name: FUNCTION _notify_key(kind text, subject text[]); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._notify_key(kind text, subject text[]) IS 'Internal: the opaque NOTIFY payload for a subject: 32 hex digits of sha256(secret, kind, subject).';

--
-- Name: _notify_control(text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._notify_control(worker_id text) RETURNS void
    LANGUAGE sql
    BEGIN ATOMIC
 SELECT pg_notify('zeroth_control'::text, zeroth._notify_key('control'::text, ARRAY[worker_id])) AS pg_notify;
END;

--
-- Name: FUNCTION _notify_control(worker_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._notify_control(worker_id text) IS 'Internal: NOTIFY zeroth_control with the opaque key of a worker id.';

--
-- Name: _notify_wakeup(text, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._notify_wakeup(deployment_ref text, tenant_id text, workspace_id text) RETURNS void
    LANGUAGE sql
    BEGIN ATOMIC
 SELECT pg_notify('zeroth_wakeup'::text, zeroth._notify_key('wakeup'::text, ARRAY[tenant_id, workspace_id, deployment_ref])) AS pg_notify;
END;

--
-- Name: FUNCTION _notify_wakeup(deployment_ref text, tenant_id text, workspace_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._notify_wakeup(deployment_ref text, tenant_id text, workspace_id text) IS 'Internal: NOTIFY zeroth_wakeup with the opaque key of (tenant, workspace, deployment).';

--
-- Name: _promote_thread_head(text, text, text, timestamp with time zone); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._promote_thread_head(tenant_id text, workspace_key text, thread_id text, at timestamp with time zone) RETURNS uuid
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_id  uuid;
    v_run record;
BEGIN
    FOR v_attempt IN 1..100 LOOP
        SELECT r.run_id INTO v_id
          FROM zeroth.runs r
         WHERE r.tenant_id = _promote_thread_head.tenant_id
           AND r.workspace_key = _promote_thread_head.workspace_key
           AND r.thread_id = _promote_thread_head.thread_id
           AND r.thread_queued_at IS NOT NULL
         ORDER BY r.thread_queued_at, r.run_id
         LIMIT 1
           FOR UPDATE;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        -- By primary key, the queue mark read from the locked row: named in the predicate, it let
        -- a generic plan made on a small table reach the run through runs_thread_queue_idx and
        -- walk every queued run of the scope (the thread-finished trigger path).
        WITH locked AS MATERIALIZED (
            SELECT r.run_id, r.thread_queued_at
              FROM zeroth.runs r
             WHERE r.tenant_id = _promote_thread_head.tenant_id
               AND r.workspace_key = _promote_thread_head.workspace_key
               AND r.run_id = v_id
               FOR UPDATE OF r
        )
        UPDATE zeroth.runs r
           SET status = 'pending', thread_queued_at = NULL, wait_reason = NULL, updated_at = _promote_thread_head.at
          FROM locked l
         WHERE r.tenant_id = _promote_thread_head.tenant_id
           AND r.workspace_key = _promote_thread_head.workspace_key
           AND r.run_id = v_id
           AND r.run_id = l.run_id
           AND l.thread_queued_at IS NOT NULL
        RETURNING r.deployment_ref, r.workspace_id, r.run_after INTO v_run;
        IF FOUND THEN
            IF v_run.run_after <= _promote_thread_head.at THEN
                PERFORM zeroth._notify_wakeup(v_run.deployment_ref, _promote_thread_head.tenant_id, v_run.workspace_id);
            END IF;
            RETURN v_id;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'the queue of thread % kept changing', thread_id USING ERRCODE = '40001';
END
$$;

--
-- Name: FUNCTION _promote_thread_head(tenant_id text, workspace_key text, thread_id text, at timestamp with time zone); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._promote_thread_head(tenant_id text, workspace_key text, thread_id text, at timestamp with time zone) IS 'Internal: queued head of a thread → pending (FIFO by thread_queued_at); notifies zeroth_wakeup when it is due. Returns the promoted run or NULL.';

--
-- Name: _queue_position(text, text, text, timestamp with time zone); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._queue_position(tenant_id text, workspace_key text, thread_id text, at timestamp with time zone) RETURNS timestamp with time zone
    LANGUAGE sql STABLE
    RETURN GREATEST(at, (SELECT (max(r.thread_queued_at) + '00:00:00.000001'::interval) FROM zeroth.runs r WHERE ((r.tenant_id = _queue_position.tenant_id) AND (r.workspace_key = _queue_position.workspace_key) AND (r.thread_id = _queue_position.thread_id) AND (r.thread_queued_at IS NOT NULL))));

--
-- Name: FUNCTION _queue_position(tenant_id text, workspace_key text, thread_id text, at timestamp with time zone); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._queue_position(tenant_id text, workspace_key text, thread_id text, at timestamp with time zone) IS 'Internal: thread_queued_at for a run joining the queue: max(at, last queued + 1 µs), so the queue is FIFO.';

--
-- Name: _require(boolean, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._require(condition boolean, message text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF condition IS NOT TRUE THEN
        RAISE EXCEPTION '%', message USING ERRCODE = 'ZP008';
    END IF;
END
$$;

--
-- Name: FUNCTION _require(condition boolean, message text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._require(condition boolean, message text) IS 'Internal: raises ZP008 invalid_argument with the message unless the condition is true.';

--
-- Name: _require_identifier(text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._require_identifier(value text, name text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF value IS NULL OR value = '' OR length(value) > 200 THEN
        RAISE EXCEPTION '% must be a non-empty string of at most 200 characters', name USING ERRCODE = 'ZP008';
    END IF;
END
$$;

--
-- Name: FUNCTION _require_identifier(value text, name text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._require_identifier(value text, name text) IS 'Internal: ZP008 unless value is a non-empty identifier of at most 200 characters.';

--
-- Name: _require_lease_batch(uuid[], bigint[]); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._require_lease_batch(run_ids uuid[], generations bigint[]) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
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

--
-- Name: FUNCTION _require_lease_batch(run_ids uuid[], generations bigint[]); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._require_lease_batch(run_ids uuid[], generations bigint[]) IS 'Internal: ZP008 unless run_ids and generations are equal-length, NULL-free, at most 1000 long, without a repeated run.';

--
-- Name: _retry_after(timestamp with time zone, interval, timestamp with time zone); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._retry_after(lease_expires_at timestamp with time zone, grace interval, at timestamp with time zone) RETURNS integer
    LANGUAGE sql IMMUTABLE
    RETURN CASE WHEN (lease_expires_at IS NOT NULL) THEN (LEAST(GREATEST((1)::numeric, ceil(EXTRACT(epoch FROM ((lease_expires_at + grace) - at)))), (2147483647)::numeric))::integer ELSE NULL::integer END;

--
-- Name: FUNCTION _retry_after(lease_expires_at timestamp with time zone, grace interval, at timestamp with time zone); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._retry_after(lease_expires_at timestamp with time zone, grace interval, at timestamp with time zone) IS 'Internal: max(1, ceil(lease_expires_at + grace - at)) in seconds, clamped to the integer range; NULL without a lease.';

--
-- Name: _scope_tenant(text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._scope_tenant(tenant_id text, workspace_id text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN CASE WHEN ((tenant_id IS NULL) AND (workspace_id IS NOT NULL)) THEN NULL::text ELSE COALESCE(tenant_id, 'default'::text) END;

--
-- Name: FUNCTION _scope_tenant(tenant_id text, workspace_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._scope_tenant(tenant_id text, workspace_id text) IS 'Internal: effective tenant of a call (NULL = the call can match nothing).';

--
-- Name: _stop_error(text, text, text, bigint, jsonb); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._stop_error(stop_reason text, message text, worker_id text, generation bigint, previous jsonb) RETURNS jsonb
    LANGUAGE sql IMMUTABLE
    RETURN (jsonb_build_object('stop_reason', stop_reason, 'message', message, 'worker_id', worker_id, 'lease_generation', generation) || CASE WHEN (previous IS NULL) THEN '{}'::jsonb ELSE jsonb_build_object('previous_error', previous) END);

--
-- Name: FUNCTION _stop_error(stop_reason text, message text, worker_id text, generation bigint, previous jsonb); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._stop_error(stop_reason text, message text, worker_id text, generation bigint, previous jsonb) IS 'Internal: the error document of a run ended by someone other than its owner ({stop_reason, message, worker_id, lease_generation[, previous_error]}).';

--
-- Name: _take_over(text, text, uuid, interval, timestamp with time zone, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._take_over(tenant_id text, workspace_key text, run_id uuid, grace interval, at timestamp with time zone, stop_reason text, message text) RETURNS SETOF zeroth.takeover
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_run    record;
    v_slot   integer;
    v_result zeroth.takeover;
BEGIN
    SELECT r.admission_slot, r.deployment_ref INTO v_run
      FROM zeroth.runs r
     WHERE r.tenant_id = _take_over.tenant_id AND r.workspace_key = _take_over.workspace_key
       AND r.run_id = _take_over.run_id;
    IF v_run.admission_slot IS NOT NULL THEN
        SELECT s.slot_no INTO v_slot
          FROM zeroth.admission_slots s
         WHERE s.tenant_id = _take_over.tenant_id AND s.workspace_key = _take_over.workspace_key
           AND s.deployment_ref = v_run.deployment_ref AND s.slot_no = v_run.admission_slot
           FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN;
        END IF;
    END IF;

    SELECT r.status, r.thread_id, r.lease_worker_id, r.lease_generation, r.lease_expires_at, r.resumable,
           r.cancel_action, r.deployment_ref, r.workspace_id, r.error, r.attempts, r.max_attempts
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

    v_result := ROW(_take_over.run_id, v_run.thread_id,
                    CASE WHEN v_run.cancel_action IS NOT NULL THEN 'cancelled'
                         WHEN NOT v_run.resumable THEN 'failed'
                         WHEN v_run.status = 'running' AND v_run.attempts >= v_run.max_attempts THEN 'dead_lettered'
                         ELSE 'requeued' END,
                    NULL, v_run.lease_worker_id, v_run.lease_generation)::zeroth.takeover;
    UPDATE zeroth.runs r
       SET status = CASE v_result.outcome WHEN 'cancelled' THEN 'cancelled'::zeroth.run_status
                                          WHEN 'requeued' THEN 'pending'::zeroth.run_status
                                          ELSE 'failed'::zeroth.run_status END,
           error = CASE v_result.outcome
                       WHEN 'requeued' THEN r.error
                       WHEN 'dead_lettered' THEN zeroth._stop_error('attempts_exhausted', format(
                                'worker %s stopped renewing its lease (expired at %s) on attempt %s of %s; '
                                'a run whose worker dies every time is not retried again',
                                r.lease_worker_id, r.lease_expires_at, r.attempts, r.max_attempts),
                            r.lease_worker_id, r.lease_generation, r.error)
                       ELSE zeroth._stop_error(_take_over.stop_reason, coalesce(_take_over.message, format(
                                'run lease expired: worker %s stopped renewing (expired at %s)',
                                r.lease_worker_id, r.lease_expires_at)),
                            r.lease_worker_id, r.lease_generation, r.error) END,
           dead_lettered_at = CASE WHEN v_result.outcome = 'dead_lettered' THEN _take_over.at ELSE r.dead_lettered_at END,
           finished_at = CASE WHEN v_result.outcome = 'requeued' THEN NULL ELSE _take_over.at END,
           updated_at = _take_over.at,
           lease_worker_id = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
           admission_slot = NULL, recovery_checkpoint_id = NULL
     WHERE r.tenant_id = _take_over.tenant_id AND r.workspace_key = _take_over.workspace_key
       AND r.run_id = _take_over.run_id
    RETURNING r.status INTO v_result.status;
    PERFORM zeroth._free_slot(_take_over.tenant_id, _take_over.workspace_key, _take_over.run_id,
                              v_run.lease_generation);
    -- A requeued run is claimable now; an ended one may have freed a slot or promoted its thread
    -- (the trigger notifies for the promoted run itself).
    PERFORM zeroth._notify_wakeup(v_run.deployment_ref, _take_over.tenant_id, v_run.workspace_id);
    RETURN NEXT v_result;
END
$$;

--
-- Name: FUNCTION _take_over(tenant_id text, workspace_key text, run_id uuid, grace interval, at timestamp with time zone, stop_reason text, message text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._take_over(tenant_id text, workspace_key text, run_id uuid, grace interval, at timestamp with time zone, stop_reason text, message text) IS 'Internal: the takeover of one run whose lease expired past grace (SKIP LOCKED throughout): cancelled | failed | dead_lettered | requeued. Shared by claim_for_takeover, reconcile_thread_runs and claim_orphaned.';

--
-- Name: _take_slots(text, text, text, integer, integer, timestamp with time zone); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._take_slots(tenant_id text, workspace_key text, deployment_ref text, max_concurrency integer, wanted integer, at timestamp with time zone, OUT slots integer[], OUT active_count integer) RETURNS record
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
DECLARE
    v_free    integer[];
    v_locked  integer[];
    v_holders uuid[];
    v_named   integer[];
    v_runs    uuid[];
    v_retired integer[];
BEGIN
    -- The scope becomes slot rows: bound what would be written (K rows, indexed keys).
    PERFORM zeroth._require(_take_slots.max_concurrency <= 10000, 'max_concurrency must be at most 10000');
    PERFORM zeroth._require_identifier(_take_slots.tenant_id, 'tenant_id');
    PERFORM zeroth._require(length(_take_slots.workspace_key) <= 202,
                            'workspace_id must be at most 200 characters');
    -- First use of a scope (or a larger K): create the slot rows. Only one session may do it at a
    -- time, and the others must not wait for its transaction (an INSERT that conflicts with an
    -- uncommitted row waits), so the creator takes the scope's stripe of zeroth.lock_stripes with
    -- SKIP LOCKED; a session that misses it finds no free slot this time and reports saturation
    -- until the rows commit. (A row lock: an advisory lock could be held by anyone who connects.)
    IF NOT EXISTS (SELECT 1
                     FROM zeroth.admission_slots s
                    WHERE s.tenant_id = _take_slots.tenant_id
                      AND s.workspace_key = _take_slots.workspace_key
                      AND s.deployment_ref = _take_slots.deployment_ref
                      AND s.slot_no = _take_slots.max_concurrency) THEN
        PERFORM 1 FROM zeroth.lock_stripes l
         WHERE l.stripe = 16384 + (hashtextextended(ARRAY[_take_slots.tenant_id, _take_slots.workspace_key,
                                                          _take_slots.deployment_ref]::text, 7230) & 1023)::integer
           FOR UPDATE SKIP LOCKED;
        IF FOUND THEN
            INSERT INTO zeroth.admission_slots (tenant_id, workspace_key, deployment_ref, slot_no)
            SELECT _take_slots.tenant_id, _take_slots.workspace_key, _take_slots.deployment_ref, g.n
              FROM generate_series(1, _take_slots.max_concurrency) AS g(n)
            ON CONFLICT DO NOTHING;
        END IF;
    END IF;

    -- One pass over the scope's slots: which lease is live (a primary-key probe of its run).
    SELECT count(*) FILTER (WHERE x.live)::integer,
           coalesce(array_agg(x.slot_no ORDER BY x.slot_no)
                        FILTER (WHERE NOT x.live AND x.slot_no <= _take_slots.max_concurrency), '{}')
      INTO active_count, v_free
      FROM (SELECT s.slot_no,
                   s.run_id IS NOT NULL AND EXISTS (
                       SELECT 1 FROM zeroth.runs r
                        WHERE r.tenant_id = s.tenant_id AND r.workspace_key = s.workspace_key
                          AND r.run_id = s.run_id
                          AND r.lease_generation = s.lease_generation
                          AND r.admission_slot = s.slot_no
                          AND r.lease_expires_at >= _take_slots.at) AS live
              FROM zeroth.admission_slots s
             WHERE s.tenant_id = _take_slots.tenant_id
               AND s.workspace_key = _take_slots.workspace_key
               AND s.deployment_ref = _take_slots.deployment_ref) x;

    IF least(_take_slots.wanted, _take_slots.max_concurrency - active_count) <= 0 OR cardinality(v_free) = 0 THEN
        slots := '{}';
        RETURN;
    END IF;

    WITH locked AS MATERIALIZED (
        SELECT s.slot_no, s.run_id
          FROM zeroth.admission_slots s
         WHERE s.tenant_id = _take_slots.tenant_id
           AND s.workspace_key = _take_slots.workspace_key
           AND s.deployment_ref = _take_slots.deployment_ref
           AND s.slot_no = ANY (v_free)
         ORDER BY s.slot_no
         LIMIT least(_take_slots.wanted, _take_slots.max_concurrency - active_count)
           FOR UPDATE OF s SKIP LOCKED
    )
    SELECT coalesce(array_agg(l.slot_no ORDER BY l.slot_no), '{}'),
           coalesce(array_agg(l.run_id) FILTER (WHERE l.run_id IS NOT NULL), '{}')
      INTO v_locked, v_holders
      FROM locked l;

    -- Under the slot locks, in a new snapshot: which of them does their run still name? The runs
    -- are named by primary key with the array: this function's plans are generic and may have
    -- been made on an empty table, and a join by filter would then walk the scope (issue 13).
    SELECT coalesce(array_agg(s.slot_no), '{}'), coalesce(array_agg(s.run_id), '{}')
      INTO v_named, v_runs
      FROM zeroth.admission_slots s
      JOIN zeroth.runs r ON r.tenant_id = s.tenant_id AND r.workspace_key = s.workspace_key
                        AND r.run_id = s.run_id
     WHERE s.tenant_id = _take_slots.tenant_id
       AND s.workspace_key = _take_slots.workspace_key
       AND s.deployment_ref = _take_slots.deployment_ref
       AND s.slot_no = ANY (v_locked)
       AND r.tenant_id = _take_slots.tenant_id AND r.workspace_key = _take_slots.workspace_key
       AND r.run_id = ANY (v_holders)
       AND r.lease_generation = s.lease_generation
       AND r.admission_slot = s.slot_no;

    v_retired := '{}';
    IF cardinality(v_named) > 0 THEN
        WITH dead AS MATERIALIZED (
            SELECT r.tenant_id, r.workspace_key, r.run_id, s.slot_no
              FROM zeroth.admission_slots s
              JOIN zeroth.runs r ON r.tenant_id = s.tenant_id AND r.workspace_key = s.workspace_key
                                AND r.run_id = s.run_id
             WHERE s.tenant_id = _take_slots.tenant_id
               AND s.workspace_key = _take_slots.workspace_key
               AND s.deployment_ref = _take_slots.deployment_ref
               AND s.slot_no = ANY (v_named)
               AND r.tenant_id = _take_slots.tenant_id AND r.workspace_key = _take_slots.workspace_key
               AND r.run_id = ANY (v_runs)
               AND r.lease_generation = s.lease_generation
               AND r.admission_slot = s.slot_no
               AND r.lease_expires_at < _take_slots.at
               FOR UPDATE OF r SKIP LOCKED
        ), retired AS (
            UPDATE zeroth.runs r
               SET admission_slot = NULL
              FROM dead d
             WHERE r.tenant_id = _take_slots.tenant_id AND r.workspace_key = _take_slots.workspace_key
               AND r.run_id = ANY (v_runs) AND r.run_id = d.run_id
            RETURNING d.slot_no
        )
        SELECT coalesce(array_agg(x.slot_no), '{}') INTO v_retired FROM retired x;
    END IF;

    slots := ARRAY(SELECT u FROM unnest(v_locked) AS u
                    WHERE u <> ALL (v_named) OR u = ANY (v_retired)
                    ORDER BY u);
END
$$;

--
-- Name: FUNCTION _take_slots(tenant_id text, workspace_key text, deployment_ref text, max_concurrency integer, wanted integer, at timestamp with time zone, OUT slots integer[], OUT active_count integer); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._take_slots(tenant_id text, workspace_key text, deployment_ref text, max_concurrency integer, wanted integer, at timestamp with time zone, OUT slots integer[], OUT active_count integer) IS 'Internal: lock up to `wanted` free concurrency slots of a scope (SKIP LOCKED), retiring the expired leases they still name, and report the live-slot count.';

--
-- Name: _thread_run(zeroth.runs); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._thread_run(r zeroth.runs) RETURNS zeroth.thread_run
    LANGUAGE sql IMMUTABLE
    RETURN ROW((r).run_id, (r).thread_id, (r).deployment_ref, (r).status, ((r).thread_queued_at IS NOT NULL), (r).wait_reason, (r).attempts, (r).max_attempts, (r).resumable, (r).created_at, (r).started_at, (r).finished_at, (r).updated_at, (r).lease_worker_id, (r).lease_generation, (r).lease_expires_at, (r).cancel_action, (r).cancel_requested_at, (r).idempotency_key, (r).payload, (r).metadata, (r).output, (r).error, (r).progress, (r).accounting)::zeroth.thread_run;

--
-- Name: FUNCTION _thread_run(r zeroth.runs); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._thread_run(r zeroth.runs) IS 'Internal: a runs row as zeroth.thread_run.';

--
-- Name: _thread_run_finished(); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._thread_run_finished() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM pg_notify('zeroth_run_finished', zeroth._notify_key(
        'run_finished', ARRAY[NEW.tenant_id, NEW.workspace_key, NEW.run_id::text]));
    IF OLD.thread_queued_at IS NULL THEN
        PERFORM zeroth._promote_thread_head(NEW.tenant_id, NEW.workspace_key, NEW.thread_id, NEW.updated_at);
    END IF;
    RETURN NULL;
END
$$;

--
-- Name: FUNCTION _thread_run_finished(); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._thread_run_finished() IS 'Internal trigger: a thread run ended → NOTIFY zeroth_run_finished with the run''s opaque key; if it was the active run, promote the queue head.';

--
-- Name: _workspace_key(text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._workspace_key(workspace_id text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN CASE WHEN (workspace_id IS NULL) THEN ''::text ELSE ('w:'::text || workspace_id) END;

--
-- Name: FUNCTION _workspace_key(workspace_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._workspace_key(workspace_id text) IS 'Internal: maps a workspace id (NULL is the null workspace) to the non-null scope key stored in runs.workspace_key.';

--
-- Name: admit_run(text, text, text, text, jsonb, text, text, double precision, double precision, text, jsonb, uuid, integer, integer, boolean, bigint); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.admit_run(deployment_ref text, thread_id text, strategy text DEFAULT 'reject'::text, worker_id text DEFAULT NULL::text, payload jsonb DEFAULT '{}'::jsonb, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, lease_seconds double precision DEFAULT 60, grace_seconds double precision DEFAULT 10, idempotency_key text DEFAULT NULL::text, metadata jsonb DEFAULT '{}'::jsonb, run_id uuid DEFAULT NULL::uuid, priority integer DEFAULT 0, max_attempts integer DEFAULT 3, resumable boolean DEFAULT NULL::boolean, owner_generation bigint DEFAULT NULL::bigint) RETURNS zeroth.admission
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_now       timestamptz := zeroth._now();
    v_lease     interval := zeroth._lease_interval(admit_run.lease_seconds);
    v_grace     interval := zeroth._grace_interval(admit_run.grace_seconds);
    v_tenant    text := zeroth._scope_tenant(admit_run.tenant_id, admit_run.workspace_id);
    v_wskey     text := zeroth._workspace_key(admit_run.workspace_id);
    v_result    zeroth.admission;
    v_displaced jsonb := '[]'::jsonb;
BEGIN
    IF v_tenant IS NULL THEN
        RAISE EXCEPTION 'a workspace_id needs a tenant_id' USING ERRCODE = 'ZP006';
    END IF;
    PERFORM zeroth._require_identifier(admit_run.deployment_ref, 'deployment_ref');
    PERFORM zeroth._require_identifier(admit_run.thread_id, 'thread_id');
    PERFORM zeroth._require_identifier(v_tenant, 'tenant_id');
    IF admit_run.workspace_id IS NOT NULL THEN
        PERFORM zeroth._require_identifier(admit_run.workspace_id, 'workspace_id');
    END IF;
    IF admit_run.worker_id IS NOT NULL THEN
        PERFORM zeroth._require_identifier(admit_run.worker_id, 'worker_id');
    END IF;
    PERFORM zeroth._require(admit_run.owner_generation IS NULL OR admit_run.worker_id IS NOT NULL,
                            'owner_generation needs a worker_id');
    PERFORM zeroth._require(admit_run.strategy IN ('reject', 'interrupt', 'rollback', 'enqueue'),
                            'strategy must be reject, interrupt, rollback or enqueue');
    PERFORM zeroth._require(jsonb_typeof(admit_run.payload) = 'object', 'payload must be a JSON object');
    PERFORM zeroth._require(jsonb_typeof(admit_run.metadata) = 'object', 'metadata must be a JSON object');
    PERFORM zeroth._require(admit_run.priority IS NOT NULL, 'priority must not be NULL');
    PERFORM zeroth._require(admit_run.max_attempts BETWEEN 1 AND 1000, 'max_attempts must be between 1 and 1000');
    PERFORM zeroth._require(admit_run.idempotency_key IS NULL
                            OR length(admit_run.idempotency_key) BETWEEN 1 AND 500,
                            'idempotency_key must be NULL or 1 to 500 characters');

    IF admit_run.strategy IN ('interrupt', 'rollback') THEN
        PERFORM zeroth._lock_thread(v_tenant, v_wskey, admit_run.thread_id);
        -- Under the lock: a retried admission returns its run and interrupts nothing.
        v_result := zeroth._admission_reuse(v_tenant, v_wskey, admit_run.deployment_ref, admit_run.thread_id,
                                            admit_run.idempotency_key, admit_run.run_id, admit_run.worker_id, true);
        IF v_result.outcome IS NOT NULL THEN
            RETURN v_result;
        END IF;
        v_displaced := zeroth._displace(v_tenant, v_wskey, admit_run.thread_id, admit_run.strategy, v_grace, v_now,
                                        admit_run.worker_id, admit_run.owner_generation);
    END IF;
    -- After a displacement the thread is idle, or its active run is stopping for a live owner:
    -- then the new run queues right behind it (the queue was cancelled).
    RETURN zeroth._admit(v_tenant, admit_run.workspace_id, admit_run.deployment_ref, admit_run.thread_id,
                         admit_run.strategy <> 'reject', admit_run.worker_id, admit_run.payload, admit_run.metadata,
                         admit_run.priority, NULL, admit_run.max_attempts, admit_run.idempotency_key,
                         admit_run.run_id, coalesce(admit_run.resumable, admit_run.worker_id IS NULL),
                         v_lease, v_grace, v_now, true, v_displaced);
END
$$;

--
-- Name: FUNCTION admit_run(deployment_ref text, thread_id text, strategy text, worker_id text, payload jsonb, tenant_id text, workspace_id text, lease_seconds double precision, grace_seconds double precision, idempotency_key text, metadata jsonb, run_id uuid, priority integer, max_attempts integer, resumable boolean, owner_generation bigint); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.admit_run(deployment_ref text, thread_id text, strategy text, worker_id text, payload jsonb, tenant_id text, workspace_id text, lease_seconds double precision, grace_seconds double precision, idempotency_key text, metadata jsonb, run_id uuid, priority integer, max_attempts integer, resumable boolean, owner_generation bigint) IS 'admit_run: create a run for a thread, at most one active per thread. worker_id = admit-and-own: leased to the caller at generation 1 in the same statement (pending; start it with start_run; takes no admission slot). Strategies when busy: reject → busy (+ active_run_id, retry_after_s); enqueue → queued behind it; interrupt / rollback → queue and active run cancelled with that action, then admitted, or queued behind a live owner asked to stop (NOTIFY). The caller''s own active run is cancelled at once only with worker_id + owner_generation of its live lease. A repeated idempotency key or run_id returns reused (first admission wins). Raises ZP006, ZP008. Notifies zeroth_wakeup, zeroth_control. Time: clock_timestamp().';

--
-- Name: cancel_run(uuid, text, bigint, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.cancel_run(run_id uuid, worker_id text, generation bigint, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_status zeroth.run_status;
    v_now    timestamptz := zeroth._now();
    v_tenant text := zeroth._scope_tenant(cancel_run.tenant_id, cancel_run.workspace_id);
    v_wskey  text := zeroth._workspace_key(cancel_run.workspace_id);
    v_run    record;
BEGIN
    PERFORM zeroth._require(cancel_run.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(cancel_run.worker_id, 'worker_id');
    PERFORM zeroth._require(cancel_run.generation IS NOT NULL, 'generation must not be NULL');

    PERFORM zeroth._lock_slot(v_tenant, v_wskey, cancel_run.run_id, cancel_run.generation);
    -- The run row first, then the clock: see zeroth._lock_leased_run.
    v_status := zeroth._lock_leased_run(v_tenant, v_wskey, cancel_run.run_id, cancel_run.worker_id, cancel_run.generation);
    v_now := zeroth._now();
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
    IF zeroth._free_slot(v_tenant, v_wskey, cancel_run.run_id, cancel_run.generation) THEN
        PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_tenant, v_run.workspace_id);
    END IF;
    RETURN true;
END
$$;

--
-- Name: FUNCTION cancel_run(run_id uuid, worker_id text, generation bigint, tenant_id text, workspace_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.cancel_run(run_id uuid, worker_id text, generation bigint, tenant_id text, workspace_id text) IS 'cancel_run: the live lease holder (worker_id, generation) ends its pending or running run as cancelled; clears the lease, frees the slot. Returns false when fenced out. Raises ZP008. Notifies zeroth_wakeup when a slot was freed. Time: clock_timestamp().';

--
-- Name: claim_and_start(text, text, text, text, integer, integer, double precision); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.claim_and_start(deployment_ref text, worker_id text, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, max_concurrency integer DEFAULT NULL::integer, batch_size integer DEFAULT 1, lease_seconds double precision DEFAULT 60) RETURNS SETOF zeroth.claimed_run
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
 SELECT _claim_pending.run_id,
     _claim_pending.lease_generation,
     _claim_pending.lease_expires_at,
     _claim_pending.status,
     _claim_pending.attempts,
     _claim_pending.max_attempts,
     _claim_pending.priority,
     _claim_pending.thread_id,
     _claim_pending.idempotency_key,
     _claim_pending.payload,
     _claim_pending.metadata,
     _claim_pending.recovery_checkpoint_id,
     _claim_pending.checkpoint_data,
     _claim_pending.cancel_requested,
     _claim_pending.active_count,
     _claim_pending.concurrency_saturated,
     _claim_pending.concurrency_limit
    FROM zeroth._claim_pending(claim_and_start.deployment_ref, claim_and_start.worker_id, claim_and_start.tenant_id, claim_and_start.workspace_id, claim_and_start.max_concurrency, claim_and_start.batch_size, claim_and_start.lease_seconds, true) _claim_pending(run_id, lease_generation, lease_expires_at, status, attempts, max_attempts, priority, thread_id, idempotency_key, payload, metadata, recovery_checkpoint_id, checkpoint_data, cancel_requested, active_count, concurrency_saturated, concurrency_limit);
END;

--
-- Name: FUNCTION claim_and_start(deployment_ref text, worker_id text, tenant_id text, workspace_id text, max_concurrency integer, batch_size integer, lease_seconds double precision); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.claim_and_start(deployment_ref text, worker_id text, tenant_id text, workspace_id text, max_concurrency integer, batch_size integer, lease_seconds double precision) IS 'claim_and_start: claim_pending and start_run in one call — up to batch_size pending runs are leased (new generation) and made running (attempt counted, started_at set) by one UPDATE. Same order, max_concurrency slots, saturation row and SKIP LOCKED locking as claim_pending. Raises ZP006, ZP008. Time: clock_timestamp().';

--
-- Name: claim_for_takeover(uuid, text, text, double precision, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.claim_for_takeover(run_id uuid, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, grace_seconds double precision DEFAULT 10, stop_reason text DEFAULT 'orphan_recovered'::text, message text DEFAULT NULL::text) RETURNS SETOF zeroth.takeover
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_now   timestamptz := zeroth._now();
    v_grace interval := zeroth._grace_interval(claim_for_takeover.grace_seconds);
BEGIN
    PERFORM zeroth._require(claim_for_takeover.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(claim_for_takeover.stop_reason, 'stop_reason');
    RETURN QUERY SELECT * FROM zeroth._take_over(
        zeroth._scope_tenant(claim_for_takeover.tenant_id, claim_for_takeover.workspace_id),
        zeroth._workspace_key(claim_for_takeover.workspace_id), claim_for_takeover.run_id, v_grace, v_now,
        claim_for_takeover.stop_reason, claim_for_takeover.message);
END
$$;

--
-- Name: FUNCTION claim_for_takeover(run_id uuid, tenant_id text, workspace_id text, grace_seconds double precision, stop_reason text, message text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.claim_for_takeover(run_id uuid, tenant_id text, workspace_id text, grace_seconds double precision, stop_reason text, message text) IS 'claim_for_takeover: take over one run whose owner''s lease expired more than grace ago: resumable → requeued (pending, the interrupted attempt stays counted) or dead_lettered when out of attempts, not resumable → failed with {stop_reason, message}, cancel requested → cancelled. Returns the row once, or nothing (live, within grace, being renewed, not active, unknown). SKIP LOCKED. Raises ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';

--
-- Name: claim_orphaned(text, text, text, text, integer, integer, double precision, double precision); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.claim_orphaned(deployment_ref text, worker_id text, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, max_concurrency integer DEFAULT NULL::integer, claim_limit integer DEFAULT NULL::integer, lease_seconds double precision DEFAULT 60, grace_seconds double precision DEFAULT 10) RETURNS SETOF zeroth.claimed_run
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
DECLARE
    v_now    timestamptz := zeroth._now();
    v_lease  interval := zeroth._lease_interval(claim_orphaned.lease_seconds);
    v_grace  interval := zeroth._grace_interval(claim_orphaned.grace_seconds);
    v_tenant text := zeroth._scope_tenant(claim_orphaned.tenant_id, claim_orphaned.workspace_id);
    v_wskey  text := zeroth._workspace_key(claim_orphaned.workspace_id);
    v_want   integer := claim_orphaned.claim_limit;
    v_slots  integer[];
    v_active integer := 0;
    v_ids    uuid[];
    v_end    record;
BEGIN
    PERFORM zeroth._require_identifier(claim_orphaned.deployment_ref, 'deployment_ref');
    PERFORM zeroth._require_identifier(claim_orphaned.worker_id, 'worker_id');
    PERFORM zeroth._require(claim_orphaned.claim_limit IS NULL OR claim_orphaned.claim_limit BETWEEN 1 AND 1000,
                            'claim_limit must be NULL or between 1 and 1000');
    PERFORM zeroth._require(claim_orphaned.max_concurrency IS NULL OR claim_orphaned.max_concurrency >= 1,
                            'max_concurrency must be NULL or at least 1');
    IF claim_orphaned.max_concurrency IS NOT NULL AND v_tenant IS NULL THEN
        RAISE EXCEPTION 'distributed concurrency needs an exact scope: a workspace_id needs a tenant_id'
            USING ERRCODE = 'ZP006';
    END IF;

    -- 1. The orphans nobody may resume end here (each SKIP LOCKED inside _take_over).
    FOR v_end IN
        SELECT r.run_id, r.resumable
          FROM zeroth.runs r
         WHERE r.tenant_id = v_tenant
           AND r.workspace_key = v_wskey
           AND r.deployment_ref = claim_orphaned.deployment_ref
           AND r.status = 'running'
           AND ((r.resumable AND r.attempts >= r.max_attempts AND r.lease_expires_at < v_now)
                OR (NOT r.resumable AND r.lease_expires_at + v_grace < v_now))
         ORDER BY r.lease_expires_at
         LIMIT coalesce(claim_orphaned.claim_limit, 100)
    LOOP
        PERFORM zeroth._take_over(v_tenant, v_wskey, v_end.run_id,
                                  CASE WHEN v_end.resumable THEN interval '0' ELSE v_grace END,
                                  v_now, 'orphan_recovered', NULL);
    END LOOP;

    -- 2. Re-lease the resumable ones.
    IF claim_orphaned.max_concurrency IS NOT NULL THEN
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
                   AND r.status = 'running' AND r.lease_expires_at < v_now AND r.resumable
                   AND r.attempts < r.max_attempts),
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
           AND r.resumable
           AND r.attempts < r.max_attempts
         ORDER BY r.lease_expires_at, r.started_at
         LIMIT v_want
           FOR UPDATE SKIP LOCKED
    )
    SELECT coalesce(array_agg(l.run_id ORDER BY l.lease_expires_at, l.started_at), '{}') INTO v_ids FROM locked l;
    RETURN QUERY SELECT * FROM zeroth._lease_locked_runs(
        v_tenant, v_wskey, v_ids, v_slots, claim_orphaned.worker_id, v_now, v_lease, v_active,
        claim_orphaned.max_concurrency, false);
END
$$;

--
-- Name: FUNCTION claim_orphaned(deployment_ref text, worker_id text, tenant_id text, workspace_id text, max_concurrency integer, claim_limit integer, lease_seconds double precision, grace_seconds double precision); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.claim_orphaned(deployment_ref text, worker_id text, tenant_id text, workspace_id text, max_concurrency integer, claim_limit integer, lease_seconds double precision, grace_seconds double precision) IS 'claim_orphaned: recover running runs whose lease expired. First ends the ones nobody may resume (resumable but out of attempts → failed + dead-lettered, stop_reason attempts_exhausted; not resumable and expired more than grace_seconds ago → failed, stop_reason orphan_recovered; cancel requested → cancelled), then re-leases resumable ones with attempts left: new generation, attempt counted, recovery_checkpoint_id = latest checkpoint. claim_limit bounds the batch. A single run_id-NULL row reports saturation (an orphan is waiting but no slot is free) or a definitive empty scan. SKIP LOCKED throughout. Raises ZP006, ZP008. Notifies zeroth_wakeup for the runs it ended. Time: clock_timestamp().';

--
-- Name: claim_pending(text, text, text, text, integer, integer, double precision); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.claim_pending(deployment_ref text, worker_id text, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, max_concurrency integer DEFAULT NULL::integer, batch_size integer DEFAULT 1, lease_seconds double precision DEFAULT 60) RETURNS SETOF zeroth.claimed_run
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
 SELECT _claim_pending.run_id,
     _claim_pending.lease_generation,
     _claim_pending.lease_expires_at,
     _claim_pending.status,
     _claim_pending.attempts,
     _claim_pending.max_attempts,
     _claim_pending.priority,
     _claim_pending.thread_id,
     _claim_pending.idempotency_key,
     _claim_pending.payload,
     _claim_pending.metadata,
     _claim_pending.recovery_checkpoint_id,
     _claim_pending.checkpoint_data,
     _claim_pending.cancel_requested,
     _claim_pending.active_count,
     _claim_pending.concurrency_saturated,
     _claim_pending.concurrency_limit
    FROM zeroth._claim_pending(claim_pending.deployment_ref, claim_pending.worker_id, claim_pending.tenant_id, claim_pending.workspace_id, claim_pending.max_concurrency, claim_pending.batch_size, claim_pending.lease_seconds, false) _claim_pending(run_id, lease_generation, lease_expires_at, status, attempts, max_attempts, priority, thread_id, idempotency_key, payload, metadata, recovery_checkpoint_id, checkpoint_data, cancel_requested, active_count, concurrency_saturated, concurrency_limit);
END;

--
-- Name: FUNCTION claim_pending(deployment_ref text, worker_id text, tenant_id text, workspace_id text, max_concurrency integer, batch_size integer, lease_seconds double precision); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.claim_pending(deployment_ref text, worker_id text, tenant_id text, workspace_id text, max_concurrency integer, batch_size integer, lease_seconds double precision) IS 'claim_pending: lease up to batch_size pending runs (status stays pending; start_run makes it running). Order: priority DESC, run_after, created_at. With max_concurrency, takes free admission slots with SKIP LOCKED (claimers never queue on one row); a single run_id-NULL row reports saturation or an empty queue. Bumps lease_generation. Raises ZP006, ZP008. Time: clock_timestamp().';

--
-- Name: clear_lease(uuid, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.clear_lease(run_id uuid, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_now    timestamptz := zeroth._now();
    v_tenant text := zeroth._scope_tenant(clear_lease.tenant_id, clear_lease.workspace_id);
    v_wskey  text := zeroth._workspace_key(clear_lease.workspace_id);
    v_run    record;
BEGIN
    PERFORM zeroth._require(clear_lease.run_id IS NOT NULL, 'run_id must not be NULL');

    UPDATE zeroth.admission_slots s
       SET run_id = NULL, lease_generation = NULL
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

--
-- Name: FUNCTION clear_lease(run_id uuid, tenant_id text, workspace_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.clear_lease(run_id uuid, tenant_id text, workspace_id text) IS 'clear_lease: admin, unfenced. Pending: lease cleared. Running: holder kept, lease expired in place so claim_orphaned recovers it (never stranded); the old holder can no longer release or hand it back. Frees the run''s slots. Returns false when there was no lease. Raises ZP001, ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';

--
-- Name: commit_fenced(uuid, text, bigint, jsonb, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.commit_fenced(run_id uuid, worker_id text, generation bigint, columns jsonb, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_status zeroth.run_status;
    v_now    timestamptz := zeroth._now();
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

    -- The run row first, then the clock: see zeroth._lock_leased_run.
    v_status := zeroth._lock_leased_run(v_tenant, v_wskey, commit_fenced.run_id, commit_fenced.worker_id, commit_fenced.generation);
    v_now := zeroth._now();
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

--
-- Name: FUNCTION commit_fenced(run_id uuid, worker_id text, generation bigint, columns jsonb, tenant_id text, workspace_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.commit_fenced(run_id uuid, worker_id text, generation bigint, columns jsonb, tenant_id text, workspace_id text) IS 'commit_fenced: write allowlisted run columns (output, error, metadata, progress) only while (worker_id, generation) holds a live lease; the fence is in the UPDATE predicate. Lease/fence/status/identity columns raise ZP004 however spelled; other names raise ZP005. Returns false when fenced out. Raises ZP008. Time: clock_timestamp().';

--
-- Name: complete_run(uuid, text, bigint, jsonb, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.complete_run(run_id uuid, worker_id text, generation bigint, output jsonb DEFAULT NULL::jsonb, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_status zeroth.run_status;
    v_now    timestamptz := zeroth._now();
    v_tenant text := zeroth._scope_tenant(complete_run.tenant_id, complete_run.workspace_id);
    v_wskey  text := zeroth._workspace_key(complete_run.workspace_id);
    v_run    record;
BEGIN
    PERFORM zeroth._require(complete_run.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(complete_run.worker_id, 'worker_id');
    PERFORM zeroth._require(complete_run.generation IS NOT NULL, 'generation must not be NULL');

    PERFORM zeroth._lock_slot(v_tenant, v_wskey, complete_run.run_id, complete_run.generation);
    -- The run row first, then the clock: see zeroth._lock_leased_run.
    v_status := zeroth._lock_leased_run(v_tenant, v_wskey, complete_run.run_id, complete_run.worker_id, complete_run.generation);
    v_now := zeroth._now();
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
       AND v_status = 'running'
       AND r.lease_worker_id = complete_run.worker_id
       AND r.lease_generation = complete_run.generation
       AND r.lease_expires_at >= v_now
    RETURNING r.deployment_ref, r.workspace_id INTO v_run;
    IF NOT FOUND THEN
        PERFORM zeroth._explain_fenced_miss(v_tenant, v_wskey, complete_run.run_id, complete_run.worker_id,
                                            complete_run.generation, v_now, 'complete_run', '{running}');
        RETURN false;
    END IF;
    IF zeroth._free_slot(v_tenant, v_wskey, complete_run.run_id, complete_run.generation) THEN
        PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_tenant, v_run.workspace_id);
    END IF;
    RETURN true;
END
$$;

--
-- Name: FUNCTION complete_run(run_id uuid, worker_id text, generation bigint, output jsonb, tenant_id text, workspace_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.complete_run(run_id uuid, worker_id text, generation bigint, output jsonb, tenant_id text, workspace_id text) IS 'complete_run: running → completed for the live lease (worker_id, generation); stores output (SQL NULL keeps the committed output, JSON null clears it), clears the lease, frees the admission slot. Returns false when fenced out. Raises ZP003 (holder but not running), ZP008. Notifies zeroth_wakeup when a slot was freed. Time: clock_timestamp().';

--
-- Name: complete_runs(text, uuid[], bigint[], jsonb[], text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.complete_runs(worker_id text, run_ids uuid[], generations bigint[], outputs jsonb[] DEFAULT NULL::jsonb[], tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text) RETURNS TABLE(run_id uuid, completed boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
DECLARE
    v_now        timestamptz := zeroth._now();
    v_tenant     text := zeroth._scope_tenant(complete_runs.tenant_id, complete_runs.workspace_id);
    v_wskey      text := zeroth._workspace_key(complete_runs.workspace_id);
    v_running    uuid[];
    v_done       uuid[];
    v_freed_deps text[];
BEGIN
    PERFORM zeroth._require_identifier(complete_runs.worker_id, 'worker_id');
    PERFORM zeroth._require_lease_batch(complete_runs.run_ids, complete_runs.generations);
    PERFORM zeroth._require(complete_runs.outputs IS NULL
                            OR cardinality(complete_runs.outputs) = cardinality(complete_runs.run_ids),
                            'outputs must be NULL or as long as run_ids');

    -- Slot rows first, in run_id order: one probe of admission_slots_run_idx per requested run,
    -- as _lock_slot does. Joined to the array by filter, a generic plan made on few slots walked
    -- every slot of the scope (all its deployments) through admission_slots_pkey.
    PERFORM 1
       FROM (SELECT q.run_id, q.generation
               FROM unnest(complete_runs.run_ids, complete_runs.generations) AS q(run_id, generation)
              ORDER BY q.run_id) q
      CROSS JOIN LATERAL (
            SELECT s.slot_no
              FROM zeroth.admission_slots s
             WHERE s.run_id = q.run_id AND s.lease_generation = q.generation
               AND s.tenant_id = v_tenant AND s.workspace_key = v_wskey
               FOR UPDATE OF s) l;

    -- The run rows, in run_id order, then the clock (as zeroth._lock_leased_run: a batch that
    -- waited for a row judges every lease by the time it got them). Found by primary key
    -- (run_id = ANY: an index condition, whatever the statistics say); no predicate here or in the
    -- UPDATE names the status, so the planner cannot prefer runs_running_idx (every running run
    -- of the scope, scanned once per requested run when its row estimate is stale); the running
    -- ones are read from the locked rows.
    SELECT coalesce(array_agg(l.run_id) FILTER (WHERE l.status = 'running'), '{}') INTO v_running
      FROM (SELECT r.run_id, r.status
              FROM zeroth.runs r
              JOIN unnest(complete_runs.run_ids, complete_runs.generations) AS q(run_id, generation)
                ON r.run_id = q.run_id AND r.lease_generation = q.generation
             WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey
               AND r.run_id = ANY (complete_runs.run_ids)
               AND r.lease_worker_id = complete_runs.worker_id
             ORDER BY r.run_id
               FOR UPDATE OF r) l;
    v_now := zeroth._now();

    WITH requested AS (
        SELECT q.run_id, q.generation, complete_runs.outputs[q.position] AS output
          FROM unnest(complete_runs.run_ids, complete_runs.generations)
               WITH ORDINALITY AS q(run_id, generation, position)
    ), done AS (
        UPDATE zeroth.runs r
           SET status = 'completed',
               output = CASE WHEN q.output IS NULL THEN r.output
                             ELSE nullif(q.output, 'null'::jsonb) END,
               finished_at = v_now,
               updated_at = v_now,
               lease_worker_id = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
               admission_slot = NULL, recovery_checkpoint_id = NULL
          FROM requested q
         WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey
           -- By primary key with the array, not only by the join: a generic plan made while
           -- the table was small joined by filter and scanned the whole scope per run (the
           -- continuous-load collapse of issue 13). The array holds the running runs locked.
           AND r.run_id = ANY (v_running)
           AND r.run_id = q.run_id
           AND r.lease_worker_id = complete_runs.worker_id
           AND r.lease_generation = q.generation
           AND r.lease_expires_at >= v_now
        RETURNING r.run_id, q.generation
    ), freed AS (
        UPDATE zeroth.admission_slots s
           SET run_id = NULL, lease_generation = NULL
          FROM done d
         WHERE s.run_id = d.run_id
           AND s.tenant_id = v_tenant AND s.workspace_key = v_wskey
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

--
-- Name: FUNCTION complete_runs(worker_id text, run_ids uuid[], generations bigint[], outputs jsonb[], tenant_id text, workspace_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.complete_runs(worker_id text, run_ids uuid[], generations bigint[], outputs jsonb[], tenant_id text, workspace_id text) IS 'complete_runs: complete_run for a batch of one worker''s runs in one statement; run_ids[i] completes only while generations[i] is live, held by worker_id and running; outputs[i] as complete_run''s output. One row per requested run in input order, completed = false when refused. Locks slots then runs, each in run_id order. Raises ZP008. Notifies zeroth_wakeup (once per deployment) when slots were freed. Time: clock_timestamp().';

--
-- Name: control_key(text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.control_key(worker_id text) RETURNS text
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM zeroth._require_identifier(control_key.worker_id, 'worker_id');
    RETURN zeroth._notify_key('control', ARRAY[control_key.worker_id]);
END
$$;

--
-- Name: FUNCTION control_key(worker_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.control_key(worker_id text) IS 'control_key: the opaque payload the control channel carries for this worker id (a cancel was requested for one of its runs; confirm with renew_leases before acting). Read only; notifies nothing. Raises ZP008.';

--
-- Name: count_pending(text, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.count_pending(deployment_ref text, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text) RETURNS bigint
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    RETURN (SELECT count(*) AS count FROM zeroth.runs r WHERE ((r.tenant_id = zeroth._scope_tenant(count_pending.tenant_id, count_pending.workspace_id)) AND (r.workspace_key = zeroth._workspace_key(count_pending.workspace_id)) AND (r.deployment_ref = count_pending.deployment_ref) AND (r.status = 'pending'::zeroth.run_status)));

--
-- Name: FUNCTION count_pending(deployment_ref text, tenant_id text, workspace_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.count_pending(deployment_ref text, tenant_id text, workspace_id text) IS 'count_pending: number of pending runs of a deployment in a scope (the worker''s queue-depth gauge); read only, through runs_claim_pending_idx. Raises nothing.';

--
-- Name: current_generation(uuid, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.current_generation(run_id uuid, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text) RETURNS bigint
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    RETURN (SELECT r.lease_generation FROM zeroth.runs r WHERE ((r.tenant_id = zeroth._scope_tenant(current_generation.tenant_id, current_generation.workspace_id)) AND (r.workspace_key = zeroth._workspace_key(current_generation.workspace_id)) AND (r.run_id = current_generation.run_id)));

--
-- Name: FUNCTION current_generation(run_id uuid, tenant_id text, workspace_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.current_generation(run_id uuid, tenant_id text, workspace_id text) IS 'current_generation: the run''s lease generation (0 before its first claim), or NULL when no run has this id in this scope. Read only.';

--
-- Name: current_holder(uuid, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.current_holder(run_id uuid, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text) RETURNS text
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    RETURN (SELECT r.lease_worker_id FROM zeroth.runs r WHERE ((r.tenant_id = zeroth._scope_tenant(current_holder.tenant_id, current_holder.workspace_id)) AND (r.workspace_key = zeroth._workspace_key(current_holder.workspace_id)) AND (r.run_id = current_holder.run_id)));

--
-- Name: FUNCTION current_holder(run_id uuid, tenant_id text, workspace_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.current_holder(run_id uuid, tenant_id text, workspace_id text) IS 'current_holder: the worker id named in the run''s lease (live or expired but not yet taken over), or NULL. Read only.';

--
-- Name: enqueue_run(text, jsonb, text, text, integer, timestamp with time zone, integer, text, jsonb, uuid, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.enqueue_run(deployment_ref text, payload jsonb DEFAULT '{}'::jsonb, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, priority integer DEFAULT 0, run_after timestamp with time zone DEFAULT NULL::timestamp with time zone, max_attempts integer DEFAULT 3, idempotency_key text DEFAULT NULL::text, metadata jsonb DEFAULT '{}'::jsonb, run_id uuid DEFAULT NULL::uuid, thread_id text DEFAULT NULL::text) RETURNS zeroth.enqueued_run
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_now       timestamptz := zeroth._now();
    v_tenant    text := zeroth._scope_tenant(enqueue_run.tenant_id, enqueue_run.workspace_id);
    v_wskey     text := zeroth._workspace_key(enqueue_run.workspace_id);
    v_result    zeroth.enqueued_run;
    v_admission zeroth.admission;
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

    IF enqueue_run.thread_id IS NOT NULL THEN
        PERFORM zeroth._require_identifier(enqueue_run.thread_id, 'thread_id');
        v_admission := zeroth._admit(v_tenant, enqueue_run.workspace_id, enqueue_run.deployment_ref,
                                     enqueue_run.thread_id, true, NULL, enqueue_run.payload, enqueue_run.metadata,
                                     enqueue_run.priority, enqueue_run.run_after, enqueue_run.max_attempts,
                                     enqueue_run.idempotency_key, enqueue_run.run_id, true, NULL, interval '0', v_now,
                                     false);
        RETURN ROW(v_admission.run_id, v_admission.outcome <> 'reused', v_admission.status)::zeroth.enqueued_run;
    END IF;

    INSERT INTO zeroth.runs AS r (
        run_id, tenant_id, workspace_id, deployment_ref, status, priority, run_after,
        max_attempts, created_at, updated_at, payload, metadata, idempotency_key)
    VALUES (
        coalesce(enqueue_run.run_id, gen_random_uuid()), v_tenant, enqueue_run.workspace_id,
        enqueue_run.deployment_ref, 'pending', enqueue_run.priority,
        coalesce(enqueue_run.run_after, v_now), enqueue_run.max_attempts, v_now, v_now,
        enqueue_run.payload, enqueue_run.metadata, enqueue_run.idempotency_key)
    ON CONFLICT DO NOTHING
    RETURNING r.run_id, true, r.status INTO v_result.run_id, v_result.created, v_result.status;

    IF FOUND THEN
        IF coalesce(enqueue_run.run_after, v_now) <= v_now THEN
            PERFORM zeroth._notify_wakeup(enqueue_run.deployment_ref, v_tenant, enqueue_run.workspace_id);
        END IF;
        RETURN v_result;
    END IF;

    -- A unique index said no: return the run that holds the key (or the caller's run_id). One
    -- branch per unique index, the run_id match first: an OR of the two is no index condition,
    -- and a generic plan made on a small table filtered the whole scope (as _admission_reuse).
    SELECT x.run_id, false, x.status INTO v_result.run_id, v_result.created, v_result.status
      FROM (SELECT r.run_id, r.status, true AS by_run_id
              FROM zeroth.runs r
             WHERE r.tenant_id = v_tenant
               AND r.workspace_key = v_wskey
               AND r.run_id = enqueue_run.run_id
            UNION ALL
            SELECT r.run_id, r.status, false
              FROM zeroth.runs r
             WHERE r.tenant_id = v_tenant
               AND r.workspace_key = v_wskey
               AND r.deployment_ref = enqueue_run.deployment_ref
               AND r.idempotency_key = enqueue_run.idempotency_key) x
     ORDER BY x.by_run_id DESC
     LIMIT 1;
    RETURN v_result;
END
$$;

--
-- Name: FUNCTION enqueue_run(deployment_ref text, payload jsonb, tenant_id text, workspace_id text, priority integer, run_after timestamp with time zone, max_attempts integer, idempotency_key text, metadata jsonb, run_id uuid, thread_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.enqueue_run(deployment_ref text, payload jsonb, tenant_id text, workspace_id text, priority integer, run_after timestamp with time zone, max_attempts integer, idempotency_key text, metadata jsonb, run_id uuid, thread_id text) IS 'enqueue_run: new → pending; with a thread_id whose thread has an active run, new → waiting in the thread queue (promoted to pending when that run ends). A repeated idempotency key (per tenant, workspace, deployment) or caller-chosen run_id returns the existing run with created = false (first enqueue wins, whatever the payload). Raises ZP006 invalid_scope, ZP008 invalid_argument. Notifies zeroth_wakeup when it creates a pending run that is due now. Time: clock_timestamp().';

--
-- Name: enqueue_runs(text, jsonb, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.enqueue_runs(deployment_ref text, runs jsonb, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text) RETURNS TABLE(ordinality bigint, run_id uuid, created boolean, status zeroth.run_status)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_now       timestamptz := zeroth._now();
    v_tenant    text := zeroth._scope_tenant(enqueue_runs.tenant_id, enqueue_runs.workspace_id);
    v_wskey     text := zeroth._workspace_key(enqueue_runs.workspace_id);
    v_items     zeroth.enqueue_item[];
    v_batch     record;
    v_created   uuid[];
    v_keys      text[];
    v_t_pos     bigint[];
    v_t_run     uuid[];
    v_t_created boolean[];
    v_t_status  zeroth.run_status[];
BEGIN
    -- The shared arguments are checked up front so an empty batch validates them too.
    IF v_tenant IS NULL THEN
        RAISE EXCEPTION 'a workspace_id needs a tenant_id' USING ERRCODE = 'ZP006';
    END IF;
    PERFORM zeroth._require_identifier(enqueue_runs.deployment_ref, 'deployment_ref');
    PERFORM zeroth._require_identifier(v_tenant, 'tenant_id');
    IF enqueue_runs.workspace_id IS NOT NULL THEN
        PERFORM zeroth._require_identifier(enqueue_runs.workspace_id, 'workspace_id');
    END IF;
    v_items := zeroth._enqueue_items(enqueue_runs.runs);

    -- Two batches can meet in a deadlock only through the keys they name (idempotency keys,
    -- caller-chosen run ids): one INSERT waits on the other's uncommitted key while the other
    -- waits on one of its own, in another unique index or in the thread items that follow. That
    -- needs batches that name the same keys in contradicting ways (the same run_id with two
    -- keys, a key as a thread item in one and a plain item in the other); PostgreSQL breaks the
    -- cycle after deadlock_timeout and the batch that lost runs again (its writes were undone
    -- with the subtransaction, so the retry sees the winner's runs as existing). It first gives
    -- the winner a moment: a retry that raced ahead would insert the contested key again before
    -- the winner, woken by the abort, had taken it, and close the same cycle. Batches without
    -- keys cannot conflict and pay for no subtransaction.
    IF EXISTS (SELECT 1 FROM unnest(v_items) AS i WHERE i.idempotency_key IS NOT NULL OR i.run_id IS NOT NULL) THEN
        FOR v_try IN 1..5 LOOP
            BEGIN
                v_batch := zeroth._enqueue_batch(v_tenant, v_wskey, enqueue_runs.workspace_id,
                                                 enqueue_runs.deployment_ref, v_items, v_now);
                EXIT;
            EXCEPTION WHEN deadlock_detected THEN
                IF v_try = 5 THEN
                    RAISE;
                END IF;
                PERFORM pg_sleep(0.02 * v_try * (1 + random()));
            END;
        END LOOP;
    ELSE
        v_batch := zeroth._enqueue_batch(v_tenant, v_wskey, enqueue_runs.workspace_id,
                                         enqueue_runs.deployment_ref, v_items, v_now);
    END IF;
    v_created := v_batch.created;
    v_keys := v_batch.keys;
    v_t_pos := v_batch.t_pos;
    v_t_run := v_batch.t_run;
    v_t_created := v_batch.t_created;
    v_t_status := v_batch.t_status;

    IF EXISTS (SELECT 1 FROM unnest(v_items) AS i
                WHERE i.new_run_id = ANY (v_created) AND coalesce(i.run_after, v_now) <= v_now) THEN
        PERFORM zeroth._notify_wakeup(enqueue_runs.deployment_ref, v_tenant, enqueue_runs.workspace_id);
    END IF;

    RETURN QUERY
    WITH item AS MATERIALIZED (
        -- An item without a thread was created when a row with its run_id and key was inserted
        -- and no earlier item of the batch (in insert order) had the same run_id and key.
        SELECT i.*,
               i.thread_id IS NULL
               AND EXISTS (SELECT 1 FROM unnest(v_created, v_keys) AS c(run_id, idempotency_key)
                            WHERE c.run_id = i.new_run_id
                              AND c.idempotency_key IS NOT DISTINCT FROM i.idempotency_key)
               AND NOT EXISTS (SELECT 1 FROM unnest(v_items) AS j
                                WHERE j.thread_id IS NULL AND j.new_run_id = i.new_run_id
                                  AND j.idempotency_key IS NOT DISTINCT FROM i.idempotency_key
                                  AND j.position < i.position) AS inserted
          FROM unnest(v_items) AS i
    )
    SELECT i.position,
           coalesce(t.run_id, CASE WHEN i.inserted THEN i.new_run_id END, e.run_id),
           coalesce(t.created, i.inserted),
           coalesce(t.status, CASE WHEN i.inserted THEN 'pending'::zeroth.run_status END, e.status)
      FROM item i
      LEFT JOIN unnest(v_t_pos, v_t_run, v_t_created, v_t_status) AS t(position, run_id, created, status)
             ON t.position = i.position
      LEFT JOIN LATERAL (
          -- A run without a thread that was not inserted: the run holding its key or run_id, one
          -- branch per unique index, the run_id match first (an OR of the two filtered the whole
          -- scope per item in a generic plan made on a small table).
          SELECT x.run_id, x.status
            FROM (SELECT r.run_id, r.status, true AS by_run_id
                    FROM zeroth.runs r
                   WHERE i.thread_id IS NULL AND NOT i.inserted
                     AND r.tenant_id = v_tenant AND r.workspace_key = v_wskey
                     AND r.run_id = i.run_id
                  UNION ALL
                  SELECT r.run_id, r.status, false
                    FROM zeroth.runs r
                   WHERE i.thread_id IS NULL AND NOT i.inserted
                     AND r.tenant_id = v_tenant AND r.workspace_key = v_wskey
                     AND r.deployment_ref = enqueue_runs.deployment_ref
                     AND r.idempotency_key = i.idempotency_key) x
           ORDER BY x.by_run_id DESC
           LIMIT 1) e ON true
     ORDER BY i.position;
END
$$;

--
-- Name: FUNCTION enqueue_runs(deployment_ref text, runs jsonb, tenant_id text, workspace_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.enqueue_runs(deployment_ref text, runs jsonb, tenant_id text, workspace_id text) IS 'enqueue_runs: batch enqueue_run for one deployment and scope (one INSERT for the runs without a thread); runs is a JSON array of objects (payload, priority, run_after, max_attempts, idempotency_key, metadata, run_id, thread_id). Results in input order; a repeated key or run_id returns that run with created = false. Thread locks are taken first in one sorted order, inserts run in key order: concurrent batches cannot deadlock on threads or keys. Raises ZP006, ZP008 and rejects the whole batch. Notifies zeroth_wakeup once when a due pending run was created. Time: clock_timestamp().';

--
-- Name: expire_recovery_lease(uuid, text, bigint, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.expire_recovery_lease(run_id uuid, worker_id text, generation bigint, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_status zeroth.run_status;
    v_now    timestamptz := zeroth._now();
    v_tenant text := zeroth._scope_tenant(expire_recovery_lease.tenant_id, expire_recovery_lease.workspace_id);
    v_wskey  text := zeroth._workspace_key(expire_recovery_lease.workspace_id);
    v_run    record;
BEGIN
    PERFORM zeroth._require(expire_recovery_lease.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(expire_recovery_lease.worker_id, 'worker_id');
    PERFORM zeroth._require(expire_recovery_lease.generation IS NOT NULL, 'generation must not be NULL');

    PERFORM zeroth._lock_slot(v_tenant, v_wskey, expire_recovery_lease.run_id, expire_recovery_lease.generation);
    -- The run row first, then the clock: see zeroth._lock_leased_run.
    v_status := zeroth._lock_leased_run(v_tenant, v_wskey, expire_recovery_lease.run_id, expire_recovery_lease.worker_id, expire_recovery_lease.generation);
    v_now := zeroth._now();
    UPDATE zeroth.runs r
       SET lease_expires_at = least(r.lease_expires_at, v_now - interval '1 microsecond'),
           admission_slot = NULL,
           updated_at = v_now
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = expire_recovery_lease.run_id
       AND v_status = 'running'
       AND r.lease_worker_id = expire_recovery_lease.worker_id
       AND r.lease_generation = expire_recovery_lease.generation
       AND r.lease_expires_at >= v_now
    RETURNING r.deployment_ref, r.workspace_id INTO v_run;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM zeroth._free_slot(v_tenant, v_wskey, expire_recovery_lease.run_id, expire_recovery_lease.generation);
    PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_tenant, v_run.workspace_id);
    RETURN true;
END
$$;

--
-- Name: FUNCTION expire_recovery_lease(run_id uuid, worker_id text, generation bigint, tenant_id text, workspace_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.expire_recovery_lease(run_id uuid, worker_id text, generation bigint, tenant_id text, workspace_id text) IS 'expire_recovery_lease: for exactly the live lease (worker_id, generation) of a running run, set lease_expires_at to now - 1 µs, keeping holder and recovery checkpoint, freeing the slot: immediately reclaimable by claim_orphaned (which counts an attempt). Returns false on no match. Raises ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';

--
-- Name: fail_run(uuid, text, bigint, jsonb, boolean, double precision, double precision, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.fail_run(run_id uuid, worker_id text, generation bigint, error jsonb DEFAULT NULL::jsonb, retryable boolean DEFAULT true, retry_base_seconds double precision DEFAULT 1, retry_max_seconds double precision DEFAULT 300, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_status  zeroth.run_status;
    v_now     timestamptz := zeroth._now();
    v_tenant  text := zeroth._scope_tenant(fail_run.tenant_id, fail_run.workspace_id);
    v_wskey   text := zeroth._workspace_key(fail_run.workspace_id);
    v_outcome text;
    v_deploy  text;
    v_ws      text;
    v_due     boolean;
BEGIN
    PERFORM zeroth._require(fail_run.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(fail_run.worker_id, 'worker_id');
    PERFORM zeroth._require(fail_run.generation IS NOT NULL, 'generation must not be NULL');
    PERFORM zeroth._require(fail_run.retryable IS NOT NULL, 'retryable must not be NULL');
    PERFORM zeroth._require(fail_run.retry_base_seconds >= 0 AND fail_run.retry_max_seconds >= fail_run.retry_base_seconds
                            AND fail_run.retry_max_seconds <= 86400 * 30,
                            'need 0 <= retry_base_seconds <= retry_max_seconds <= 30 days');

    PERFORM zeroth._lock_slot(v_tenant, v_wskey, fail_run.run_id, fail_run.generation);
    -- The run row first, then the clock: see zeroth._lock_leased_run.
    v_status := zeroth._lock_leased_run(v_tenant, v_wskey, fail_run.run_id, fail_run.worker_id, fail_run.generation);
    v_now := zeroth._now();
    -- SET expressions read the row as it was; RETURNING reads it as written, so the outcome is
    -- derived from what this UPDATE decided.
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
       AND v_status = 'running'
       AND r.lease_worker_id = fail_run.worker_id
       AND r.lease_generation = fail_run.generation
       AND r.lease_expires_at >= v_now
    RETURNING CASE WHEN r.status = 'pending' THEN 'retry_scheduled'
                   WHEN r.dead_lettered_at IS NOT NULL THEN 'dead_lettered'
                   ELSE 'failed' END,
              r.deployment_ref, r.workspace_id, r.status = 'pending' AND r.run_after <= v_now
         INTO v_outcome, v_deploy, v_ws, v_due;
    IF v_outcome IS NULL THEN
        PERFORM zeroth._explain_fenced_miss(v_tenant, v_wskey, fail_run.run_id, fail_run.worker_id,
                                            fail_run.generation, v_now, 'fail_run', '{running}');
        RETURN NULL;
    END IF;
    IF zeroth._free_slot(v_tenant, v_wskey, fail_run.run_id, fail_run.generation) OR v_due THEN
        PERFORM zeroth._notify_wakeup(v_deploy, v_tenant, v_ws);
    END IF;
    RETURN v_outcome;
END
$$;

--
-- Name: FUNCTION fail_run(run_id uuid, worker_id text, generation bigint, error jsonb, retryable boolean, retry_base_seconds double precision, retry_max_seconds double precision, tenant_id text, workspace_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.fail_run(run_id uuid, worker_id text, generation bigint, error jsonb, retryable boolean, retry_base_seconds double precision, retry_max_seconds double precision, tenant_id text, workspace_id text) IS 'fail_run: running → pending with exponential backoff + jitter (retryable, attempts < max_attempts), → failed (not retryable), or → failed + dead_lettered_at (retries exhausted). Fenced; clears the lease, frees the slot. Returns retry_scheduled | failed | dead_lettered, or NULL when fenced out. Raises ZP003, ZP008. Notifies zeroth_wakeup when a slot was freed or the retry is due at once. Time: clock_timestamp().';

--
-- Name: get_recovery_checkpoint_id(uuid, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.get_recovery_checkpoint_id(run_id uuid, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text) RETURNS uuid
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    RETURN (SELECT r.recovery_checkpoint_id FROM zeroth.runs r WHERE ((r.tenant_id = zeroth._scope_tenant(get_recovery_checkpoint_id.tenant_id, get_recovery_checkpoint_id.workspace_id)) AND (r.workspace_key = zeroth._workspace_key(get_recovery_checkpoint_id.workspace_id)) AND (r.run_id = get_recovery_checkpoint_id.run_id)));

--
-- Name: FUNCTION get_recovery_checkpoint_id(run_id uuid, tenant_id text, workspace_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.get_recovery_checkpoint_id(run_id uuid, tenant_id text, workspace_id text) IS 'get_recovery_checkpoint_id: the checkpoint the current lease holder should resume from (set by a claim when the run has checkpoints), or NULL. Read only.';

--
-- Name: get_thread_run(uuid, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.get_thread_run(run_id uuid, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text) RETURNS SETOF zeroth.thread_run
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
 SELECT t.run_id,
     t.thread_id,
     t.deployment_ref,
     t.status,
     t.queued,
     t.wait_reason,
     t.attempts,
     t.max_attempts,
     t.resumable,
     t.created_at,
     t.started_at,
     t.finished_at,
     t.updated_at,
     t.lease_worker_id,
     t.lease_generation,
     t.lease_expires_at,
     t.cancel_action,
     t.cancel_requested_at,
     t.idempotency_key,
     t.payload,
     t.metadata,
     t.output,
     t.error,
     t.progress,
     t.accounting
    FROM (zeroth.runs r
      CROSS JOIN LATERAL zeroth._thread_run(r.*) t(run_id, thread_id, deployment_ref, status, queued, wait_reason, attempts, max_attempts, resumable, created_at, started_at, finished_at, updated_at, lease_worker_id, lease_generation, lease_expires_at, cancel_action, cancel_requested_at, idempotency_key, payload, metadata, output, error, progress, accounting))
   WHERE ((r.tenant_id = zeroth._scope_tenant(get_thread_run.tenant_id, get_thread_run.workspace_id)) AND (r.workspace_key = zeroth._workspace_key(get_thread_run.workspace_id)) AND (r.run_id = get_thread_run.run_id));
END;

--
-- Name: FUNCTION get_thread_run(run_id uuid, tenant_id text, workspace_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.get_thread_run(run_id uuid, tenant_id text, workspace_id text) IS 'get_thread_run: one run (thread or not) as zeroth.thread_run, or no row when no run has this id in this scope. Read only.';

--
-- Name: hand_back_to_pending(uuid, text, bigint, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.hand_back_to_pending(run_id uuid, worker_id text, generation bigint, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_status zeroth.run_status;
    v_now    timestamptz := zeroth._now();
    v_tenant text := zeroth._scope_tenant(hand_back_to_pending.tenant_id, hand_back_to_pending.workspace_id);
    v_wskey  text := zeroth._workspace_key(hand_back_to_pending.workspace_id);
    v_run    record;
BEGIN
    PERFORM zeroth._require(hand_back_to_pending.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(hand_back_to_pending.worker_id, 'worker_id');
    PERFORM zeroth._require(hand_back_to_pending.generation IS NOT NULL, 'generation must not be NULL');

    PERFORM zeroth._lock_slot(v_tenant, v_wskey, hand_back_to_pending.run_id, hand_back_to_pending.generation);
    -- The run row first, then the clock: see zeroth._lock_leased_run.
    v_status := zeroth._lock_leased_run(v_tenant, v_wskey, hand_back_to_pending.run_id, hand_back_to_pending.worker_id, hand_back_to_pending.generation);
    v_now := zeroth._now();
    -- The first max_attempts hand-backs give the attempt back; after that the attempt stays
    -- counted, and a hand-back that finds no attempt left dead-letters the run.
    UPDATE zeroth.runs r
       SET status = CASE WHEN r.hand_backs >= r.max_attempts AND r.attempts >= r.max_attempts
                         THEN 'failed'::zeroth.run_status ELSE 'pending'::zeroth.run_status END,
           attempts = CASE WHEN r.hand_backs < r.max_attempts THEN greatest(r.attempts - 1, 0)
                           ELSE r.attempts END,
           hand_backs = r.hand_backs + 1,
           error = CASE WHEN r.hand_backs >= r.max_attempts AND r.attempts >= r.max_attempts
                        THEN zeroth._stop_error('attempts_exhausted', format(
                                 'handed back %s times without finishing (attempt %s of %s); a run '
                                 'that never finishes before its worker stops is not retried again',
                                 r.hand_backs + 1, r.attempts, r.max_attempts),
                             r.lease_worker_id, r.lease_generation, r.error)
                        ELSE r.error END,
           dead_lettered_at = CASE WHEN r.hand_backs >= r.max_attempts AND r.attempts >= r.max_attempts
                                   THEN v_now ELSE r.dead_lettered_at END,
           finished_at = CASE WHEN r.hand_backs >= r.max_attempts AND r.attempts >= r.max_attempts
                              THEN v_now END,
           lease_worker_id = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
           admission_slot = NULL, recovery_checkpoint_id = NULL,
           updated_at = v_now
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = hand_back_to_pending.run_id
       AND v_status = 'running'
       AND r.lease_worker_id = hand_back_to_pending.worker_id
       AND r.lease_generation = hand_back_to_pending.generation
       AND r.lease_expires_at >= v_now
    RETURNING r.deployment_ref, r.workspace_id INTO v_run;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM zeroth._free_slot(v_tenant, v_wskey, hand_back_to_pending.run_id, hand_back_to_pending.generation);
    PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_tenant, v_run.workspace_id);
    RETURN true;
END
$$;

--
-- Name: FUNCTION hand_back_to_pending(run_id uuid, worker_id text, generation bigint, tenant_id text, workspace_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.hand_back_to_pending(run_id uuid, worker_id text, generation bigint, tenant_id text, workspace_id text) IS 'hand_back_to_pending: running → pending for exactly the live lease (worker_id, generation); gives the attempt back for the first max_attempts hand-backs (runs.hand_backs), after that keeps it counted and, when no attempt is left, dead-letters the run instead (failed, stop_reason attempts_exhausted; still returns true); clears the lease, frees the slot. An admin cancel that came first wins (no match); an expired or cleared lease matches nothing. Returns false on no match. Raises ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';

--
-- Name: list_thread_runs(text, text, text, integer); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.list_thread_runs(thread_id text, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, max_runs integer DEFAULT 20) RETURNS SETOF zeroth.thread_run
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
 SELECT t.run_id,
     t.thread_id,
     t.deployment_ref,
     t.status,
     t.queued,
     t.wait_reason,
     t.attempts,
     t.max_attempts,
     t.resumable,
     t.created_at,
     t.started_at,
     t.finished_at,
     t.updated_at,
     t.lease_worker_id,
     t.lease_generation,
     t.lease_expires_at,
     t.cancel_action,
     t.cancel_requested_at,
     t.idempotency_key,
     t.payload,
     t.metadata,
     t.output,
     t.error,
     t.progress,
     t.accounting
    FROM (zeroth.runs r
      CROSS JOIN LATERAL zeroth._thread_run(r.*) t(run_id, thread_id, deployment_ref, status, queued, wait_reason, attempts, max_attempts, resumable, created_at, started_at, finished_at, updated_at, lease_worker_id, lease_generation, lease_expires_at, cancel_action, cancel_requested_at, idempotency_key, payload, metadata, output, error, progress, accounting))
   WHERE ((r.tenant_id = zeroth._scope_tenant(list_thread_runs.tenant_id, list_thread_runs.workspace_id)) AND (r.workspace_key = zeroth._workspace_key(list_thread_runs.workspace_id)) AND (r.thread_id = list_thread_runs.thread_id))
   ORDER BY r.created_at DESC, r.run_id DESC
  LIMIT GREATEST(LEAST(list_thread_runs.max_runs, 1000), 0);
END;

--
-- Name: FUNCTION list_thread_runs(thread_id text, tenant_id text, workspace_id text, max_runs integer); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.list_thread_runs(thread_id text, tenant_id text, workspace_id text, max_runs integer) IS 'list_thread_runs: the runs of a thread, newest first (created_at, run_id), at most max_runs (capped at 1000). Read only.';

--
-- Name: pause_run(uuid, text, bigint, text, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.pause_run(run_id uuid, worker_id text, generation bigint, reason text, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_status zeroth.run_status;
    v_now    timestamptz := zeroth._now();
    v_tenant text := zeroth._scope_tenant(pause_run.tenant_id, pause_run.workspace_id);
    v_wskey  text := zeroth._workspace_key(pause_run.workspace_id);
    v_run    record;
BEGIN
    PERFORM zeroth._require(pause_run.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(pause_run.worker_id, 'worker_id');
    PERFORM zeroth._require(pause_run.generation IS NOT NULL, 'generation must not be NULL');
    PERFORM zeroth._require_identifier(pause_run.reason, 'reason');

    PERFORM zeroth._lock_slot(v_tenant, v_wskey, pause_run.run_id, pause_run.generation);
    -- The run row first, then the clock: see zeroth._lock_leased_run.
    v_status := zeroth._lock_leased_run(v_tenant, v_wskey, pause_run.run_id, pause_run.worker_id, pause_run.generation);
    v_now := zeroth._now();
    UPDATE zeroth.runs r
       SET status = 'waiting',
           wait_reason = pause_run.reason,
           -- Waiting is not a failure: the attempt is given back, so approval loops never use up
           -- the retry budget (nor push attempts past max_attempts).
           attempts = greatest(r.attempts - 1, 0),
           updated_at = v_now,
           lease_worker_id = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
           admission_slot = NULL, recovery_checkpoint_id = NULL
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = pause_run.run_id
       AND v_status = 'running'
       AND r.lease_worker_id = pause_run.worker_id
       AND r.lease_generation = pause_run.generation
       AND r.lease_expires_at >= v_now
    RETURNING r.deployment_ref, r.workspace_id INTO v_run;
    IF NOT FOUND THEN
        PERFORM zeroth._explain_fenced_miss(v_tenant, v_wskey, pause_run.run_id, pause_run.worker_id,
                                            pause_run.generation, v_now, 'pause_run', '{running}');
        RETURN false;
    END IF;
    IF zeroth._free_slot(v_tenant, v_wskey, pause_run.run_id, pause_run.generation) THEN
        PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_tenant, v_run.workspace_id);
    END IF;
    RETURN true;
END
$$;

--
-- Name: FUNCTION pause_run(run_id uuid, worker_id text, generation bigint, reason text, tenant_id text, workspace_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.pause_run(run_id uuid, worker_id text, generation bigint, reason text, tenant_id text, workspace_id text) IS 'pause_run: running → waiting with a reason, for the live lease (worker_id, generation); releases the lease and slot and gives the attempt back. Returns false when fenced out. Raises ZP003 (holder but not running), ZP008. Notifies zeroth_wakeup when a slot was freed. Time: clock_timestamp().';

--
-- Name: prune_runs(interval, integer, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.prune_runs(older_than interval, batch_size integer DEFAULT 1000, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_now     timestamptz := zeroth._now();
    v_wskey   text := zeroth._workspace_key(prune_runs.workspace_id);
    v_cutoff  timestamptz;
    v_deleted integer;
BEGIN
    IF prune_runs.tenant_id IS NULL AND prune_runs.workspace_id IS NOT NULL THEN
        RAISE EXCEPTION 'a workspace_id needs a tenant_id' USING ERRCODE = 'ZP006';
    END IF;
    PERFORM zeroth._require(prune_runs.older_than IS NOT NULL AND isfinite(prune_runs.older_than)
                            AND prune_runs.older_than >= interval '0',
                            'older_than must be a finite, non-negative interval');
    PERFORM zeroth._require(prune_runs.batch_size BETWEEN 1 AND 10000, 'batch_size must be between 1 and 10000');
    IF prune_runs.tenant_id IS NOT NULL THEN
        PERFORM zeroth._require_identifier(prune_runs.tenant_id, 'tenant_id');
    END IF;
    IF prune_runs.workspace_id IS NOT NULL THEN
        PERFORM zeroth._require_identifier(prune_runs.workspace_id, 'workspace_id');
    END IF;
    BEGIN
        v_cutoff := v_now - prune_runs.older_than;
    EXCEPTION WHEN datetime_field_overflow THEN
        RAISE EXCEPTION 'older_than % reaches before the earliest timestamp', prune_runs.older_than
            USING ERRCODE = 'ZP008';
    END;

    -- Lock first, skipping rows another session holds (a redrive, a cancel), then delete what
    -- was locked. A row changed under us is re-checked against the WHERE when it is locked, so a
    -- run redriven to pending in the meantime is not deleted. Oldest first, through
    -- runs_finished_idx (the ORDER BY is what keeps the planner on it).
    WITH doomed AS MATERIALIZED (
        SELECT r.tenant_id, r.workspace_key, r.run_id
          FROM zeroth.runs r
         WHERE r.status IN ('completed', 'failed', 'cancelled')
           AND r.finished_at < v_cutoff
           AND (prune_runs.tenant_id IS NULL
                OR (r.tenant_id = prune_runs.tenant_id AND r.workspace_key = v_wskey))
         ORDER BY r.finished_at
         LIMIT prune_runs.batch_size
           FOR UPDATE SKIP LOCKED
    )
    DELETE FROM zeroth.runs r
     USING doomed d
     WHERE r.tenant_id = d.tenant_id
       AND r.workspace_key = d.workspace_key
       AND r.run_id = d.run_id;
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    RETURN v_deleted;
END
$$;

--
-- Name: FUNCTION prune_runs(older_than interval, batch_size integer, tenant_id text, workspace_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.prune_runs(older_than interval, batch_size integer, tenant_id text, workspace_id text) IS 'prune_runs: finished (completed | failed | cancelled, dead letters included) → deleted when finished_at < now - older_than; one batch of at most batch_size per call, returns the number deleted (loop until 0). tenant_id NULL = every tenant; a tenant names exactly (tenant, workspace). Checkpoints go by ON DELETE CASCADE. FOR UPDATE SKIP LOCKED: never waits on workers. Raises ZP006 (workspace without tenant), ZP008. Time: clock_timestamp().';

--
-- Name: reconcile_thread_runs(text, text, text, double precision, integer, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.reconcile_thread_runs(deployment_ref text DEFAULT NULL::text, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, grace_seconds double precision DEFAULT 10, claim_limit integer DEFAULT 100, stop_reason text DEFAULT 'orphan_recovered'::text, message text DEFAULT NULL::text) RETURNS SETOF zeroth.takeover
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
DECLARE
    v_now    timestamptz := zeroth._now();
    v_grace  interval := zeroth._grace_interval(reconcile_thread_runs.grace_seconds);
    v_tenant text := zeroth._scope_tenant(reconcile_thread_runs.tenant_id, reconcile_thread_runs.workspace_id);
    v_wskey  text := zeroth._workspace_key(reconcile_thread_runs.workspace_id);
    v_id     uuid;
BEGIN
    IF v_tenant IS NULL THEN
        RAISE EXCEPTION 'a workspace_id needs a tenant_id' USING ERRCODE = 'ZP006';
    END IF;
    PERFORM zeroth._require(reconcile_thread_runs.claim_limit BETWEEN 1 AND 1000, 'claim_limit must be between 1 and 1000');
    PERFORM zeroth._require_identifier(reconcile_thread_runs.stop_reason, 'stop_reason');
    -- The candidates are planned on every call, on the table as it is (EXECUTE: a one-shot plan;
    -- the text is constant, the values are parameters). The scan has no key to name, and on a
    -- small table runs_thread_idx (every run of every thread, history included) costs the same as
    -- runs_thread_active_idx: a generic plan cached then walked the threads' whole history on
    -- every pass. A periodic pass can afford the planning; _take_over keeps its cached plans.
    FOR v_id IN EXECUTE $sql$
        SELECT r.run_id FROM zeroth.runs r
         WHERE r.tenant_id = $1 AND r.workspace_key = $2
           AND r.thread_id IS NOT NULL AND r.status IN ('pending', 'running', 'waiting')
           AND r.thread_queued_at IS NULL
           AND ($3::text IS NULL OR r.deployment_ref = $3::text)
           AND r.lease_expires_at + $4::interval < $5::timestamptz
         ORDER BY r.lease_expires_at
         LIMIT $6::integer $sql$
        USING v_tenant, v_wskey, reconcile_thread_runs.deployment_ref, v_grace, v_now,
              reconcile_thread_runs.claim_limit
    LOOP
        RETURN QUERY SELECT * FROM zeroth._take_over(v_tenant, v_wskey, v_id, v_grace, v_now,
                                                     reconcile_thread_runs.stop_reason, reconcile_thread_runs.message);
    END LOOP;
END
$_$;

--
-- Name: FUNCTION reconcile_thread_runs(deployment_ref text, tenant_id text, workspace_id text, grace_seconds double precision, claim_limit integer, stop_reason text, message text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.reconcile_thread_runs(deployment_ref text, tenant_id text, workspace_id text, grace_seconds double precision, claim_limit integer, stop_reason text, message text) IS 'reconcile_thread_runs: take over (as claim_for_takeover) up to claim_limit active thread runs of a scope (one deployment or all) whose owners'' leases expired more than grace ago. Concurrent reconcilers never block each other or report a run twice. Raises ZP006, ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';

--
-- Name: redrive_run(uuid, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.redrive_run(run_id uuid, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_now    timestamptz := zeroth._now();
    v_tenant text := zeroth._scope_tenant(redrive_run.tenant_id, redrive_run.workspace_id);
    v_wskey  text := zeroth._workspace_key(redrive_run.workspace_id);
    v_thread text;
    v_active zeroth.runs;
    v_queue  boolean := false;
    v_run    record;
BEGIN
    PERFORM zeroth._require(redrive_run.run_id IS NOT NULL, 'run_id must not be NULL');

    SELECT r.thread_id INTO v_thread FROM zeroth.runs r
     WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey AND r.run_id = redrive_run.run_id;
    IF v_thread IS NOT NULL THEN
        PERFORM zeroth._lock_thread(v_tenant, v_wskey, v_thread);
        v_active := zeroth._lock_thread_active(v_tenant, v_wskey, v_thread, v_now);
        v_queue := v_active.run_id IS NOT NULL;
    END IF;

    UPDATE zeroth.runs r
       SET status = CASE WHEN v_queue THEN 'waiting'::zeroth.run_status ELSE 'pending'::zeroth.run_status END,
           wait_reason = CASE WHEN v_queue THEN 'thread_queue' END,
           thread_queued_at = CASE WHEN v_queue THEN zeroth._queue_position(v_tenant, v_wskey, v_thread, v_now) END,
           attempts = 0,
           hand_backs = 0,
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
    IF v_queue THEN
        PERFORM zeroth._mark_queue_changed(v_tenant, v_wskey, v_active.run_id);
    ELSE
        PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_tenant, v_run.workspace_id);
    END IF;
    RETURN true;
END
$$;

--
-- Name: FUNCTION redrive_run(run_id uuid, tenant_id text, workspace_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.redrive_run(run_id uuid, tenant_id text, workspace_id text) IS 'redrive_run: failed or cancelled → pending, or → waiting in the thread queue when its thread has an active run; resets attempts, hand_backs, error, output, cancel and dead-letter marks, never lease_generation. Raises ZP001 (unknown run), ZP003 (not failed/cancelled), ZP008. Notifies zeroth_wakeup when the run became pending. Time: clock_timestamp().';

--
-- Name: release_lease(uuid, text, bigint, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.release_lease(run_id uuid, worker_id text, generation bigint, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_status zeroth.run_status;
    v_now    timestamptz := zeroth._now();
    v_tenant text := zeroth._scope_tenant(release_lease.tenant_id, release_lease.workspace_id);
    v_wskey  text := zeroth._workspace_key(release_lease.workspace_id);
    v_run    record;
BEGIN
    PERFORM zeroth._require(release_lease.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(release_lease.worker_id, 'worker_id');
    PERFORM zeroth._require(release_lease.generation IS NOT NULL, 'generation must not be NULL');

    PERFORM zeroth._lock_slot(v_tenant, v_wskey, release_lease.run_id, release_lease.generation);
    -- The run row first, then the clock: see zeroth._lock_leased_run.
    v_status := zeroth._lock_leased_run(v_tenant, v_wskey, release_lease.run_id, release_lease.worker_id, release_lease.generation);
    v_now := zeroth._now();
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
       AND r.lease_expires_at >= v_now
    RETURNING r.deployment_ref, r.workspace_id INTO v_run;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM zeroth._free_slot(v_tenant, v_wskey, release_lease.run_id, release_lease.generation);
    PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_tenant, v_run.workspace_id);
    RETURN true;
END
$$;

--
-- Name: FUNCTION release_lease(run_id uuid, worker_id text, generation bigint, tenant_id text, workspace_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.release_lease(run_id uuid, worker_id text, generation bigint, tenant_id text, workspace_id text) IS 'release_lease: give up exactly (worker_id, generation) while that lease is live, any status, never bumps the generation. Pending: lease cleared, claimable at once. Running: holder kept, lease expired in place so claim_orphaned recovers it (never a running run without a lease; the recovery counts an attempt). Frees the slot. Returns false on no match (an expired or cleared lease included). Raises ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';

--
-- Name: renew_lease(uuid, text, bigint, text, text, double precision); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.renew_lease(run_id uuid, worker_id text, generation bigint DEFAULT NULL::bigint, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, lease_seconds double precision DEFAULT 60) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_now     timestamptz := zeroth._now();
    v_expires timestamptz := v_now + zeroth._lease_interval(renew_lease.lease_seconds);
    v_tenant  text := zeroth._scope_tenant(renew_lease.tenant_id, renew_lease.workspace_id);
    v_wskey   text := zeroth._workspace_key(renew_lease.workspace_id);
BEGIN
    PERFORM zeroth._require(renew_lease.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(renew_lease.worker_id, 'worker_id');

    WITH locked AS MATERIALIZED (
        SELECT r.run_id
          FROM zeroth.runs r
         WHERE r.tenant_id = v_tenant
           AND r.workspace_key = v_wskey
           AND r.run_id = renew_lease.run_id
           AND r.lease_worker_id = renew_lease.worker_id
           AND (renew_lease.generation IS NULL OR r.lease_generation = renew_lease.generation)
           AND r.lease_expires_at >= zeroth._now()
           FOR UPDATE OF r
    )
    UPDATE zeroth.runs r
       SET lease_expires_at = v_expires
      FROM locked l
     WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey
       AND r.run_id = renew_lease.run_id AND r.run_id = l.run_id
       AND r.lease_expires_at >= zeroth._now();
    RETURN FOUND;
END
$$;

--
-- Name: FUNCTION renew_lease(run_id uuid, worker_id text, generation bigint, tenant_id text, workspace_id text, lease_seconds double precision); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.renew_lease(run_id uuid, worker_id text, generation bigint, tenant_id text, workspace_id text, lease_seconds double precision) IS 'renew_lease: extend a live lease held by (worker_id, generation); an expired lease is never renewed, even if untaken (the expiry is re-checked once the row lock is held). generation NULL = owner only. Returns false when refused. Raises ZP008. Time: clock_timestamp().';

--
-- Name: renew_leases(text, uuid[], bigint[], text, text, double precision); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.renew_leases(worker_id text, run_ids uuid[], generations bigint[], tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, lease_seconds double precision DEFAULT 60) RETURNS SETOF zeroth.lease_renewal
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
DECLARE
    v_now     timestamptz := zeroth._now();
    v_expires timestamptz := v_now + zeroth._lease_interval(renew_leases.lease_seconds);
    v_tenant  text := zeroth._scope_tenant(renew_leases.tenant_id, renew_leases.workspace_id);
    v_wskey   text := zeroth._workspace_key(renew_leases.workspace_id);
BEGIN
    PERFORM zeroth._require_identifier(renew_leases.worker_id, 'worker_id');
    PERFORM zeroth._require_lease_batch(renew_leases.run_ids, renew_leases.generations);

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
           AND r.run_id = ANY (renew_leases.run_ids)
           AND r.lease_worker_id = renew_leases.worker_id
           AND r.lease_expires_at >= zeroth._now()
         ORDER BY r.run_id
           FOR UPDATE OF r
    ), renewed AS (
        UPDATE zeroth.runs r
           SET lease_expires_at = v_expires
          FROM locked l
         WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey
           AND r.run_id = ANY (renew_leases.run_ids)  -- the primary key, whatever the plan
           AND r.run_id = l.run_id
           AND r.lease_worker_id = renew_leases.worker_id
           AND r.lease_expires_at >= zeroth._now()
        RETURNING r.run_id, r.lease_generation, r.lease_expires_at, r.cancel_requested_at
    )
    SELECT q.run_id, n.run_id IS NOT NULL, n.lease_expires_at,
           coalesce(n.cancel_requested_at IS NOT NULL, false)
      FROM requested q
      LEFT JOIN renewed n ON n.run_id = q.run_id AND n.lease_generation = q.generation
     ORDER BY q.position;
END
$$;

--
-- Name: FUNCTION renew_leases(worker_id text, run_ids uuid[], generations bigint[], tenant_id text, workspace_id text, lease_seconds double precision); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.renew_leases(worker_id text, run_ids uuid[], generations bigint[], tenant_id text, workspace_id text, lease_seconds double precision) IS 'renew_leases: batch renew_lease for one worker; run_ids[i] is renewed only while generations[i] is live and held by worker_id (re-checked under the row lock). One row per requested run (renewed, new expiry, cancel_requested), in input order: how a worker confirms a cancel notification. Locks runs in run_id order. Raises ZP008 (unequal arrays, NULLs, a repeated run, more than 1000). Time: clock_timestamp().';

--
-- Name: request_cancel(uuid, text, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.request_cancel(run_id uuid, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, action text DEFAULT 'cancel'::text) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_outcome text;
BEGIN
    SELECT c.outcome INTO v_outcome
      FROM zeroth.request_cancel_v2(run_id => request_cancel.run_id, tenant_id => request_cancel.tenant_id,
                                    workspace_id => request_cancel.workspace_id, action => request_cancel.action,
                                    grace_seconds => 0) AS c;
    RETURN CASE v_outcome WHEN 'taken_over' THEN 'cancelled' ELSE v_outcome END;
END
$$;

--
-- Name: FUNCTION request_cancel(run_id uuid, tenant_id text, workspace_id text, action text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.request_cancel(run_id uuid, tenant_id text, workspace_id text, action text) IS 'request_cancel: returns cancelled (pending, waiting, or running with an expired lease: terminal at once, lease cleared so the old holder''s fenced writes are refused) | cancel_requested (running with a live lease: durable flag, first action wins, NOTIFY zeroth_control to the owner''s key) | not_cancellable (terminal) | unknown (no such run in scope). request_cancel_v2 adds taken_over, a grace and retry_after_s. Raises ZP008. Notifies zeroth_wakeup when an immediate cancel freed a slot. Time: clock_timestamp().';

--
-- Name: request_cancel_v2(uuid, text, text, text, double precision); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.request_cancel_v2(run_id uuid, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, action text DEFAULT 'cancel'::text, grace_seconds double precision DEFAULT 10) RETURNS zeroth.cancel_result
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_now   timestamptz := zeroth._now();
    v_grace interval := zeroth._grace_interval(request_cancel_v2.grace_seconds);
BEGIN
    PERFORM zeroth._require(request_cancel_v2.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require(request_cancel_v2.action IN ('cancel', 'interrupt', 'rollback'),
                            'action must be cancel, interrupt or rollback');
    RETURN zeroth._cancel(zeroth._scope_tenant(request_cancel_v2.tenant_id, request_cancel_v2.workspace_id),
                          zeroth._workspace_key(request_cancel_v2.workspace_id), request_cancel_v2.run_id,
                          request_cancel_v2.action, v_grace, v_now);
END
$$;

--
-- Name: FUNCTION request_cancel_v2(run_id uuid, tenant_id text, workspace_id text, action text, grace_seconds double precision); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.request_cancel_v2(run_id uuid, tenant_id text, workspace_id text, action text, grace_seconds double precision) IS 'request_cancel_v2: cancelled (pending/waiting/queued, at once) | cancel_requested (running, owner''s lease + grace not run out: durable flag, first action wins, NOTIFY zeroth_control with the owner''s key, retry_after_s) | taken_over (running past lease + grace: cancelled with a stop reason, owner fenced out) | not_cancellable | unknown. Raises ZP008. Notifies zeroth_control, zeroth_wakeup. Time: clock_timestamp().';

--
-- Name: resume_run(uuid, text, text, jsonb); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.resume_run(run_id uuid, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, input jsonb DEFAULT NULL::jsonb) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_now    timestamptz := zeroth._now();
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
       AND r.thread_queued_at IS NULL
    RETURNING r.deployment_ref, r.workspace_id INTO v_run;
    IF NOT FOUND THEN
        IF EXISTS (SELECT 1 FROM zeroth.runs r
                    WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey AND r.run_id = resume_run.run_id
                      AND r.thread_queued_at IS NOT NULL) THEN
            RAISE EXCEPTION 'run % is queued behind the active run of its thread; it starts when that run ends',
                resume_run.run_id USING ERRCODE = 'ZP003';
        END IF;
        PERFORM zeroth._explain_admin_miss(v_tenant, v_wskey, resume_run.run_id, 'resume_run', '{waiting}');
    END IF;
    PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_tenant, v_run.workspace_id);
    RETURN true;
END
$$;

--
-- Name: FUNCTION resume_run(run_id uuid, tenant_id text, workspace_id text, input jsonb); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.resume_run(run_id uuid, tenant_id text, workspace_id text, input jsonb) IS 'resume_run: waiting → pending; input (if given) is stored as metadata.resume_input. A run queued behind its thread''s active run cannot be resumed. Raises ZP001 (unknown run), ZP003 (not waiting, or queued), ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';

--
-- Name: run_finished_key(uuid, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.run_finished_key(run_id uuid, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text) RETURNS text
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_tenant text := zeroth._scope_tenant(run_finished_key.tenant_id, run_finished_key.workspace_id);
BEGIN
    IF v_tenant IS NULL THEN
        RAISE EXCEPTION 'a workspace_id needs a tenant_id' USING ERRCODE = 'ZP006';
    END IF;
    PERFORM zeroth._require(run_finished_key.run_id IS NOT NULL, 'run_id must not be NULL');
    RETURN zeroth._notify_key('run_finished', ARRAY[v_tenant, zeroth._workspace_key(run_finished_key.workspace_id),
                                                    run_finished_key.run_id::text]);
END
$$;

--
-- Name: FUNCTION run_finished_key(run_id uuid, tenant_id text, workspace_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.run_finished_key(run_id uuid, tenant_id text, workspace_id text) IS 'run_finished_key: the opaque payload the run-finished channel carries when this thread run ends. Read only; notifies nothing. Raises ZP006, ZP008.';

--
-- Name: save_checkpoint(uuid, text, bigint, jsonb, uuid, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.save_checkpoint(run_id uuid, worker_id text, generation bigint, data jsonb, checkpoint_id uuid DEFAULT NULL::uuid, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text) RETURNS uuid
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_status zeroth.run_status;
    v_now    timestamptz := zeroth._now();
    v_tenant text := zeroth._scope_tenant(save_checkpoint.tenant_id, save_checkpoint.workspace_id);
    v_wskey  text := zeroth._workspace_key(save_checkpoint.workspace_id);
    v_seq    bigint;
    v_id     uuid;
BEGIN
    PERFORM zeroth._require(save_checkpoint.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(save_checkpoint.worker_id, 'worker_id');
    PERFORM zeroth._require(save_checkpoint.generation IS NOT NULL, 'generation must not be NULL');
    PERFORM zeroth._require(save_checkpoint.data IS NOT NULL, 'data must not be NULL');

    -- The run row first, then the clock: see zeroth._lock_leased_run.
    v_status := zeroth._lock_leased_run(v_tenant, v_wskey, save_checkpoint.run_id, save_checkpoint.worker_id, save_checkpoint.generation);
    v_now := zeroth._now();
    UPDATE zeroth.runs r
       SET checkpoint_seq = r.checkpoint_seq + 1,
           updated_at = v_now
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = save_checkpoint.run_id
       AND v_status = 'running'
       AND r.lease_worker_id = save_checkpoint.worker_id
       AND r.lease_generation = save_checkpoint.generation
       AND r.lease_expires_at >= v_now
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

--
-- Name: FUNCTION save_checkpoint(run_id uuid, worker_id text, generation bigint, data jsonb, checkpoint_id uuid, tenant_id text, workspace_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.save_checkpoint(run_id uuid, worker_id text, generation bigint, data jsonb, checkpoint_id uuid, tenant_id text, workspace_id text) IS 'save_checkpoint: append a checkpoint (or replace one by checkpoint_id) of a running run, fenced by (worker_id, generation, live lease); run row and checkpoint written together. Returns the checkpoint id, or NULL when fenced out. Raises ZP003 (not running), ZP007 (checkpoint of another run), ZP008. Time: clock_timestamp().';

--
-- Name: start_run(uuid, text, bigint, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.start_run(run_id uuid, worker_id text, generation bigint, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_status zeroth.run_status;
    v_now    timestamptz := zeroth._now();
    v_tenant text := zeroth._scope_tenant(start_run.tenant_id, start_run.workspace_id);
    v_wskey  text := zeroth._workspace_key(start_run.workspace_id);
BEGIN
    PERFORM zeroth._require(start_run.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(start_run.worker_id, 'worker_id');
    PERFORM zeroth._require(start_run.generation IS NOT NULL, 'generation must not be NULL');

    -- The run row first, then the clock: see zeroth._lock_leased_run.
    v_status := zeroth._lock_leased_run(v_tenant, v_wskey, start_run.run_id, start_run.worker_id, start_run.generation);
    v_now := zeroth._now();
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
       AND v_status IN ('pending', 'running');
    RETURN FOUND;
END
$$;

--
-- Name: FUNCTION start_run(run_id uuid, worker_id text, generation bigint, tenant_id text, workspace_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.start_run(run_id uuid, worker_id text, generation bigint, tenant_id text, workspace_id text) IS 'start_run: pending → running for the live lease (worker_id, generation); counts an attempt and sets started_at. Idempotent for the holder of a running run. Returns false when fenced out. Raises ZP008. Time: clock_timestamp().';

--
-- Name: update_run_progress(uuid, text, bigint, jsonb, jsonb, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.update_run_progress(run_id uuid, worker_id text, generation bigint, progress jsonb DEFAULT NULL::jsonb, accounting jsonb DEFAULT NULL::jsonb, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_status zeroth.run_status;
    v_now    timestamptz := zeroth._now();
    v_tenant text := zeroth._scope_tenant(update_run_progress.tenant_id, update_run_progress.workspace_id);
    v_wskey  text := zeroth._workspace_key(update_run_progress.workspace_id);
BEGIN
    PERFORM zeroth._require(update_run_progress.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(update_run_progress.worker_id, 'worker_id');
    PERFORM zeroth._require(update_run_progress.generation IS NOT NULL, 'generation must not be NULL');
    PERFORM zeroth._require(update_run_progress.progress IS NOT NULL OR update_run_progress.accounting IS NOT NULL,
                            'give progress, accounting or both');
    PERFORM zeroth._require(update_run_progress.progress IS NULL OR jsonb_typeof(update_run_progress.progress) = 'object',
                            'progress must be a JSON object');
    PERFORM zeroth._require(update_run_progress.accounting IS NULL
                            OR jsonb_typeof(update_run_progress.accounting) = 'object',
                            'accounting must be a JSON object');
    PERFORM zeroth._require(coalesce(octet_length(update_run_progress.progress::text), 0)
                            + coalesce(octet_length(update_run_progress.accounting::text), 0) <= 65536,
                            'progress and accounting may hold at most 64 kB');

    -- The run row first, then the clock: see zeroth._lock_leased_run.
    v_status := zeroth._lock_leased_run(v_tenant, v_wskey, update_run_progress.run_id, update_run_progress.worker_id, update_run_progress.generation);
    v_now := zeroth._now();
    UPDATE zeroth.runs r
       SET progress = CASE WHEN update_run_progress.progress IS NULL THEN r.progress
                           WHEN jsonb_typeof(r.progress) = 'object' THEN r.progress || update_run_progress.progress
                           ELSE update_run_progress.progress END,
           accounting = CASE WHEN update_run_progress.accounting IS NULL THEN r.accounting
                             ELSE coalesce(r.accounting, '{}'::jsonb) || update_run_progress.accounting END,
           updated_at = v_now
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = update_run_progress.run_id
       AND v_status = 'running'
       AND r.lease_worker_id = update_run_progress.worker_id
       AND r.lease_generation = update_run_progress.generation
       AND r.lease_expires_at >= v_now;
    IF NOT FOUND THEN
        PERFORM zeroth._explain_fenced_miss(v_tenant, v_wskey, update_run_progress.run_id, update_run_progress.worker_id,
                                            update_run_progress.generation, v_now, 'update_run_progress', '{running}');
        RETURN false;
    END IF;
    RETURN true;
END
$$;

--
-- Name: FUNCTION update_run_progress(run_id uuid, worker_id text, generation bigint, progress jsonb, accounting jsonb, tenant_id text, workspace_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.update_run_progress(run_id uuid, worker_id text, generation bigint, progress jsonb, accounting jsonb, tenant_id text, workspace_id text) IS 'update_run_progress: the lease holder merges JSON objects into progress and/or accounting (top-level keys replace, omitted keys kept) while the run is running; fenced by (worker_id, generation, live lease). Returns false when fenced out. Raises ZP003 (holder but not running), ZP008. Time: clock_timestamp().';

--
-- Name: wakeup_key(text, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.wakeup_key(deployment_ref text, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text) RETURNS text
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_tenant text := zeroth._scope_tenant(wakeup_key.tenant_id, wakeup_key.workspace_id);
BEGIN
    IF v_tenant IS NULL THEN
        RAISE EXCEPTION 'a workspace_id needs a tenant_id' USING ERRCODE = 'ZP006';
    END IF;
    PERFORM zeroth._require_identifier(wakeup_key.deployment_ref, 'deployment_ref');
    RETURN zeroth._notify_key('wakeup', ARRAY[v_tenant, wakeup_key.workspace_id, wakeup_key.deployment_ref]);
END
$$;

--
-- Name: FUNCTION wakeup_key(deployment_ref text, tenant_id text, workspace_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.wakeup_key(deployment_ref text, tenant_id text, workspace_id text) IS 'wakeup_key: the opaque payload the wakeup channel carries for this (deployment, tenant, workspace). Read only; notifies nothing. Raises ZP006, ZP008.';

--
-- Name: dead_letters; Type: VIEW; Schema: zeroth; Owner: -
--
CREATE VIEW zeroth.dead_letters WITH (security_invoker='true') AS
 SELECT run_id,
    tenant_id,
    workspace_id,
    deployment_ref,
    attempts,
    max_attempts,
    error,
    dead_lettered_at,
    created_at,
    payload
   FROM zeroth.runs r
  WHERE (dead_lettered_at IS NOT NULL);

--
-- Name: VIEW dead_letters; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON VIEW zeroth.dead_letters IS 'Runs that failed max_attempts times with a retryable error and were dead-lettered by fail_run; redrive_run puts one back to pending.';

--
-- Name: expired_leases; Type: VIEW; Schema: zeroth; Owner: -
--
CREATE VIEW zeroth.expired_leases WITH (security_invoker='true') AS
 SELECT run_id,
    tenant_id,
    workspace_id,
    deployment_ref,
    status,
    lease_worker_id,
    lease_generation,
    lease_expires_at,
    (EXTRACT(epoch FROM (clock_timestamp() - lease_expires_at)))::double precision AS seconds_expired,
        CASE
            WHEN (status = 'running'::zeroth.run_status) THEN 'claim_orphaned'::text
            ELSE 'claim_pending'::text
        END AS reclaimed_by,
    checkpoint_seq
   FROM zeroth.runs r
  WHERE (((status = 'pending'::zeroth.run_status) OR (status = 'running'::zeroth.run_status)) AND (lease_expires_at < clock_timestamp()));

--
-- Name: VIEW expired_leases; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON VIEW zeroth.expired_leases IS 'Pending or running runs whose lease expired and that no worker has taken yet. reclaimed_by names the claim that will take each: claim_orphaned for running runs (orphans of a crashed or stalled worker, resumed from their latest checkpoint; checkpoint_seq counts them), claim_pending for claims that were never started.';

--
-- Name: live_leases; Type: VIEW; Schema: zeroth; Owner: -
--
CREATE VIEW zeroth.live_leases WITH (security_invoker='true') AS
 SELECT run_id,
    tenant_id,
    workspace_id,
    deployment_ref,
    status,
    lease_worker_id,
    lease_generation,
    lease_acquired_at,
    lease_expires_at,
    (EXTRACT(epoch FROM (lease_expires_at - clock_timestamp())))::double precision AS seconds_left,
    cancel_requested_at
   FROM zeroth.runs r
  WHERE (((status = 'pending'::zeroth.run_status) OR (status = 'running'::zeroth.run_status)) AND (lease_expires_at >= clock_timestamp()));

--
-- Name: VIEW live_leases; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON VIEW zeroth.live_leases IS 'Runs holding a live lease: claimed (status pending, not yet started) or running. seconds_left is measured on the database clock; cancel_requested_at is set when request_cancel asked the holder to stop.';

--
-- Name: queue_depth; Type: VIEW; Schema: zeroth; Owner: -
--
CREATE VIEW zeroth.queue_depth WITH (security_invoker='true') AS
 SELECT tenant_id,
    workspace_id,
    deployment_ref,
    count(*) FILTER (WHERE ((lease_worker_id IS NULL) OR (lease_expires_at < clock_timestamp()))) AS claimable,
    count(*) FILTER (WHERE (run_after > clock_timestamp())) AS scheduled,
    count(*) AS pending
   FROM zeroth.runs r
  WHERE (status = 'pending'::zeroth.run_status)
  GROUP BY tenant_id, workspace_id, deployment_ref;

--
-- Name: VIEW queue_depth; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON VIEW zeroth.queue_depth IS 'Pending runs per (tenant, workspace, deployment): all pending, those without a live lease (claimable once due), and those scheduled for later (run_after in the future). Uses runs_claim_pending_idx.';

--
-- Name: table_health; Type: VIEW; Schema: zeroth; Owner: -
--
CREATE VIEW zeroth.table_health AS
 WITH horizon AS (
         SELECT h_1.holder,
            h_1.xmin_age,
            h_1.since
           FROM ( SELECT format('backend %s (%s, %s)'::text, a.pid, COALESCE(a.state, 'unknown'::text), COALESCE(NULLIF(a.application_name, ''::text), a.backend_type)) AS holder,
                    age(a.backend_xmin) AS xmin_age,
                    a.xact_start AS since
                   FROM pg_stat_activity a
                  WHERE ((a.backend_xmin IS NOT NULL) AND (a.pid <> pg_backend_pid()) AND ((a.datname = current_database()) OR (a.datname IS NULL)))
                UNION ALL
                 SELECT format('replication slot %s'::text, s.slot_name) AS format,
                    age(s.xmin) AS age,
                    NULL::timestamp with time zone AS timestamptz
                   FROM pg_replication_slots s
                  WHERE (s.xmin IS NOT NULL)
                UNION ALL
                 SELECT format('prepared transaction %s'::text, p.gid) AS format,
                    age(p.transaction) AS age,
                    p.prepared
                   FROM pg_prepared_xacts p
                  WHERE (p.database = current_database())) h_1
          ORDER BY h_1.xmin_age DESC
         LIMIT 1
        )
 SELECT (t.relname)::text AS table_name,
    t.n_live_tup,
    t.n_dead_tup,
    round(((t.n_dead_tup)::numeric / (NULLIF((t.n_live_tup + t.n_dead_tup), 0))::numeric), 4) AS dead_ratio,
    t.n_tup_upd,
    t.n_tup_hot_upd,
    round(((t.n_tup_hot_upd)::numeric / (NULLIF(t.n_tup_upd, 0))::numeric), 4) AS hot_update_ratio,
    t.last_autovacuum,
    t.last_vacuum,
    t.last_autoanalyze,
    t.autovacuum_count,
    pg_table_size((t.relid)::regclass) AS table_bytes,
    pg_indexes_size((t.relid)::regclass) AS index_bytes,
    pg_size_pretty(pg_table_size((t.relid)::regclass)) AS table_size,
    pg_size_pretty(pg_indexes_size((t.relid)::regclass)) AS index_size,
    h.holder AS oldest_xmin_holder,
    h.xmin_age AS oldest_xmin_age,
    (clock_timestamp() - h.since) AS oldest_xmin_duration
   FROM (pg_stat_all_tables t
     LEFT JOIN horizon h ON (true))
  WHERE ((t.schemaname = 'zeroth'::name) AND (t.relname = ANY (ARRAY['runs'::name, 'checkpoints'::name, 'admission_slots'::name])));

--
-- Name: VIEW table_health; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON VIEW zeroth.table_health IS 'Per hot table (runs, checkpoints, admission_slots): live and dead tuples, the share of HOT updates (lease renewals should be HOT), last (auto)vacuum and autoanalyze, table and index size; and, on every row, the oldest transaction horizon in this database that holds back vacuum (a backend snapshot, a replication slot or a prepared transaction), its age in transactions and, for backends and prepared transactions, how long it has been open. Other users'' backends are visible only with pg_read_all_stats (pg_monitor).';

--
-- Name: admission_slots admission_slots_pkey; Type: CONSTRAINT; Schema: zeroth; Owner: -
--
ALTER TABLE ONLY zeroth.admission_slots
    ADD CONSTRAINT admission_slots_pkey PRIMARY KEY (tenant_id, workspace_key, deployment_ref, slot_no);

--
-- Name: checkpoints checkpoints_pkey; Type: CONSTRAINT; Schema: zeroth; Owner: -
--
ALTER TABLE ONLY zeroth.checkpoints
    ADD CONSTRAINT checkpoints_pkey PRIMARY KEY (tenant_id, workspace_key, checkpoint_id);

--
-- Name: lock_stripes lock_stripes_pkey; Type: CONSTRAINT; Schema: zeroth; Owner: -
--
ALTER TABLE ONLY zeroth.lock_stripes
    ADD CONSTRAINT lock_stripes_pkey PRIMARY KEY (stripe);

--
-- Name: notification_secret notification_secret_pkey; Type: CONSTRAINT; Schema: zeroth; Owner: -
--
ALTER TABLE ONLY zeroth.notification_secret
    ADD CONSTRAINT notification_secret_pkey PRIMARY KEY (id);

--
-- Name: runs runs_pkey; Type: CONSTRAINT; Schema: zeroth; Owner: -
--
ALTER TABLE ONLY zeroth.runs
    ADD CONSTRAINT runs_pkey PRIMARY KEY (tenant_id, workspace_key, run_id);

--
-- Name: admission_slots_run_idx; Type: INDEX; Schema: zeroth; Owner: -
--
CREATE INDEX admission_slots_run_idx ON zeroth.admission_slots USING btree (run_id) WHERE (run_id IS NOT NULL);

--
-- Name: checkpoints_run_order_idx; Type: INDEX; Schema: zeroth; Owner: -
--
CREATE INDEX checkpoints_run_order_idx ON zeroth.checkpoints USING btree (tenant_id, workspace_key, run_id, checkpoint_order DESC);

--
-- Name: runs_claim_pending_idx; Type: INDEX; Schema: zeroth; Owner: -
--
CREATE INDEX runs_claim_pending_idx ON zeroth.runs USING btree (tenant_id, workspace_key, deployment_ref, priority DESC, run_after, created_at) WHERE (status = 'pending'::zeroth.run_status);

--
-- Name: runs_dead_letter_idx; Type: INDEX; Schema: zeroth; Owner: -
--
CREATE INDEX runs_dead_letter_idx ON zeroth.runs USING btree (tenant_id, workspace_key, deployment_ref, dead_lettered_at) WHERE (dead_lettered_at IS NOT NULL);

--
-- Name: runs_finished_idx; Type: INDEX; Schema: zeroth; Owner: -
--
CREATE INDEX runs_finished_idx ON zeroth.runs USING btree (finished_at, tenant_id, workspace_key) WHERE (status = ANY (ARRAY['completed'::zeroth.run_status, 'failed'::zeroth.run_status, 'cancelled'::zeroth.run_status]));

--
-- Name: runs_idempotency_key_idx; Type: INDEX; Schema: zeroth; Owner: -
--
CREATE UNIQUE INDEX runs_idempotency_key_idx ON zeroth.runs USING btree (tenant_id, workspace_key, deployment_ref, idempotency_key) WHERE (idempotency_key IS NOT NULL);

--
-- Name: runs_running_idx; Type: INDEX; Schema: zeroth; Owner: -
--
CREATE INDEX runs_running_idx ON zeroth.runs USING btree (tenant_id, workspace_key, deployment_ref) WHERE (status = 'running'::zeroth.run_status);

--
-- Name: runs_thread_active_idx; Type: INDEX; Schema: zeroth; Owner: -
--
CREATE UNIQUE INDEX runs_thread_active_idx ON zeroth.runs USING btree (tenant_id, workspace_key, thread_id) WHERE ((thread_id IS NOT NULL) AND (status = ANY (ARRAY['pending'::zeroth.run_status, 'running'::zeroth.run_status, 'waiting'::zeroth.run_status])) AND (thread_queued_at IS NULL));

--
-- Name: INDEX runs_thread_active_idx; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON INDEX zeroth.runs_thread_active_idx IS 'At most one active (pending, running or waiting, not queued) run per thread, across all processes.';

--
-- Name: runs_thread_idx; Type: INDEX; Schema: zeroth; Owner: -
--
CREATE INDEX runs_thread_idx ON zeroth.runs USING btree (tenant_id, workspace_key, thread_id, created_at DESC, run_id DESC) WHERE (thread_id IS NOT NULL);

--
-- Name: runs_thread_queue_idx; Type: INDEX; Schema: zeroth; Owner: -
--
CREATE INDEX runs_thread_queue_idx ON zeroth.runs USING btree (tenant_id, workspace_key, thread_id, thread_queued_at, run_id) WHERE (thread_queued_at IS NOT NULL);

--
-- Name: runs runs_thread_run_finished; Type: TRIGGER; Schema: zeroth; Owner: -
--
CREATE TRIGGER runs_thread_run_finished AFTER UPDATE OF status ON zeroth.runs FOR EACH ROW WHEN (((old.thread_id IS NOT NULL) AND (old.status = ANY (ARRAY['pending'::zeroth.run_status, 'running'::zeroth.run_status, 'waiting'::zeroth.run_status])) AND (new.status = ANY (ARRAY['completed'::zeroth.run_status, 'failed'::zeroth.run_status, 'cancelled'::zeroth.run_status])))) EXECUTE FUNCTION zeroth._thread_run_finished();

--
-- Name: checkpoints checkpoints_run_fkey; Type: FK CONSTRAINT; Schema: zeroth; Owner: -
--
ALTER TABLE ONLY zeroth.checkpoints
    ADD CONSTRAINT checkpoints_run_fkey FOREIGN KEY (tenant_id, workspace_key, run_id) REFERENCES zeroth.runs(tenant_id, workspace_key, run_id) ON DELETE CASCADE;

--
-- Name: admission_slots; Type: ROW SECURITY; Schema: zeroth; Owner: -
--
ALTER TABLE zeroth.admission_slots ENABLE ROW LEVEL SECURITY;

--
-- Name: checkpoints; Type: ROW SECURITY; Schema: zeroth; Owner: -
--
ALTER TABLE zeroth.checkpoints ENABLE ROW LEVEL SECURITY;

--
-- Name: checkpoints checkpoints_reader_tenant; Type: POLICY; Schema: zeroth; Owner: -
--
CREATE POLICY checkpoints_reader_tenant ON zeroth.checkpoints FOR SELECT TO zeroth_reader USING ((tenant_id = current_setting('zeroth.tenant_id'::text, true)));

--
-- Name: POLICY checkpoints_reader_tenant ON checkpoints; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON POLICY checkpoints_reader_tenant ON zeroth.checkpoints IS 'zeroth_reader sees the checkpoints of the tenant named in the setting zeroth.tenant_id (none when unset).';

--
-- Name: lock_stripes; Type: ROW SECURITY; Schema: zeroth; Owner: -
--
ALTER TABLE zeroth.lock_stripes ENABLE ROW LEVEL SECURITY;

--
-- Name: notification_secret; Type: ROW SECURITY; Schema: zeroth; Owner: -
--
ALTER TABLE zeroth.notification_secret ENABLE ROW LEVEL SECURITY;

--
-- Name: runs; Type: ROW SECURITY; Schema: zeroth; Owner: -
--
ALTER TABLE zeroth.runs ENABLE ROW LEVEL SECURITY;

--
-- Name: runs runs_reader_tenant; Type: POLICY; Schema: zeroth; Owner: -
--
CREATE POLICY runs_reader_tenant ON zeroth.runs FOR SELECT TO zeroth_reader USING ((tenant_id = current_setting('zeroth.tenant_id'::text, true)));

--
-- Name: POLICY runs_reader_tenant ON runs; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON POLICY runs_reader_tenant ON zeroth.runs IS 'zeroth_reader sees the runs of the tenant named in the setting zeroth.tenant_id (none when unset).';
