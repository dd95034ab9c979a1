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
-- Name: _free_slot(text, text, uuid, text, bigint, timestamp with time zone); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._free_slot(tenant_id text, workspace_key text, run_id uuid, worker_id text, generation bigint, at timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
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

--
-- Name: FUNCTION _free_slot(tenant_id text, workspace_key text, run_id uuid, worker_id text, generation bigint, at timestamp with time zone); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._free_slot(tenant_id text, workspace_key text, run_id uuid, worker_id text, generation bigint, at timestamp with time zone) IS 'Internal: release the admission slot held by exactly this (run, worker, generation); with at, only while that lease is live.';

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
-- Name: _lease_locked_runs(text, text, uuid[], integer[], text, timestamp with time zone, interval, integer, integer); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._lease_locked_runs(tenant_id text, workspace_key text, run_ids uuid[], slots integer[], worker_id text, at timestamp with time zone, lease interval, active_count integer, concurrency_limit integer) RETURNS SETOF zeroth.claimed_run
    LANGUAGE plpgsql
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

--
-- Name: FUNCTION _lease_locked_runs(tenant_id text, workspace_key text, run_ids uuid[], slots integer[], worker_id text, at timestamp with time zone, lease interval, active_count integer, concurrency_limit integer); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._lease_locked_runs(tenant_id text, workspace_key text, run_ids uuid[], slots integer[], worker_id text, at timestamp with time zone, lease interval, active_count integer, concurrency_limit integer) IS 'Internal: lease runs (and slots) the caller already locked; the shared second half of claim_pending and claim_orphaned.';

--
-- Name: _notify_wakeup(text, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._notify_wakeup(deployment_ref text, tenant_id text, workspace_id text) RETURNS void
    LANGUAGE sql
    BEGIN ATOMIC
 SELECT pg_notify('zeroth_wakeup'::text, (json_build_object('deployment_ref', deployment_ref, 'tenant_id', tenant_id, 'workspace_id', workspace_id))::text) AS pg_notify;
END;

--
-- Name: FUNCTION _notify_wakeup(deployment_ref text, tenant_id text, workspace_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._notify_wakeup(deployment_ref text, tenant_id text, workspace_id text) IS 'Internal: NOTIFY zeroth_wakeup with {deployment_ref, tenant_id, workspace_id}.';

--
-- Name: _now(timestamp with time zone); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._now(now_override timestamp with time zone) RETURNS timestamp with time zone
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF now_override IS NULL THEN
        RETURN clock_timestamp();
    END IF;
    IF coalesce(current_setting('zeroth.allow_now_override', true), '') <> 'on' THEN
        RAISE EXCEPTION 'now_override is a test hook; it needs zeroth.allow_now_override = on'
            USING ERRCODE = 'ZP008';
    END IF;
    RETURN now_override;
END
$$;

--
-- Name: FUNCTION _now(now_override timestamp with time zone); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._now(now_override timestamp with time zone) IS 'Internal: clock_timestamp(), or now_override when the test hook zeroth.allow_now_override = on (ZP008 otherwise).';

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
COMMENT ON FUNCTION zeroth._require_identifier(value text, name text) IS 'Internal: ZP008 unless value is a non-empty identifier of at most 200 characters (keeps NOTIFY payloads far below 8000 bytes).';

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
-- Name: _take_slots(text, text, text, integer, integer, timestamp with time zone); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth._take_slots(tenant_id text, workspace_key text, deployment_ref text, max_concurrency integer, wanted integer, at timestamp with time zone, OUT slots integer[], OUT active_count integer) RETURNS record
    LANGUAGE plpgsql
    AS $$
BEGIN
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

--
-- Name: FUNCTION _take_slots(tenant_id text, workspace_key text, deployment_ref text, max_concurrency integer, wanted integer, at timestamp with time zone, OUT slots integer[], OUT active_count integer); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth._take_slots(tenant_id text, workspace_key text, deployment_ref text, max_concurrency integer, wanted integer, at timestamp with time zone, OUT slots integer[], OUT active_count integer) IS 'Internal: lock up to `wanted` free concurrency slots of a scope (SKIP LOCKED) and report the live-slot count.';

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
-- Name: cancel_run(uuid, text, bigint, text, text, timestamp with time zone); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.cancel_run(run_id uuid, worker_id text, generation bigint, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, now_override timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
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

--
-- Name: FUNCTION cancel_run(run_id uuid, worker_id text, generation bigint, tenant_id text, workspace_id text, now_override timestamp with time zone); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.cancel_run(run_id uuid, worker_id text, generation bigint, tenant_id text, workspace_id text, now_override timestamp with time zone) IS 'cancel_run: the live lease holder (worker_id, generation) ends its pending or running run as cancelled; clears the lease, frees the slot. Returns false when fenced out. Raises ZP008. Notifies zeroth_wakeup when a slot was freed. Time: clock_timestamp().';

--
-- Name: claim_orphaned(text, text, text, text, integer, integer, double precision, timestamp with time zone); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.claim_orphaned(deployment_ref text, worker_id text, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, max_concurrency integer DEFAULT NULL::integer, claim_limit integer DEFAULT NULL::integer, lease_seconds double precision DEFAULT 60, now_override timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS SETOF zeroth.claimed_run
    LANGUAGE plpgsql
    AS $$
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

--
-- Name: FUNCTION claim_orphaned(deployment_ref text, worker_id text, tenant_id text, workspace_id text, max_concurrency integer, claim_limit integer, lease_seconds double precision, now_override timestamp with time zone); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.claim_orphaned(deployment_ref text, worker_id text, tenant_id text, workspace_id text, max_concurrency integer, claim_limit integer, lease_seconds double precision, now_override timestamp with time zone) IS 'claim_orphaned: take over running runs whose lease expired; each gets a new generation and recovery_checkpoint_id = its latest checkpoint. claim_limit bounds the batch. A single run_id-NULL row reports saturation (an orphan is waiting but no slot is free) or a definitive empty scan. SKIP LOCKED throughout. Raises ZP006, ZP008. Time: clock_timestamp().';

--
-- Name: claim_pending(text, text, text, text, integer, integer, double precision, timestamp with time zone); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.claim_pending(deployment_ref text, worker_id text, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, max_concurrency integer DEFAULT NULL::integer, batch_size integer DEFAULT 1, lease_seconds double precision DEFAULT 60, now_override timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS SETOF zeroth.claimed_run
    LANGUAGE plpgsql
    AS $$
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

--
-- Name: FUNCTION claim_pending(deployment_ref text, worker_id text, tenant_id text, workspace_id text, max_concurrency integer, batch_size integer, lease_seconds double precision, now_override timestamp with time zone); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.claim_pending(deployment_ref text, worker_id text, tenant_id text, workspace_id text, max_concurrency integer, batch_size integer, lease_seconds double precision, now_override timestamp with time zone) IS 'claim_pending: lease up to batch_size pending runs (status stays pending; start_run makes it running). Order: priority DESC, run_after, created_at. With max_concurrency, takes free admission slots with SKIP LOCKED (claimers never queue on one row); a single run_id-NULL row reports saturation or an empty queue. Bumps lease_generation. Raises ZP006, ZP008. Time: clock_timestamp().';

--
-- Name: clear_lease(uuid, text, text, timestamp with time zone); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.clear_lease(run_id uuid, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, now_override timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
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

--
-- Name: FUNCTION clear_lease(run_id uuid, tenant_id text, workspace_id text, now_override timestamp with time zone); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.clear_lease(run_id uuid, tenant_id text, workspace_id text, now_override timestamp with time zone) IS 'clear_lease: admin, unfenced. Pending: lease cleared. Running: holder kept, lease expired in place so claim_orphaned recovers it (never stranded). Frees the run''s slots. Returns false when there was no lease. Raises ZP001, ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';

--
-- Name: commit_fenced(uuid, text, bigint, jsonb, text, text, timestamp with time zone); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.commit_fenced(run_id uuid, worker_id text, generation bigint, columns jsonb, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, now_override timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
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

--
-- Name: FUNCTION commit_fenced(run_id uuid, worker_id text, generation bigint, columns jsonb, tenant_id text, workspace_id text, now_override timestamp with time zone); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.commit_fenced(run_id uuid, worker_id text, generation bigint, columns jsonb, tenant_id text, workspace_id text, now_override timestamp with time zone) IS 'commit_fenced: write allowlisted run columns (output, error, metadata, progress) only while (worker_id, generation) holds a live lease; the fence is in the UPDATE predicate. Lease/fence/status/identity columns raise ZP004 however spelled; other names raise ZP005. Returns false when fenced out. Raises ZP008. Time: clock_timestamp().';

--
-- Name: complete_run(uuid, text, bigint, jsonb, text, text, timestamp with time zone); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.complete_run(run_id uuid, worker_id text, generation bigint, output jsonb DEFAULT NULL::jsonb, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, now_override timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
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

--
-- Name: FUNCTION complete_run(run_id uuid, worker_id text, generation bigint, output jsonb, tenant_id text, workspace_id text, now_override timestamp with time zone); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.complete_run(run_id uuid, worker_id text, generation bigint, output jsonb, tenant_id text, workspace_id text, now_override timestamp with time zone) IS 'complete_run: running → completed for the live lease (worker_id, generation); stores output (SQL NULL keeps the committed output, JSON null clears it), clears the lease, frees the admission slot. Returns false when fenced out. Raises ZP003 (holder but not running), ZP008. Notifies zeroth_wakeup when a slot was freed. Time: clock_timestamp().';

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
    CONSTRAINT runs_attempts_valid CHECK (((attempts >= 0) AND (max_attempts >= 1))),
    CONSTRAINT runs_cancel_action_valid CHECK (((cancel_action IS NULL) OR (cancel_action = ANY (ARRAY['cancel'::text, 'interrupt'::text, 'rollback'::text])))),
    CONSTRAINT runs_deployment_nonempty CHECK ((deployment_ref <> ''::text)),
    CONSTRAINT runs_generation_nonnegative CHECK ((lease_generation >= 0)),
    CONSTRAINT runs_lease_complete CHECK ((((lease_worker_id IS NULL) = (lease_expires_at IS NULL)) AND ((lease_worker_id IS NULL) = (lease_acquired_at IS NULL)))),
    CONSTRAINT runs_lease_only_on_active CHECK (((lease_worker_id IS NULL) OR (status = ANY (ARRAY['pending'::zeroth.run_status, 'running'::zeroth.run_status])))),
    CONSTRAINT runs_metadata_object CHECK ((jsonb_typeof(metadata) = 'object'::text)),
    CONSTRAINT runs_payload_object CHECK ((jsonb_typeof(payload) = 'object'::text)),
    CONSTRAINT runs_running_has_lease CHECK (((status <> 'running'::zeroth.run_status) OR (lease_worker_id IS NOT NULL))),
    CONSTRAINT runs_slot_needs_lease CHECK (((admission_slot IS NULL) OR (lease_worker_id IS NOT NULL))),
    CONSTRAINT runs_tenant_nonempty CHECK ((tenant_id <> ''::text)),
    CONSTRAINT runs_wait_reason_only_waiting CHECK (((wait_reason IS NULL) OR (status = 'waiting'::zeroth.run_status)))
)
WITH (fillfactor='80');

--
-- Name: TABLE runs; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON TABLE zeroth.runs IS 'One row per run. Write it only through the zeroth.* functions; every lease-holder write is fenced by (lease_worker_id, lease_generation, lease_expires_at).';

--
-- Name: COLUMN runs.attempts; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON COLUMN zeroth.runs.attempts IS 'Number of started attempts (start_run from pending); a hand-back gives the attempt back.';

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
-- Name: current_generation(uuid, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.current_generation(run_id uuid, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text) RETURNS bigint
    LANGUAGE sql STABLE
    RETURN (SELECT r.lease_generation FROM zeroth.runs r WHERE ((r.tenant_id = zeroth._scope_tenant(current_generation.tenant_id, current_generation.workspace_id)) AND (r.workspace_key = zeroth._workspace_key(current_generation.workspace_id)) AND (r.run_id = current_generation.run_id)));

--
-- Name: FUNCTION current_generation(run_id uuid, tenant_id text, workspace_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.current_generation(run_id uuid, tenant_id text, workspace_id text) IS 'current_generation: the run''s lease generation (0 before its first claim), or NULL when no run has this id in this scope. Read only.';

--
-- Name: current_holder(uuid, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.current_holder(run_id uuid, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text) RETURNS text
    LANGUAGE sql STABLE
    RETURN (SELECT r.lease_worker_id FROM zeroth.runs r WHERE ((r.tenant_id = zeroth._scope_tenant(current_holder.tenant_id, current_holder.workspace_id)) AND (r.workspace_key = zeroth._workspace_key(current_holder.workspace_id)) AND (r.run_id = current_holder.run_id)));

--
-- Name: FUNCTION current_holder(run_id uuid, tenant_id text, workspace_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.current_holder(run_id uuid, tenant_id text, workspace_id text) IS 'current_holder: the worker id named in the run''s lease (live or expired but not yet taken over), or NULL. Read only.';

--
-- Name: enqueue_run(text, jsonb, text, text, integer, timestamp with time zone, integer, text, jsonb, uuid, text, timestamp with time zone); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.enqueue_run(deployment_ref text, payload jsonb DEFAULT '{}'::jsonb, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, priority integer DEFAULT 0, run_after timestamp with time zone DEFAULT NULL::timestamp with time zone, max_attempts integer DEFAULT 3, idempotency_key text DEFAULT NULL::text, metadata jsonb DEFAULT '{}'::jsonb, run_id uuid DEFAULT NULL::uuid, thread_id text DEFAULT NULL::text, now_override timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS zeroth.enqueued_run
    LANGUAGE plpgsql
    AS $$
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
    PERFORM zeroth._require(enqueue_run.idempotency_key IS NULL OR enqueue_run.idempotency_key <> '',
                            'idempotency_key must be NULL or non-empty');
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

--
-- Name: FUNCTION enqueue_run(deployment_ref text, payload jsonb, tenant_id text, workspace_id text, priority integer, run_after timestamp with time zone, max_attempts integer, idempotency_key text, metadata jsonb, run_id uuid, thread_id text, now_override timestamp with time zone); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.enqueue_run(deployment_ref text, payload jsonb, tenant_id text, workspace_id text, priority integer, run_after timestamp with time zone, max_attempts integer, idempotency_key text, metadata jsonb, run_id uuid, thread_id text, now_override timestamp with time zone) IS 'enqueue_run: new → pending. Inserts one run; a repeated idempotency key (per tenant, workspace, deployment) or caller-chosen run_id returns the existing run with created = false. Raises ZP006 invalid_scope, ZP008 invalid_argument. Notifies zeroth_wakeup. Time: clock_timestamp().';

--
-- Name: enqueue_runs(text, jsonb, text, text, timestamp with time zone); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.enqueue_runs(deployment_ref text, runs jsonb, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, now_override timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS TABLE(ordinality bigint, run_id uuid, created boolean, status zeroth.run_status)
    LANGUAGE plpgsql
    AS $$
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

--
-- Name: FUNCTION enqueue_runs(deployment_ref text, runs jsonb, tenant_id text, workspace_id text, now_override timestamp with time zone); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.enqueue_runs(deployment_ref text, runs jsonb, tenant_id text, workspace_id text, now_override timestamp with time zone) IS 'enqueue_runs: batch enqueue_run for one deployment and scope; runs is a JSON array of objects (payload, priority, run_after, max_attempts, idempotency_key, metadata, run_id, thread_id). Results in input order. Raises ZP006, ZP008 and rejects the whole batch. Notifies zeroth_wakeup.';

--
-- Name: expire_recovery_lease(uuid, text, bigint, text, text, timestamp with time zone); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.expire_recovery_lease(run_id uuid, worker_id text, generation bigint, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, now_override timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_now    timestamptz := zeroth._now(now_override);
    v_tenant text := zeroth._scope_tenant(expire_recovery_lease.tenant_id, expire_recovery_lease.workspace_id);
    v_wskey  text := zeroth._workspace_key(expire_recovery_lease.workspace_id);
    v_run    record;
BEGIN
    PERFORM zeroth._require(expire_recovery_lease.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(expire_recovery_lease.worker_id, 'worker_id');
    PERFORM zeroth._require(expire_recovery_lease.generation IS NOT NULL, 'generation must not be NULL');

    PERFORM zeroth._free_slot(v_tenant, v_wskey, expire_recovery_lease.run_id, expire_recovery_lease.worker_id,
                              expire_recovery_lease.generation);
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
    PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_tenant, v_run.workspace_id);
    RETURN true;
END
$$;

--
-- Name: FUNCTION expire_recovery_lease(run_id uuid, worker_id text, generation bigint, tenant_id text, workspace_id text, now_override timestamp with time zone); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.expire_recovery_lease(run_id uuid, worker_id text, generation bigint, tenant_id text, workspace_id text, now_override timestamp with time zone) IS 'expire_recovery_lease: for exactly (worker_id, generation) of a running run, set lease_expires_at to now - 1 µs, keeping holder and recovery checkpoint, freeing the slot: immediately reclaimable by claim_orphaned. Returns false on no match. Raises ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';

--
-- Name: fail_run(uuid, text, bigint, jsonb, boolean, double precision, double precision, text, text, timestamp with time zone); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.fail_run(run_id uuid, worker_id text, generation bigint, error jsonb DEFAULT NULL::jsonb, retryable boolean DEFAULT true, retry_base_seconds double precision DEFAULT 1, retry_max_seconds double precision DEFAULT 300, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, now_override timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS text
    LANGUAGE plpgsql
    AS $$
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

--
-- Name: FUNCTION fail_run(run_id uuid, worker_id text, generation bigint, error jsonb, retryable boolean, retry_base_seconds double precision, retry_max_seconds double precision, tenant_id text, workspace_id text, now_override timestamp with time zone); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.fail_run(run_id uuid, worker_id text, generation bigint, error jsonb, retryable boolean, retry_base_seconds double precision, retry_max_seconds double precision, tenant_id text, workspace_id text, now_override timestamp with time zone) IS 'fail_run: running → pending with exponential backoff + jitter (retryable, attempts < max_attempts), → failed (not retryable), or → failed + dead_lettered_at (retries exhausted). Fenced; clears the lease, frees the slot. Returns retry_scheduled | failed | dead_lettered, or NULL when fenced out. Raises ZP003, ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';

--
-- Name: get_recovery_checkpoint_id(uuid, text, text); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.get_recovery_checkpoint_id(run_id uuid, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text) RETURNS uuid
    LANGUAGE sql STABLE
    RETURN (SELECT r.recovery_checkpoint_id FROM zeroth.runs r WHERE ((r.tenant_id = zeroth._scope_tenant(get_recovery_checkpoint_id.tenant_id, get_recovery_checkpoint_id.workspace_id)) AND (r.workspace_key = zeroth._workspace_key(get_recovery_checkpoint_id.workspace_id)) AND (r.run_id = get_recovery_checkpoint_id.run_id)));

--
-- Name: FUNCTION get_recovery_checkpoint_id(run_id uuid, tenant_id text, workspace_id text); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.get_recovery_checkpoint_id(run_id uuid, tenant_id text, workspace_id text) IS 'get_recovery_checkpoint_id: the checkpoint the current lease holder should resume from (set by a claim when the run has checkpoints), or NULL. Read only.';

--
-- Name: hand_back_to_pending(uuid, text, bigint, text, text, timestamp with time zone); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.hand_back_to_pending(run_id uuid, worker_id text, generation bigint, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, now_override timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_now    timestamptz := zeroth._now(now_override);
    v_tenant text := zeroth._scope_tenant(hand_back_to_pending.tenant_id, hand_back_to_pending.workspace_id);
    v_wskey  text := zeroth._workspace_key(hand_back_to_pending.workspace_id);
    v_run    record;
BEGIN
    PERFORM zeroth._require(hand_back_to_pending.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(hand_back_to_pending.worker_id, 'worker_id');
    PERFORM zeroth._require(hand_back_to_pending.generation IS NOT NULL, 'generation must not be NULL');

    PERFORM zeroth._free_slot(v_tenant, v_wskey, hand_back_to_pending.run_id, hand_back_to_pending.worker_id,
                              hand_back_to_pending.generation);
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
    PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_tenant, v_run.workspace_id);
    RETURN true;
END
$$;

--
-- Name: FUNCTION hand_back_to_pending(run_id uuid, worker_id text, generation bigint, tenant_id text, workspace_id text, now_override timestamp with time zone); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.hand_back_to_pending(run_id uuid, worker_id text, generation bigint, tenant_id text, workspace_id text, now_override timestamp with time zone) IS 'hand_back_to_pending: running → pending for exactly (worker_id, generation), no expiry check; gives the attempt back, clears the lease, frees the slot. An admin cancel that came first wins (no match). Returns false on no match. Raises ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';

--
-- Name: pause_run(uuid, text, bigint, text, text, text, timestamp with time zone); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.pause_run(run_id uuid, worker_id text, generation bigint, reason text, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, now_override timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
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

--
-- Name: FUNCTION pause_run(run_id uuid, worker_id text, generation bigint, reason text, tenant_id text, workspace_id text, now_override timestamp with time zone); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.pause_run(run_id uuid, worker_id text, generation bigint, reason text, tenant_id text, workspace_id text, now_override timestamp with time zone) IS 'pause_run: running → waiting with a reason, for the live lease (worker_id, generation); releases the lease and slot. Returns false when fenced out. Raises ZP003 (holder but not running), ZP008. Notifies zeroth_wakeup when a slot was freed. Time: clock_timestamp().';

--
-- Name: redrive_run(uuid, text, text, timestamp with time zone); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.redrive_run(run_id uuid, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, now_override timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
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

--
-- Name: FUNCTION redrive_run(run_id uuid, tenant_id text, workspace_id text, now_override timestamp with time zone); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.redrive_run(run_id uuid, tenant_id text, workspace_id text, now_override timestamp with time zone) IS 'redrive_run: failed or cancelled → pending; resets attempts, error, output, cancel and dead-letter marks, never lease_generation. Raises ZP001 (unknown run), ZP003 (not failed/cancelled), ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';

--
-- Name: release_lease(uuid, text, bigint, text, text, timestamp with time zone); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.release_lease(run_id uuid, worker_id text, generation bigint, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, now_override timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
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

--
-- Name: FUNCTION release_lease(run_id uuid, worker_id text, generation bigint, tenant_id text, workspace_id text, now_override timestamp with time zone); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.release_lease(run_id uuid, worker_id text, generation bigint, tenant_id text, workspace_id text, now_override timestamp with time zone) IS 'release_lease: give up exactly (worker_id, generation), no status or expiry check, never bumps the generation. Pending: lease cleared, claimable at once. Running: holder kept, lease expired in place so claim_orphaned recovers it (never a running run without a lease). Frees the slot. Returns false on no match. Raises ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';

--
-- Name: renew_lease(uuid, text, bigint, text, text, double precision, timestamp with time zone); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.renew_lease(run_id uuid, worker_id text, generation bigint DEFAULT NULL::bigint, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, lease_seconds double precision DEFAULT 60, now_override timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
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

--
-- Name: FUNCTION renew_lease(run_id uuid, worker_id text, generation bigint, tenant_id text, workspace_id text, lease_seconds double precision, now_override timestamp with time zone); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.renew_lease(run_id uuid, worker_id text, generation bigint, tenant_id text, workspace_id text, lease_seconds double precision, now_override timestamp with time zone) IS 'renew_lease: extend a live lease held by (worker_id, generation); an expired lease is never renewed, even if untaken. generation NULL = owner only. Locks the run''s admission slot, then the run. Returns false when refused. Raises ZP008. Time: clock_timestamp().';

--
-- Name: renew_leases(text, uuid[], bigint[], text, text, double precision, timestamp with time zone); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.renew_leases(worker_id text, run_ids uuid[], generations bigint[], tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, lease_seconds double precision DEFAULT 60, now_override timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS SETOF zeroth.lease_renewal
    LANGUAGE plpgsql
    AS $$
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

--
-- Name: FUNCTION renew_leases(worker_id text, run_ids uuid[], generations bigint[], tenant_id text, workspace_id text, lease_seconds double precision, now_override timestamp with time zone); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.renew_leases(worker_id text, run_ids uuid[], generations bigint[], tenant_id text, workspace_id text, lease_seconds double precision, now_override timestamp with time zone) IS 'renew_leases: batch renew_lease for one worker; run_ids[i] is renewed only while generations[i] is live and held by worker_id. One row per requested run (renewed, new expiry, cancel_requested), in input order. Raises ZP008. Time: clock_timestamp().';

--
-- Name: request_cancel(uuid, text, text, text, timestamp with time zone); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.request_cancel(run_id uuid, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, action text DEFAULT 'cancel'::text, now_override timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS text
    LANGUAGE plpgsql
    AS $$
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

--
-- Name: FUNCTION request_cancel(run_id uuid, tenant_id text, workspace_id text, action text, now_override timestamp with time zone); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.request_cancel(run_id uuid, tenant_id text, workspace_id text, action text, now_override timestamp with time zone) IS 'request_cancel: returns cancelled (pending, waiting, or running with an expired lease: terminal at once, lease cleared so the old holder''s fenced writes are refused) | cancel_requested (running with a live lease: durable flag, first action wins, NOTIFY zeroth_control to the owner) | not_cancellable (terminal) | unknown (no such run in scope). Raises ZP008. Notifies zeroth_wakeup when an immediate cancel freed a slot. Time: clock_timestamp().';

--
-- Name: resume_run(uuid, text, text, jsonb, timestamp with time zone); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.resume_run(run_id uuid, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, input jsonb DEFAULT NULL::jsonb, now_override timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
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

--
-- Name: FUNCTION resume_run(run_id uuid, tenant_id text, workspace_id text, input jsonb, now_override timestamp with time zone); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.resume_run(run_id uuid, tenant_id text, workspace_id text, input jsonb, now_override timestamp with time zone) IS 'resume_run: waiting → pending; input (if given) is stored as metadata.resume_input. Raises ZP001 (unknown run), ZP003 (not waiting), ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';

--
-- Name: save_checkpoint(uuid, text, bigint, jsonb, uuid, text, text, timestamp with time zone); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.save_checkpoint(run_id uuid, worker_id text, generation bigint, data jsonb, checkpoint_id uuid DEFAULT NULL::uuid, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, now_override timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS uuid
    LANGUAGE plpgsql
    AS $$
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

--
-- Name: FUNCTION save_checkpoint(run_id uuid, worker_id text, generation bigint, data jsonb, checkpoint_id uuid, tenant_id text, workspace_id text, now_override timestamp with time zone); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.save_checkpoint(run_id uuid, worker_id text, generation bigint, data jsonb, checkpoint_id uuid, tenant_id text, workspace_id text, now_override timestamp with time zone) IS 'save_checkpoint: append a checkpoint (or replace one by checkpoint_id) of a running run, fenced by (worker_id, generation, live lease); run row and checkpoint written together. Returns the checkpoint id, or NULL when fenced out. Raises ZP003 (not running), ZP007 (checkpoint of another run), ZP008. Time: clock_timestamp().';

--
-- Name: start_run(uuid, text, bigint, text, text, timestamp with time zone); Type: FUNCTION; Schema: zeroth; Owner: -
--
CREATE FUNCTION zeroth.start_run(run_id uuid, worker_id text, generation bigint, tenant_id text DEFAULT NULL::text, workspace_id text DEFAULT NULL::text, now_override timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
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

--
-- Name: FUNCTION start_run(run_id uuid, worker_id text, generation bigint, tenant_id text, workspace_id text, now_override timestamp with time zone); Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON FUNCTION zeroth.start_run(run_id uuid, worker_id text, generation bigint, tenant_id text, workspace_id text, now_override timestamp with time zone) IS 'start_run: pending → running for the live lease (worker_id, generation); counts an attempt and sets started_at. Idempotent for the holder of a running run. Returns false when fenced out. Raises ZP008. Time: clock_timestamp().';

--
-- Name: admission_slots; Type: TABLE; Schema: zeroth; Owner: -
--
CREATE TABLE zeroth.admission_slots (
    tenant_id text NOT NULL,
    workspace_key text NOT NULL,
    deployment_ref text NOT NULL,
    slot_no integer NOT NULL,
    run_id uuid,
    lease_worker_id text,
    lease_generation bigint,
    lease_expires_at timestamp with time zone,
    CONSTRAINT admission_slots_holder_complete CHECK ((((run_id IS NULL) = (lease_worker_id IS NULL)) AND ((run_id IS NULL) = (lease_generation IS NULL)) AND ((run_id IS NULL) = (lease_expires_at IS NULL)))),
    CONSTRAINT admission_slots_slot_positive CHECK ((slot_no >= 1))
)
WITH (fillfactor='50');

--
-- Name: TABLE admission_slots; Type: COMMENT; Schema: zeroth; Owner: -
--
COMMENT ON TABLE zeroth.admission_slots IS 'Concurrency slots per (tenant, workspace, deployment). A slot is free when run_id is NULL or its lease expired.';

--
-- Name: dead_letters; Type: VIEW; Schema: zeroth; Owner: -
--
CREATE VIEW zeroth.dead_letters AS
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
-- Name: queue_depth; Type: VIEW; Schema: zeroth; Owner: -
--
CREATE VIEW zeroth.queue_depth AS
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
-- Name: admission_slots admission_slots_pkey; Type: CONSTRAINT; Schema: zeroth; Owner: -
--
ALTER TABLE ONLY zeroth.admission_slots
    ADD CONSTRAINT admission_slots_pkey PRIMARY KEY (tenant_id, workspace_key, deployment_ref, slot_no);

--
-- Name: checkpoints checkpoints_pkey; Type: CONSTRAINT; Schema: zeroth; Owner: -
--
ALTER TABLE ONLY zeroth.checkpoints
    ADD CONSTRAINT checkpoints_pkey PRIMARY KEY (checkpoint_id);

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
-- Name: runs_idempotency_key_idx; Type: INDEX; Schema: zeroth; Owner: -
--
CREATE UNIQUE INDEX runs_idempotency_key_idx ON zeroth.runs USING btree (tenant_id, workspace_key, deployment_ref, idempotency_key) WHERE (idempotency_key IS NOT NULL);

--
-- Name: runs_running_idx; Type: INDEX; Schema: zeroth; Owner: -
--
CREATE INDEX runs_running_idx ON zeroth.runs USING btree (tenant_id, workspace_key, deployment_ref) WHERE (status = 'running'::zeroth.run_status);

--
-- Name: checkpoints checkpoints_run_fkey; Type: FK CONSTRAINT; Schema: zeroth; Owner: -
--
ALTER TABLE ONLY zeroth.checkpoints
    ADD CONSTRAINT checkpoints_run_fkey FOREIGN KEY (tenant_id, workspace_key, run_id) REFERENCES zeroth.runs(tenant_id, workspace_key, run_id) ON DELETE CASCADE;
