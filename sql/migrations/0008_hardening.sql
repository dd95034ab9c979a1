-- 0008_hardening: close the holes an outside review found (issue 11). Every function is
-- re-created here in full; the old definitions of 0002-0007 are dropped first, so no dead body or
-- overload of them stays behind.
--
--   * Database time only, for real. No function takes a time argument any more (now_override is
--     gone from the API, and with it the placeholder setting any session could SET to enable it).
--     zeroth._now() is clock_timestamp(); a test harness that needs to move time replaces that one
--     function in its own throwaway database, which only its owner or a superuser can do.
--   * NOTIFY payloads are opaque keys. NOTIFY and LISTEN need no privilege, so a payload must not
--     name a tenant, a deployment, a run or a worker: each is a key derived from a per-database
--     random secret that only zeroth_owner can read (zeroth.notification_secret). A worker asks
--     for the keys it cares about (wakeup_key, control_key, run_finished_key) and ignores the rest.
--     A notification stays a hint: a worker confirms a cancel with renew_leases before it acts.
--   * A slot holds no copy of a lease. admission_slots names (run_id, lease_generation) and is held
--     exactly while that run holds that generation's live lease in that slot: the run row is the
--     only truth, so a slot can never outlive or disagree with the lease it names. Renewals no
--     longer touch slots; a claim that reuses a slot whose run still names it retires that lease
--     under the run's row lock first (see _take_slots).
--   * A run that kills its worker is not recovered for ever: every re-lease of a running run whose
--     lease expired counts an attempt, and claim_orphaned ends the orphans nobody may resume —
--     resumable ones out of attempts are dead-lettered (stop_reason attempts_exhausted),
--     non-resumable ones fail after lease + grace (stop_reason orphan_recovered) — so their threads
--     move on. A takeover no longer gives the attempt back; only a graceful hand-back by the live
--     holder does.
--   * Give-backs (release_lease, hand_back_to_pending, expire_recovery_lease) need a live lease.
--   * admit_run: a retried admission is answered reused under the thread lock too (it was busy
--     when it raced its first attempt), and the "caller owns the active run" shortcut needs the
--     owner's live generation, not just a worker id.
--   * enqueue_runs is set-based: items parsed and checked in one pass, thread locks taken in one
--     sorted order before any insert, the runs without a thread inserted by one statement.
--   * renew_leases checks its batch like complete_runs does (at most 1000, no repeated run).
--   * A run that is not due (run_after in the future, a retry with backoff) wakes nobody: the poll
--     finds it when it is due.

-- ---------------------------------------------------------------------------------------------
-- Drop every function of 0002-0007 (the trigger function stays: the trigger needs it and it is
-- replaced below). CASCADE only reaches functions: nothing else in the schema calls them.
-- ---------------------------------------------------------------------------------------------

DO $drop$
DECLARE
    v_routine text;
BEGIN
    -- Names first, drops after: a CASCADE may take a later routine of the list with it.
    FOREACH v_routine IN ARRAY ARRAY(
        SELECT p.oid::pg_catalog.regprocedure::text
          FROM pg_catalog.pg_proc p
         WHERE p.pronamespace = 'zeroth'::pg_catalog.regnamespace
           AND p.proname <> '_thread_run_finished')
    LOOP
        EXECUTE pg_catalog.format('DROP ROUTINE IF EXISTS %s CASCADE', v_routine);
    END LOOP;
END
$drop$;

-- ---------------------------------------------------------------------------------------------
-- Tables and types
-- ---------------------------------------------------------------------------------------------

-- The secret notification keys are derived from. One row, random per database, readable by its
-- owner only (no grant; row-level security with no policy on top). Rotate it with
-- UPDATE zeroth.notification_secret SET secret = …: workers fetch their keys again on every
-- LISTEN (re)connect, and poll meanwhile.
CREATE TABLE zeroth.notification_secret (
    id     boolean NOT NULL DEFAULT true,
    secret text    NOT NULL,
    CONSTRAINT notification_secret_pkey PRIMARY KEY (id),
    CONSTRAINT notification_secret_one_row CHECK (id),
    CONSTRAINT notification_secret_long CHECK (length(secret) >= 32)
);
COMMENT ON TABLE zeroth.notification_secret IS 'The per-database random secret that NOTIFY payload keys are derived from (zeroth._notify_key). Readable by zeroth_owner only.';
INSERT INTO zeroth.notification_secret (secret)
VALUES (replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''));
ALTER TABLE zeroth.notification_secret OWNER TO zeroth_owner;
ALTER TABLE zeroth.notification_secret ENABLE ROW LEVEL SECURITY;
REVOKE ALL ON zeroth.notification_secret FROM PUBLIC;

-- The locks that serialise admissions of one thread, and the creation of a scope's slot rows, are
-- row locks on this table, which only its owner can read or lock. They were advisory locks, and
-- an advisory lock needs no privilege: any LOGIN role could compute a thread's key (pg_locks even
-- lists the keys in use) and hold it, blocking every admission of that thread, or hold a scope's
-- slot-creation key so that its first claims reported saturation for as long as it liked. A
-- stripe stands for every thread (0..16383) or scope (16384..17407) whose key hashes to it; two
-- that share one only wait for each other, as a collision of the advisory key did. Locking a
-- stripe only marks its tuple (no new row version), so the table never grows.
CREATE TABLE zeroth.lock_stripes (
    stripe integer NOT NULL,
    CONSTRAINT lock_stripes_pkey PRIMARY KEY (stripe)
);
COMMENT ON TABLE zeroth.lock_stripes IS 'Row locks that serialise the admissions of one thread (stripes 0..16383) and the creation of a scope''s admission slots (16384..17407), by hash. Locked by zeroth functions only: no role but zeroth_owner can read or lock it.';
INSERT INTO zeroth.lock_stripes (stripe) SELECT g.n FROM generate_series(0, 17407) AS g(n);
ALTER TABLE zeroth.lock_stripes OWNER TO zeroth_owner;
ALTER TABLE zeroth.lock_stripes ENABLE ROW LEVEL SECURITY;
REVOKE ALL ON zeroth.lock_stripes FROM PUBLIC;

-- A slot names a lease; the lease itself lives on the run row only.
ALTER TABLE zeroth.admission_slots
    DROP CONSTRAINT admission_slots_holder_complete,
    DROP COLUMN lease_worker_id,
    DROP COLUMN lease_expires_at,
    ADD CONSTRAINT admission_slots_holder_complete CHECK ((run_id IS NULL) = (lease_generation IS NULL));
COMMENT ON TABLE zeroth.admission_slots IS 'Concurrency slots per (tenant, workspace, deployment). A slot names (run_id, lease_generation); it is held while that run holds that generation''s lease in this slot (runs.admission_slot) and the lease is live. The run row is the only copy of the lease.';
-- A checkpoint id is unique within its scope, not across scopes: with a global key, a caller in
-- one tenant learned whether another tenant had used an id (ZP007 "belongs to another run") and
-- could take a predictable id first, so that the other tenant's save failed. Caller-chosen ids
-- are a tenant's own namespace now.
ALTER TABLE zeroth.checkpoints
    DROP CONSTRAINT checkpoints_pkey,
    ADD CONSTRAINT checkpoints_pkey PRIMARY KEY (tenant_id, workspace_key, checkpoint_id);

-- Hand-backs are counted so that they cannot loop: a handler that always outlives the worker's
-- shutdown (or sends its own worker SIGTERM) was handed back, attempt refunded, for ever.
ALTER TABLE zeroth.runs
    ADD COLUMN hand_backs integer NOT NULL DEFAULT 0,
    ADD CONSTRAINT runs_hand_backs_nonnegative CHECK (hand_backs >= 0);
COMMENT ON COLUMN zeroth.runs.hand_backs IS 'How many times a live holder handed the run back (hand_back_to_pending). The first max_attempts hand-backs give their attempt back; later ones keep it counted, and one that finds the attempts used up dead-letters the run (stop_reason attempts_exhausted). redrive_run resets it.';
COMMENT ON COLUMN zeroth.runs.attempts IS 'Number of attempts: counted when a run starts (start_run, claim_and_start) and when an orphan is re-leased after its lease expired (claim_orphaned). Given back only by the live holder stopping gracefully: pause_run (waiting is not a failure) and the first max_attempts hand-backs (hand_back_to_pending). So attempts never exceed max_attempts through the functions.';

-- One item of an enqueue_runs batch, parsed and checked (internal).
CREATE TYPE zeroth.enqueue_item AS (
    position        bigint,
    payload         jsonb,
    priority        integer,
    run_after       timestamptz,
    max_attempts    integer,
    idempotency_key text,
    metadata        jsonb,
    run_id          uuid,
    thread_id       text,
    new_run_id      uuid
);
COMMENT ON TYPE zeroth.enqueue_item IS 'Internal: one parsed item of an enqueue_runs batch; new_run_id is the caller''s run_id or a fresh one.';
ALTER TYPE zeroth.enqueue_item OWNER TO zeroth_owner;

COMMENT ON TYPE zeroth.takeover IS 'A run ended or handed back by claim_for_takeover / reconcile_thread_runs / claim_orphaned. outcome: failed (not resumable) | cancelled (a cancel was requested) | requeued (resumable: back to pending for another worker, the interrupted attempt still counted) | dead_lettered (resumable but out of attempts).';

-- ---------------------------------------------------------------------------------------------
-- Internal helpers (names start with an underscore; not part of the API)
-- ---------------------------------------------------------------------------------------------

-- Database time, sampled once per call as v_now. There is no way to pass another clock: no
-- function takes a time argument. Tests replace this function in their own database (only its
-- owner or a superuser can), see zeroth_pg.testing.install_test_clock.
CREATE FUNCTION zeroth._now() RETURNS timestamptz
    LANGUAGE sql VOLATILE
    RETURN clock_timestamp();
COMMENT ON FUNCTION zeroth._now() IS 'Internal: the database clock, clock_timestamp() (not now(): a caller may make several calls in one transaction).';

CREATE FUNCTION zeroth._workspace_key(workspace_id text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN CASE WHEN workspace_id IS NULL THEN '' ELSE 'w:' || workspace_id END;
COMMENT ON FUNCTION zeroth._workspace_key(text) IS 'Internal: maps a workspace id (NULL is the null workspace) to the non-null scope key stored in runs.workspace_key.';

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

CREATE FUNCTION zeroth._grace_interval(grace_seconds double precision) RETURNS interval
    LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF grace_seconds IS NULL OR grace_seconds = 'NaN'::float8 OR grace_seconds < 0 OR grace_seconds > 86400 THEN
        RAISE EXCEPTION 'grace_seconds must be in [0, 86400], got %', coalesce(grace_seconds::text, 'NULL')
            USING ERRCODE = 'ZP008';
    END IF;
    RETURN make_interval(secs => grace_seconds);
END
$$;
COMMENT ON FUNCTION zeroth._grace_interval(double precision) IS 'Internal: validates a takeover grace in seconds (ZP008 unless 0 <= s <= 86400).';

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
COMMENT ON FUNCTION zeroth._require_identifier(text, text) IS 'Internal: ZP008 unless value is a non-empty identifier of at most 200 characters.';

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

-- ---------------------------------------------------------------------------------------------
-- Notifications: opaque keys
-- ---------------------------------------------------------------------------------------------

-- The payload a notification about `subject` carries: 128 bits of sha256(secret, kind, subject),
-- hex. Without the secret a listener learns nothing from it and cannot compute the key of any
-- other subject; NULL parts (the null workspace) hash apart from every string.
CREATE FUNCTION zeroth._notify_key(kind text, subject text[]) RETURNS text
    LANGUAGE sql STABLE
    -- The subject as an array literal: quoted elements and an unquoted NULL, so no character
    -- inside an identifier can make two subjects alike (a joined string with separator
    -- characters could: (t, NULL, d) and (t, chr(30), d) got the same key).
    RETURN (SELECT left(encode(sha256(convert_to(
                       s.secret || chr(31) || kind || chr(31) || subject::text, 'UTF8')), 'hex'), 32)
              FROM zeroth.notification_secret s);
COMMENT ON FUNCTION zeroth._notify_key(text, text[]) IS 'Internal: the opaque NOTIFY payload for a subject: 32 hex digits of sha256(secret, kind, subject).';

-- Work may be claimable in (deployment, tenant, workspace): NOTIFY zeroth_wakeup with that
-- scope's key. PostgreSQL folds identical payloads within one transaction, so a batch notifies once.
CREATE FUNCTION zeroth._notify_wakeup(deployment_ref text, tenant_id text, workspace_id text) RETURNS void
    LANGUAGE sql VOLATILE
    BEGIN ATOMIC
        SELECT pg_notify('zeroth_wakeup', zeroth._notify_key('wakeup', ARRAY[tenant_id, workspace_id, deployment_ref]));
    END;
COMMENT ON FUNCTION zeroth._notify_wakeup(text, text, text) IS 'Internal: NOTIFY zeroth_wakeup with the opaque key of (tenant, workspace, deployment).';

-- A cancel was requested for a run the worker holds: NOTIFY zeroth_control with the worker's key.
-- The worker confirms with renew_leases (which reports cancel_requested) before it stops anything.
CREATE FUNCTION zeroth._notify_control(worker_id text) RETURNS void
    LANGUAGE sql VOLATILE
    BEGIN ATOMIC
        SELECT pg_notify('zeroth_control', zeroth._notify_key('control', ARRAY[worker_id]));
    END;
COMMENT ON FUNCTION zeroth._notify_control(text) IS 'Internal: NOTIFY zeroth_control with the opaque key of a worker id.';

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

CREATE FUNCTION zeroth._claim_marker(active_count integer, saturated boolean, concurrency_limit integer)
    RETURNS zeroth.claimed_run
    LANGUAGE sql IMMUTABLE
    RETURN ROW(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
               active_count, saturated, concurrency_limit)::zeroth.claimed_run;
COMMENT ON FUNCTION zeroth._claim_marker(integer, boolean, integer) IS 'Internal: the run_id-NULL row a claim returns when it claimed nothing, carrying the saturation it saw.';

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

-- Seconds until lease + grace runs out, rounded up and at least 1; NULL without a lease. Clamped
-- to the integer range (a far-off timestamp never raises).
CREATE FUNCTION zeroth._retry_after(lease_expires_at timestamptz, grace interval, at timestamptz) RETURNS integer
    LANGUAGE sql IMMUTABLE
    RETURN CASE WHEN lease_expires_at IS NOT NULL
                THEN least(greatest(1, ceil(extract(epoch FROM lease_expires_at + grace - at))), 2147483647)::integer
           END;
COMMENT ON FUNCTION zeroth._retry_after(timestamptz, interval, timestamptz) IS 'Internal: max(1, ceil(lease_expires_at + grace - at)) in seconds, clamped to the integer range; NULL without a lease.';

CREATE FUNCTION zeroth._stop_error(stop_reason text, message text, worker_id text, generation bigint, previous jsonb)
    RETURNS jsonb
    LANGUAGE sql IMMUTABLE
    RETURN jsonb_build_object('stop_reason', stop_reason, 'message', message, 'worker_id', worker_id,
                              'lease_generation', generation)
           || CASE WHEN previous IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('previous_error', previous) END;
COMMENT ON FUNCTION zeroth._stop_error(text, text, text, bigint, jsonb) IS 'Internal: the error document of a run ended by someone other than its owner ({stop_reason, message, worker_id, lease_generation[, previous_error]}).';

-- ---------------------------------------------------------------------------------------------
-- Admission slots. A slot is held while the run it names holds that generation's live lease in
-- it (runs.lease_generation = slot's, runs.admission_slot = slot_no, lease_expires_at >= now):
-- read through the run row, never from a copy.
-- ---------------------------------------------------------------------------------------------

-- Locks the slot row naming exactly (run, generation), changing nothing: the first step of every
-- function that ends or gives back a lease, so slot rows are locked before run rows everywhere.
CREATE FUNCTION zeroth._lock_slot(tenant_id text, workspace_key text, run_id uuid, generation bigint)
    RETURNS void
    LANGUAGE sql VOLATILE
    BEGIN ATOMIC
        SELECT 1 FROM zeroth.admission_slots s
         WHERE s.run_id = _lock_slot.run_id
           AND s.tenant_id = _lock_slot.tenant_id
           AND s.workspace_key = _lock_slot.workspace_key
           AND s.lease_generation = _lock_slot.generation
           FOR UPDATE;
    END;
COMMENT ON FUNCTION zeroth._lock_slot(text, text, uuid, bigint) IS 'Internal: lock the admission slot naming exactly this (run, generation), changing nothing.';

-- Locks the run row a fenced write names when the lease it names is the caller's (worker id,
-- generation, not yet expired) and returns the run's status, NULL when the lease is not the
-- caller's. Every fenced write reads the clock only after this lock: a write that waited
-- for the row (behind a cancel request, an operator's clear_lease, another call of the same
-- worker) decides with the time it got the row, so a lease that expired or was cleared while it
-- waited is refused. The clock read at the start of the call would have let it land. By primary
-- key, and the status is returned, not filtered: a predicate on the status let a generic plan
-- reach the run through runs_running_idx and walk every running run of the scope.
CREATE FUNCTION zeroth._lock_leased_run(tenant_id text, workspace_key text, run_id uuid,
                                        worker_id text, generation bigint)
    RETURNS zeroth.run_status
    LANGUAGE sql VOLATILE
    BEGIN ATOMIC
        SELECT r.status FROM zeroth.runs r
         WHERE r.tenant_id = _lock_leased_run.tenant_id
           AND r.workspace_key = _lock_leased_run.workspace_key
           AND r.run_id = _lock_leased_run.run_id
           AND r.lease_worker_id = _lock_leased_run.worker_id
           AND r.lease_generation = _lock_leased_run.generation
           -- Already expired: refused without waiting for whoever holds the row.
           AND r.lease_expires_at >= zeroth._now()
           FOR UPDATE;
    END;
COMMENT ON FUNCTION zeroth._lock_leased_run(text, text, uuid, text, bigint) IS 'Internal: lock the run row a fenced write names when its lease is (worker_id, generation) and not expired; return its status (NULL: not that lease). Callers read the clock after it.';

-- Frees the slot naming exactly (run, generation). Called once the run's own UPDATE matched, so a
-- refused write leaves the slot as it was. Returns whether a slot was freed.
CREATE FUNCTION zeroth._free_slot(tenant_id text, workspace_key text, run_id uuid, generation bigint)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE AS $$
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
COMMENT ON FUNCTION zeroth._free_slot(text, text, uuid, bigint) IS 'Internal: free the admission slot naming exactly this (run, generation); true when one was freed.';

-- Takes up to `wanted` free admission slots of a scope, creating the scope's K slot rows on first
-- use. active_count is the number of slots whose lease is live (slots numbered above K, left by a
-- claimer with a larger K, count too, so the live leases never exceed the smallest K in use).
--
-- A slot is free when it names nothing, or its run no longer holds the named lease in it, or that
-- lease expired. The candidates are locked FOR UPDATE SKIP LOCKED (a slot locked by another
-- session is being claimed or freed right now). A candidate whose run still names it (its worker
-- died: the lease expired without a completion) is only reused after its lease is retired: the
-- run row is locked SKIP LOCKED, re-checked on its newest version, and its admission_slot cleared.
-- That write is what makes reuse safe: a renewal of the old lease that waits on the row re-checks
-- its fence against the clock after we commit and is refused; a renewal that holds the row makes
-- us skip the slot. So no lease can be renewed into a slot that was given away.
CREATE FUNCTION zeroth._take_slots(
    tenant_id text, workspace_key text, deployment_ref text, max_concurrency integer, wanted integer,
    at timestamptz, OUT slots integer[], OUT active_count integer)
    LANGUAGE plpgsql VOLATILE
    SET plan_cache_mode = force_generic_plan AS $$
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
COMMENT ON FUNCTION zeroth._take_slots(text, text, text, integer, integer, timestamptz) IS 'Internal: lock up to `wanted` free concurrency slots of a scope (SKIP LOCKED), retiring the expired leases they still name, and report the live-slot count.';

-- ---------------------------------------------------------------------------------------------
-- Threads (helpers of 0004, unchanged in behaviour)
-- ---------------------------------------------------------------------------------------------

-- Serialises admissions (and redrives) of one thread: a row lock on its stripe of
-- zeroth.lock_stripes (see the table); threads that share a stripe only wait for each other.
CREATE FUNCTION zeroth._thread_stripe(tenant_id text, workspace_key text, thread_id text) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    -- The key is an array's text, so no separator character inside an identifier makes two alike.
    RETURN (hashtextextended(ARRAY[tenant_id, workspace_key, thread_id]::text, 1516464242) & 16383)::integer;
COMMENT ON FUNCTION zeroth._thread_stripe(text, text, text) IS 'Internal: the zeroth.lock_stripes row (0..16383) that serialises admissions of this thread.';

CREATE FUNCTION zeroth._lock_thread(tenant_id text, workspace_key text, thread_id text) RETURNS void
    LANGUAGE sql VOLATILE
    BEGIN ATOMIC
        SELECT 1 FROM zeroth.lock_stripes l
         WHERE l.stripe = zeroth._thread_stripe(_lock_thread.tenant_id, _lock_thread.workspace_key,
                                                 _lock_thread.thread_id)
           FOR UPDATE;
    END;
COMMENT ON FUNCTION zeroth._lock_thread(text, text, text) IS 'Internal: lock the thread''s stripe of zeroth.lock_stripes until the transaction ends (admissions, redrive).';

-- The thread_queued_at of a run joining a thread's queue: now, but always after the last queued
-- run, so the queue stays first-in first-out even for runs queued in the same microsecond.
-- Callers hold the thread's lock (_lock_thread), so the max is stable.
CREATE FUNCTION zeroth._queue_position(tenant_id text, workspace_key text, thread_id text, at timestamptz)
    RETURNS timestamptz
    LANGUAGE sql STABLE
    RETURN greatest(at, (SELECT max(r.thread_queued_at) + interval '1 microsecond'
                           FROM zeroth.runs r
                          WHERE r.tenant_id = _queue_position.tenant_id
                            AND r.workspace_key = _queue_position.workspace_key
                            AND r.thread_id = _queue_position.thread_id
                            AND r.thread_queued_at IS NOT NULL));
COMMENT ON FUNCTION zeroth._queue_position(text, text, text, timestamptz) IS 'Internal: thread_queued_at for a run joining the queue: max(at, last queued + 1 µs), so the queue is FIFO.';

-- Promotes the oldest queued run of a thread to pending and wakes workers. Called when the
-- active run ended (trigger) or when an admission finds a queue without an active run. Waits for
-- a row lock on the head (a concurrent cancel of it decides first) and then takes the next one.
CREATE FUNCTION zeroth._promote_thread_head(tenant_id text, workspace_key text, thread_id text, at timestamptz)
    RETURNS uuid
    LANGUAGE plpgsql VOLATILE AS $$
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
COMMENT ON FUNCTION zeroth._promote_thread_head(text, text, text, timestamptz) IS 'Internal: queued head of a thread → pending (FIFO by thread_queued_at); notifies zeroth_wakeup when it is due. Returns the promoted run or NULL.';

-- Finds and locks the active run of a thread (its slot rows first, then the run), or returns a
-- row of NULLs when the thread is idle. If the run ends while we wait for its lock, look again.
-- A queue without an active run (left by a REPEATABLE READ caller) is healed by promoting its head.
CREATE FUNCTION zeroth._lock_thread_active(tenant_id text, workspace_key text, thread_id text, at timestamptz)
    RETURNS zeroth.runs
    LANGUAGE plpgsql VOLATILE AS $$
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
COMMENT ON FUNCTION zeroth._lock_thread_active(text, text, text, timestamptz) IS 'Internal: lock (slots, then run) and return the active run of a thread, or a NULL row when idle; promotes a stranded queue head.';

-- A run joined the queue behind the thread's active run: write the active run's row (a new row
-- version, no column changed). The trigger that promotes the queue when the active run ends reads
-- the queue in the finishing transaction's snapshot; a REPEATABLE READ or SERIALIZABLE transaction
-- whose snapshot is older than the queued run would not see it, and stranded it (waiting, no
-- active run, nothing to promote it until the next admission). With this write such a transaction
-- fails to finish the run with 40001 (could not serialize access) and retries with a snapshot that
-- sees the queue; a READ COMMITTED one waits for the row and then sees it anyway.
CREATE FUNCTION zeroth._mark_queue_changed(tenant_id text, workspace_key text, run_id uuid) RETURNS void
    LANGUAGE sql VOLATILE
    BEGIN ATOMIC
        UPDATE zeroth.runs r
           SET updated_at = r.updated_at
         WHERE r.tenant_id = _mark_queue_changed.tenant_id
           AND r.workspace_key = _mark_queue_changed.workspace_key
           AND r.run_id = _mark_queue_changed.run_id;
    END;
COMMENT ON FUNCTION zeroth._mark_queue_changed(text, text, uuid) IS 'Internal: write the thread''s active run row (no column changed) when a run joins its queue, so a REPEATABLE READ / SERIALIZABLE finisher with an older snapshot fails with 40001 instead of stranding the queue.';

-- Ends the thread's active run → promote its queue; every end of a thread run is announced on
-- zeroth_run_finished with the run's opaque key (join waits on it). The finishing call's own time
-- (updated_at) is used.
CREATE OR REPLACE FUNCTION zeroth._thread_run_finished() RETURNS trigger
    LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_notify('zeroth_run_finished', zeroth._notify_key(
        'run_finished', ARRAY[NEW.tenant_id, NEW.workspace_key, NEW.run_id::text]));
    IF OLD.thread_queued_at IS NULL THEN
        PERFORM zeroth._promote_thread_head(NEW.tenant_id, NEW.workspace_key, NEW.thread_id, NEW.updated_at);
    END IF;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION zeroth._thread_run_finished() IS 'Internal trigger: a thread run ended → NOTIFY zeroth_run_finished with the run''s opaque key; if it was the active run, promote the queue head.';

CREATE FUNCTION zeroth._thread_run(r zeroth.runs) RETURNS zeroth.thread_run
    LANGUAGE sql IMMUTABLE
    RETURN ROW(r.run_id, r.thread_id, r.deployment_ref, r.status, r.thread_queued_at IS NOT NULL, r.wait_reason,
               r.attempts, r.max_attempts, r.resumable, r.created_at, r.started_at, r.finished_at, r.updated_at,
               r.lease_worker_id, r.lease_generation, r.lease_expires_at, r.cancel_action, r.cancel_requested_at,
               r.idempotency_key, r.payload, r.metadata, r.output, r.error, r.progress, r.accounting)::zeroth.thread_run;
COMMENT ON FUNCTION zeroth._thread_run(zeroth.runs) IS 'Internal: a runs row as zeroth.thread_run.';

-- ---------------------------------------------------------------------------------------------
-- Takeover and cancel decisions (shared by the claims, the cancels and admit_run)
-- ---------------------------------------------------------------------------------------------

-- Ends or hands back one run whose owner's lease expired more than grace ago. Never waits: the
-- slot row and then the run row are taken with SKIP LOCKED, so an owner renewing right now wins
-- and the call returns nothing. The expiry is re-checked in the locking predicate. Outcome: a
-- requested cancel → cancelled; not resumable → failed with {stop_reason, message}; resumable
-- and out of attempts (a running run) → failed and dead-lettered, stop_reason attempts_exhausted;
-- else → requeued (pending). The interrupted attempt stays counted: only a hand-back by the live
-- holder gives one back, so a run that kills every worker it lands on ends after max_attempts.
CREATE FUNCTION zeroth._take_over(tenant_id text, workspace_key text, run_id uuid, grace interval, at timestamptz,
                                  stop_reason text, message text)
    RETURNS SETOF zeroth.takeover
    LANGUAGE plpgsql VOLATILE AS $$
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
COMMENT ON FUNCTION zeroth._take_over(text, text, uuid, interval, timestamptz, text, text) IS 'Internal: the takeover of one run whose lease expired past grace (SKIP LOCKED throughout): cancelled | failed | dead_lettered | requeued. Shared by claim_for_takeover, reconcile_thread_runs and claim_orphaned.';

-- The cancel decision, shared by request_cancel, request_cancel_v2 and admit_run. Locks the run's
-- slots, then the run (a no-op when the caller holds them). pending / waiting / queued → cancelled
-- at once (a claimed but unstarted holder is fenced out: the start barrier). running whose owner's
-- lease + grace has not run out → cancel_requested (durable flag, first action wins, NOTIFY to the
-- owner's key), unless the caller proves it is that owner: its worker id and live generation.
-- running past lease + grace → taken_over: cancelled here with a stop reason, slot freed. The
-- owner's later writes are refused by the fence.
CREATE FUNCTION zeroth._cancel(tenant_id text, workspace_key text, run_id uuid, action text, grace interval,
                               at timestamptz, caller_worker_id text DEFAULT NULL, caller_generation bigint DEFAULT NULL)
    RETURNS zeroth.cancel_result
    LANGUAGE plpgsql VOLATILE AS $$
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
COMMENT ON FUNCTION zeroth._cancel(text, text, uuid, text, interval, timestamptz, text, bigint) IS 'Internal: the cancel decision of request_cancel(_v2) and admit_run: cancelled | cancel_requested | taken_over | not_cancellable | unknown. The caller counts as the owner only with the live (worker id, generation).';

-- ---------------------------------------------------------------------------------------------
-- Claims
-- ---------------------------------------------------------------------------------------------

-- Leases runs the caller has already locked (FOR UPDATE SKIP LOCKED) and, under max_concurrency,
-- pairs run_ids[i] with the already locked slot slots[i]: new generation, worker, times, slot, the
-- latest checkpoint as recovery point. Counts an attempt for every run that starts here (start:
-- pending → running) and for every running run re-leased after its lease expired (an orphan: its
-- last attempt died with its worker). Returns the claimed rows in input order, or the run_id-NULL
-- row that says nothing was claimable.
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
COMMENT ON FUNCTION zeroth._lease_locked_runs(text, text, uuid[], integer[], text, timestamptz, interval, integer, integer, boolean) IS 'Internal: lease runs (and slots) the caller already locked; with start make pending ones running; count an attempt per start and per re-leased orphan. The shared second half of claim_pending, claim_and_start and claim_orphaned.';

-- The body of claim_pending and claim_and_start: take free admission slots (max_concurrency),
-- lock up to that many pending runs with SKIP LOCKED, lease them (and with start, make them
-- running). Locks: slot rows, then run rows, all FOR UPDATE SKIP LOCKED, so no claimer ever waits
-- on another. Raises ZP006, ZP008.
CREATE FUNCTION zeroth._claim_pending(
    deployment_ref text, worker_id text, tenant_id text, workspace_id text, max_concurrency integer,
    batch_size integer, lease_seconds double precision, start boolean)
    RETURNS SETOF zeroth.claimed_run
    LANGUAGE plpgsql VOLATILE
    SET plan_cache_mode = force_generic_plan AS $$
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
COMMENT ON FUNCTION zeroth._claim_pending(text, text, text, text, integer, integer, double precision, boolean) IS 'Internal: the body of claim_pending (start false) and claim_and_start (start true).';

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
    lease_seconds   double precision DEFAULT 60)
    RETURNS SETOF zeroth.claimed_run
    LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    BEGIN ATOMIC
        SELECT * FROM zeroth._claim_pending(deployment_ref, worker_id, tenant_id, workspace_id,
                                            max_concurrency, batch_size, lease_seconds, false);
    END;
COMMENT ON FUNCTION zeroth.claim_pending(text, text, text, text, integer, integer, double precision) IS
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
    lease_seconds   double precision DEFAULT 60)
    RETURNS SETOF zeroth.claimed_run
    LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    BEGIN ATOMIC
        SELECT * FROM zeroth._claim_pending(deployment_ref, worker_id, tenant_id, workspace_id,
                                            max_concurrency, batch_size, lease_seconds, true);
    END;
COMMENT ON FUNCTION zeroth.claim_and_start(text, text, text, text, integer, integer, double precision) IS
'claim_and_start: claim_pending and start_run in one call — up to batch_size pending runs are leased (new generation) and made running (attempt counted, started_at set) by one UPDATE. Same order, max_concurrency slots, saturation row and SKIP LOCKED locking as claim_pending. Raises ZP006, ZP008. Time: clock_timestamp().';

-- claim_orphaned: recover running runs whose lease expired (crashed or stalled owners).
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
-- Locks: slot rows then run rows, SKIP LOCKED. Raises ZP006, ZP008. Notifies zeroth_wakeup for
-- runs it ended (slots freed, threads promoted). Time: clock_timestamp().
CREATE FUNCTION zeroth.claim_orphaned(
    deployment_ref  text,
    worker_id       text,
    tenant_id       text             DEFAULT NULL,
    workspace_id    text             DEFAULT NULL,
    max_concurrency integer          DEFAULT NULL,
    claim_limit     integer          DEFAULT NULL,
    lease_seconds   double precision DEFAULT 60,
    grace_seconds   double precision DEFAULT 10)
    RETURNS SETOF zeroth.claimed_run
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    SET plan_cache_mode = force_generic_plan AS $$
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
COMMENT ON FUNCTION zeroth.claim_orphaned(text, text, text, text, integer, integer, double precision, double precision) IS
'claim_orphaned: recover running runs whose lease expired. First ends the ones nobody may resume (resumable but out of attempts → failed + dead-lettered, stop_reason attempts_exhausted; not resumable and expired more than grace_seconds ago → failed, stop_reason orphan_recovered; cancel requested → cancelled), then re-leases resumable ones with attempts left: new generation, attempt counted, recovery_checkpoint_id = latest checkpoint. claim_limit bounds the batch. A single run_id-NULL row reports saturation (an orphan is waiting but no slot is free) or a definitive empty scan. SKIP LOCKED throughout. Raises ZP006, ZP008. Notifies zeroth_wakeup for the runs it ended. Time: clock_timestamp().';

-- ---------------------------------------------------------------------------------------------
-- Admission (threads)
-- ---------------------------------------------------------------------------------------------

-- An existing run that an admission must return instead of creating one: same idempotency key
-- (tenant, workspace, deployment) or same caller-chosen run_id. The first admission wins: a retry
-- gets that run back whatever payload it carries now, sequentially or concurrently. strict: it
-- must belong to this thread (admit_run), else ZP008. The lease is reported only to its holder.
CREATE FUNCTION zeroth._admission_reuse(tenant_id text, workspace_key text, deployment_ref text, thread_id text,
                                        idempotency_key text, run_id uuid, worker_id text, strict boolean)
    RETURNS zeroth.admission
    LANGUAGE plpgsql STABLE AS $$
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
COMMENT ON FUNCTION zeroth._admission_reuse(text, text, text, text, text, uuid, text, boolean) IS 'Internal: the run an admission returns as reused (same idempotency key or run_id; the first admission wins whatever the payload), or a NULL outcome.';

-- interrupt / rollback: the new run supersedes the thread's queue and its active run. Locks the
-- active run (slots, then run), then the queue; cancels the queued runs first, so ending the
-- active run promotes nothing, then the active run (_cancel: at once, taken over, or — a live
-- owner other than the caller's proven lease — asked to stop). Returns
-- [{run_id, outcome, worker_id, lease_generation}].
CREATE FUNCTION zeroth._displace(tenant_id text, workspace_key text, thread_id text, action text, grace interval,
                                 at timestamptz, worker_id text, owner_generation bigint)
    RETURNS jsonb
    LANGUAGE plpgsql VOLATILE AS $$
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
COMMENT ON FUNCTION zeroth._displace(text, text, text, text, interval, timestamptz, text, bigint) IS 'Internal: interrupt / rollback of a thread: cancel its queue, then cancel (or ask the live owner to stop) its active run; returns the displaced runs.';

-- The admission proper, shared by admit_run (after _displace), enqueue_run and enqueue_runs: an
-- idle thread admits (leased to worker_id when given), a busy one answers busy (reject) or queues
-- the run (enqueue). Serialised per thread by the thread's lock (_lock_thread); a retried admission is looked up
-- again once the lock is held (its first attempt may have committed while we waited), and the
-- unique index is the backstop (ON CONFLICT DO NOTHING, then look again). displaced is passed
-- through to the result.
CREATE FUNCTION zeroth._admit(
    tenant_id text, workspace_id text, deployment_ref text, thread_id text, queue_when_busy boolean,
    worker_id text, payload jsonb, metadata jsonb, priority integer, run_after timestamptz, max_attempts integer,
    idempotency_key text, run_id uuid, resumable boolean, lease interval, grace interval, at timestamptz,
    strict boolean, displaced jsonb DEFAULT '[]'::jsonb)
    RETURNS zeroth.admission
    LANGUAGE plpgsql VOLATILE AS $$
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
COMMENT ON FUNCTION zeroth._admit(text, text, text, text, boolean, text, jsonb, jsonb, integer, timestamptz, integer, text, uuid, boolean, interval, interval, timestamptz, boolean, jsonb) IS 'Internal: the admission of admit_run and of enqueue_run(s) with a thread_id: admitted, queued, busy or reused.';

-- admit_run: create a run for a thread; with worker_id (admit-and-own) lease it to the caller at
-- generation 1 in the same statement (status pending: claim_pending skips it while the lease
-- lives; the caller starts it with start_run). Admit-and-own leases are not claims: they take no
-- admission slot and do not count against any max_concurrency. Strategy when the thread has an
-- active run: reject → busy; enqueue → queued behind it; interrupt / rollback → queued runs
-- cancelled and the active run cancelled with that action, then admitted — or, if a live owner
-- must first stop (cancel requested, NOTIFY), queued behind it. The caller's own active run is
-- cancelled at once only when it proves ownership with worker_id and owner_generation (its live
-- lease). A repeated idempotency key or run_id returns reused (the first admission wins, whatever
-- the payload). Locks: the thread's lock, slots, active run, queue. Raises ZP006, ZP008.
-- Notifies zeroth_wakeup, zeroth_control. Time: clock_timestamp().
CREATE FUNCTION zeroth.admit_run(
    deployment_ref   text,
    thread_id        text,
    strategy         text             DEFAULT 'reject',
    worker_id        text             DEFAULT NULL,
    payload          jsonb            DEFAULT '{}'::jsonb,
    tenant_id        text             DEFAULT NULL,
    workspace_id     text             DEFAULT NULL,
    lease_seconds    double precision DEFAULT 60,
    grace_seconds    double precision DEFAULT 10,
    idempotency_key  text             DEFAULT NULL,
    metadata         jsonb            DEFAULT '{}'::jsonb,
    run_id           uuid             DEFAULT NULL,
    priority         integer          DEFAULT 0,
    max_attempts     integer          DEFAULT 3,
    resumable        boolean          DEFAULT NULL,
    owner_generation bigint           DEFAULT NULL)
    RETURNS zeroth.admission
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
COMMENT ON FUNCTION zeroth.admit_run(text, text, text, text, jsonb, text, text, double precision, double precision, text, jsonb, uuid, integer, integer, boolean, bigint) IS
'admit_run: create a run for a thread, at most one active per thread. worker_id = admit-and-own: leased to the caller at generation 1 in the same statement (pending; start it with start_run; takes no admission slot). Strategies when busy: reject → busy (+ active_run_id, retry_after_s); enqueue → queued behind it; interrupt / rollback → queue and active run cancelled with that action, then admitted, or queued behind a live owner asked to stop (NOTIFY). The caller''s own active run is cancelled at once only with worker_id + owner_generation of its live lease. A repeated idempotency key or run_id returns reused (first admission wins). Raises ZP006, ZP008. Notifies zeroth_wakeup, zeroth_control. Time: clock_timestamp().';

-- ---------------------------------------------------------------------------------------------
-- Enqueue
-- ---------------------------------------------------------------------------------------------

-- enqueue_run: new → pending, or, for a thread that already has an active run, new → waiting
-- behind it (thread queue, as admit_run's enqueue strategy: promoted to pending when that run
-- ends). A repeated idempotency key (per tenant, workspace and deployment) or caller-chosen
-- run_id returns the existing run with created = false (the first enqueue wins, whatever the
-- payload). Locks: the thread's lock and active run (thread runs only), else the
-- unique-index entry. Raises ZP006 invalid_scope, ZP008 invalid_argument. Notifies zeroth_wakeup
-- when it creates a pending run that is due now. Time: clock_timestamp().
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
    thread_id       text        DEFAULT NULL)
    RETURNS zeroth.enqueued_run
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
COMMENT ON FUNCTION zeroth.enqueue_run(text, jsonb, text, text, integer, timestamptz, integer, text, jsonb, uuid, text) IS
'enqueue_run: new → pending; with a thread_id whose thread has an active run, new → waiting in the thread queue (promoted to pending when that run ends). A repeated idempotency key (per tenant, workspace, deployment) or caller-chosen run_id returns the existing run with created = false (first enqueue wins, whatever the payload). Raises ZP006 invalid_scope, ZP008 invalid_argument. Notifies zeroth_wakeup when it creates a pending run that is due now. Time: clock_timestamp().';

-- Parses and checks the items of an enqueue_runs batch: one row per item, in input order, typed,
-- each with the run_id it will get (the caller's or a fresh one). Raises ZP008 naming the first
-- bad item, so nothing is written. The casts run for the whole batch at once; only when one fails
-- are the items cast one by one, to say which. Nothing is written inside the EXCEPTION block, so
-- its subtransaction never takes a transaction id.
CREATE FUNCTION zeroth._enqueue_items(runs jsonb) RETURNS zeroth.enqueue_item[]
    LANGUAGE plpgsql VOLATILE AS $$
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
COMMENT ON FUNCTION zeroth._enqueue_items(jsonb) IS 'Internal: the items of an enqueue_runs batch, parsed and checked (ZP008 naming the first bad one), each with the run_id it will get.';

-- enqueue_runs: enqueue_run for a batch of one deployment and scope, in one transaction and, for
-- the runs without a thread, one INSERT. runs is a JSON array of objects with optional keys
-- payload, priority, run_after, max_attempts, idempotency_key, metadata, run_id, thread_id.
-- Results come back in input order (ordinality); a repeated idempotency key or run_id — in the
-- database or earlier in the batch — returns that run with created = false. Every thread lock
-- the batch needs is taken first, in one sorted order, so two batches that share threads cannot
-- deadlock; the runs are inserted in (idempotency_key, run_id) order, so two batches that share
-- keys wait for each other in one order. Raises ZP006, ZP008 (the whole batch is rejected, nothing
-- written). Notifies zeroth_wakeup once when it created a pending run that is due now.
-- Time: clock_timestamp().
-- The writes of one enqueue_runs batch: every thread lock (in stripe order), then the runs without
-- a thread in one INSERT, then each thread item admitted. Returns what was created, for the
-- caller to report; enqueue_runs may run it again after a deadlock (see there).
CREATE FUNCTION zeroth._enqueue_batch(
    tenant_id text, workspace_key text, workspace_id text, deployment_ref text,
    items zeroth.enqueue_item[], at timestamptz,
    OUT created uuid[], OUT keys text[], OUT t_pos bigint[], OUT t_run uuid[],
    OUT t_created boolean[], OUT t_status zeroth.run_status[])
    LANGUAGE plpgsql VOLATILE AS $$
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
COMMENT ON FUNCTION zeroth._enqueue_batch(text, text, text, text, zeroth.enqueue_item[], timestamptz) IS 'Internal: the writes of one enqueue_runs batch (thread locks in stripe order, one INSERT for the runs without a thread, one admission per thread item); returns what was created.';

CREATE FUNCTION zeroth.enqueue_runs(
    deployment_ref text,
    runs           jsonb,
    tenant_id      text DEFAULT NULL,
    workspace_id   text DEFAULT NULL)
    RETURNS TABLE (ordinality bigint, run_id uuid, created boolean, status zeroth.run_status)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
COMMENT ON FUNCTION zeroth.enqueue_runs(text, jsonb, text, text) IS
'enqueue_runs: batch enqueue_run for one deployment and scope (one INSERT for the runs without a thread); runs is a JSON array of objects (payload, priority, run_after, max_attempts, idempotency_key, metadata, run_id, thread_id). Results in input order; a repeated key or run_id returns that run with created = false. Thread locks are taken first in one sorted order, inserts run in key order: concurrent batches cannot deadlock on threads or keys. Raises ZP006, ZP008 and rejects the whole batch. Notifies zeroth_wakeup once when a due pending run was created. Time: clock_timestamp().';

-- ---------------------------------------------------------------------------------------------
-- Lease upkeep
-- ---------------------------------------------------------------------------------------------

-- renew_lease: extend a live lease held by (worker_id, generation). An expired lease is never
-- renewed, even when nobody took the run. The row is locked first and the expiry checked against
-- the clock again once the lock is held, so a renewal that waited for the row (a claim retiring
-- the lease's slot, an orphan claim) decides on the time it really writes. generation NULL =
-- owner only (seed compatibility). Slots are not touched: a slot is held through the run's lease.
-- Locks: the run row. Returns false when refused. Raises ZP008. Notifies nothing.
-- Time: clock_timestamp().
CREATE FUNCTION zeroth.renew_lease(
    run_id        uuid,
    worker_id     text,
    generation    bigint           DEFAULT NULL,
    tenant_id     text             DEFAULT NULL,
    workspace_id  text             DEFAULT NULL,
    lease_seconds double precision DEFAULT 60)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
COMMENT ON FUNCTION zeroth.renew_lease(uuid, text, bigint, text, text, double precision) IS
'renew_lease: extend a live lease held by (worker_id, generation); an expired lease is never renewed, even if untaken (the expiry is re-checked once the row lock is held). generation NULL = owner only. Returns false when refused. Raises ZP008. Time: clock_timestamp().';

-- renew_leases: one call renews all of a worker's leases. run_ids[i] is renewed only while
-- generations[i] is live and held by worker_id (checked again once the row lock is held, as
-- renew_lease does). Returns one row per requested run with the new expiry and whether a cancel
-- was requested, so a worker learns of losses and cancels together — this is also how a worker
-- confirms a zeroth_control notification. Locks: the runs, in run_id order (as complete_runs), so
-- renewing and completing overlapping sets on two connections cannot deadlock. Raises ZP008
-- (arrays of different lengths, NULLs, a repeated run, more than 1000). Time: clock_timestamp().
CREATE FUNCTION zeroth.renew_leases(
    worker_id     text,
    run_ids       uuid[],
    generations   bigint[],
    tenant_id     text             DEFAULT NULL,
    workspace_id  text             DEFAULT NULL,
    lease_seconds double precision DEFAULT 60)
    RETURNS SETOF zeroth.lease_renewal
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    SET plan_cache_mode = force_generic_plan AS $$
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
COMMENT ON FUNCTION zeroth.renew_leases(text, uuid[], bigint[], text, text, double precision) IS
'renew_leases: batch renew_lease for one worker; run_ids[i] is renewed only while generations[i] is live and held by worker_id (re-checked under the row lock). One row per requested run (renewed, new expiry, cancel_requested), in input order: how a worker confirms a cancel notification. Locks runs in run_id order. Raises ZP008 (unequal arrays, NULLs, a repeated run, more than 1000). Time: clock_timestamp().';

-- ---------------------------------------------------------------------------------------------
-- Reads
-- ---------------------------------------------------------------------------------------------

-- current_generation / current_holder / get_recovery_checkpoint_id: scoped reads, no locks.
CREATE FUNCTION zeroth.current_generation(run_id uuid, tenant_id text DEFAULT NULL, workspace_id text DEFAULT NULL)
    RETURNS bigint
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    RETURN (SELECT r.lease_generation FROM zeroth.runs r
             WHERE r.tenant_id = zeroth._scope_tenant(current_generation.tenant_id, current_generation.workspace_id)
               AND r.workspace_key = zeroth._workspace_key(current_generation.workspace_id)
               AND r.run_id = current_generation.run_id);
COMMENT ON FUNCTION zeroth.current_generation(uuid, text, text) IS
'current_generation: the run''s lease generation (0 before its first claim), or NULL when no run has this id in this scope. Read only.';

CREATE FUNCTION zeroth.current_holder(run_id uuid, tenant_id text DEFAULT NULL, workspace_id text DEFAULT NULL)
    RETURNS text
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    RETURN (SELECT r.lease_worker_id FROM zeroth.runs r
             WHERE r.tenant_id = zeroth._scope_tenant(current_holder.tenant_id, current_holder.workspace_id)
               AND r.workspace_key = zeroth._workspace_key(current_holder.workspace_id)
               AND r.run_id = current_holder.run_id);
COMMENT ON FUNCTION zeroth.current_holder(uuid, text, text) IS
'current_holder: the worker id named in the run''s lease (live or expired but not yet taken over), or NULL. Read only.';

CREATE FUNCTION zeroth.get_recovery_checkpoint_id(run_id uuid, tenant_id text DEFAULT NULL, workspace_id text DEFAULT NULL)
    RETURNS uuid
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    RETURN (SELECT r.recovery_checkpoint_id FROM zeroth.runs r
             WHERE r.tenant_id = zeroth._scope_tenant(get_recovery_checkpoint_id.tenant_id, get_recovery_checkpoint_id.workspace_id)
               AND r.workspace_key = zeroth._workspace_key(get_recovery_checkpoint_id.workspace_id)
               AND r.run_id = get_recovery_checkpoint_id.run_id);
COMMENT ON FUNCTION zeroth.get_recovery_checkpoint_id(uuid, text, text) IS
'get_recovery_checkpoint_id: the checkpoint the current lease holder should resume from (set by a claim when the run has checkpoints), or NULL. Read only.';

-- count_pending: the pending runs of one deployment in one scope — what a worker's queue-depth
-- gauge reads. A worker role has no table privileges, so it gets this read instead of the
-- views. Uses runs_claim_pending_idx. No locks. Raises nothing. Time: none.
CREATE FUNCTION zeroth.count_pending(
    deployment_ref text,
    tenant_id      text DEFAULT NULL,
    workspace_id   text DEFAULT NULL)
    RETURNS bigint
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    RETURN (SELECT count(*) FROM zeroth.runs r
             WHERE r.tenant_id = zeroth._scope_tenant(count_pending.tenant_id, count_pending.workspace_id)
               AND r.workspace_key = zeroth._workspace_key(count_pending.workspace_id)
               AND r.deployment_ref = count_pending.deployment_ref
               AND r.status = 'pending');
COMMENT ON FUNCTION zeroth.count_pending(text, text, text) IS
'count_pending: number of pending runs of a deployment in a scope (the worker''s queue-depth gauge); read only, through runs_claim_pending_idx. Raises nothing.';

-- list_thread_runs: the runs of a thread in this scope, newest first (created_at, run_id), at
-- most max_runs (capped at 1000), through runs_thread_idx. A scoped read: no locks, no
-- errors (an unknown thread is no rows). Time: none.
CREATE FUNCTION zeroth.list_thread_runs(
    thread_id    text,
    tenant_id    text    DEFAULT NULL,
    workspace_id text    DEFAULT NULL,
    max_runs     integer DEFAULT 20)
    RETURNS SETOF zeroth.thread_run
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    BEGIN ATOMIC
        SELECT t.*
          FROM zeroth.runs r
         CROSS JOIN LATERAL zeroth._thread_run(r) AS t
         WHERE r.tenant_id = zeroth._scope_tenant(list_thread_runs.tenant_id, list_thread_runs.workspace_id)
           AND r.workspace_key = zeroth._workspace_key(list_thread_runs.workspace_id)
           AND r.thread_id = list_thread_runs.thread_id
         ORDER BY r.created_at DESC, r.run_id DESC
         LIMIT greatest(least(list_thread_runs.max_runs, 1000), 0);
    END;
COMMENT ON FUNCTION zeroth.list_thread_runs(text, text, text, integer) IS
'list_thread_runs: the runs of a thread, newest first (created_at, run_id), at most max_runs (capped at 1000). Read only.';

-- get_thread_run: one run (with a thread or not) as zeroth.thread_run, or no row when no run
-- has this id in this scope; join re-reads a run with it. A scoped read: no locks, no errors.
-- Time: none.
CREATE FUNCTION zeroth.get_thread_run(run_id uuid, tenant_id text DEFAULT NULL, workspace_id text DEFAULT NULL)
    RETURNS SETOF zeroth.thread_run
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    BEGIN ATOMIC
        SELECT t.*
          FROM zeroth.runs r
         CROSS JOIN LATERAL zeroth._thread_run(r) AS t
         WHERE r.tenant_id = zeroth._scope_tenant(get_thread_run.tenant_id, get_thread_run.workspace_id)
           AND r.workspace_key = zeroth._workspace_key(get_thread_run.workspace_id)
           AND r.run_id = get_thread_run.run_id;
    END;
COMMENT ON FUNCTION zeroth.get_thread_run(uuid, text, text) IS
'get_thread_run: one run (thread or not) as zeroth.thread_run, or no row when no run has this id in this scope. Read only.';

-- wakeup_key / control_key / run_finished_key: the opaque payloads the channels carry, for the
-- caller to compare with what it hears. zeroth_wakeup carries the key of a (deployment, tenant,
-- workspace) whose work may be claimable; zeroth_control the key of a worker id that was asked to
-- stop a run (confirm with renew_leases); zeroth_run_finished the key of a thread run that ended.
-- A key means nothing without the secret and cannot be computed for another subject. Read only.
-- Raise ZP006 (workspace without tenant), ZP008.
CREATE FUNCTION zeroth.wakeup_key(deployment_ref text, tenant_id text DEFAULT NULL, workspace_id text DEFAULT NULL)
    RETURNS text
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
COMMENT ON FUNCTION zeroth.wakeup_key(text, text, text) IS
'wakeup_key: the opaque payload the wakeup channel carries for this (deployment, tenant, workspace). Read only; notifies nothing. Raises ZP006, ZP008.';

CREATE FUNCTION zeroth.control_key(worker_id text) RETURNS text
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM zeroth._require_identifier(control_key.worker_id, 'worker_id');
    RETURN zeroth._notify_key('control', ARRAY[control_key.worker_id]);
END
$$;
COMMENT ON FUNCTION zeroth.control_key(text) IS
'control_key: the opaque payload the control channel carries for this worker id (a cancel was requested for one of its runs; confirm with renew_leases before acting). Read only; notifies nothing. Raises ZP008.';

CREATE FUNCTION zeroth.run_finished_key(run_id uuid, tenant_id text DEFAULT NULL, workspace_id text DEFAULT NULL)
    RETURNS text
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
COMMENT ON FUNCTION zeroth.run_finished_key(uuid, text, text) IS
'run_finished_key: the opaque payload the run-finished channel carries when this thread run ends. Read only; notifies nothing. Raises ZP006, ZP008.';

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
    tenant_id    text DEFAULT NULL,
    workspace_id text DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
COMMENT ON FUNCTION zeroth.commit_fenced(uuid, text, bigint, jsonb, text, text) IS
'commit_fenced: write allowlisted run columns (output, error, metadata, progress) only while (worker_id, generation) holds a live lease; the fence is in the UPDATE predicate. Lease/fence/status/identity columns raise ZP004 however spelled; other names raise ZP005. Returns false when fenced out. Raises ZP008. Time: clock_timestamp().';

-- update_run_progress: the owner merges JSON objects into progress and/or accounting (top-level
-- keys replace, omitted keys are kept) while the run is running. Fenced by (worker_id,
-- generation, live lease). Returns false when fenced out (a terminal run has no lease). Raises
-- ZP003 (holder but not running), ZP008 (not objects, both NULL, over 64 kB). Time: clock_timestamp().
CREATE FUNCTION zeroth.update_run_progress(
    run_id       uuid,
    worker_id    text,
    generation   bigint,
    progress     jsonb DEFAULT NULL,
    accounting   jsonb DEFAULT NULL,
    tenant_id    text  DEFAULT NULL,
    workspace_id text  DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
COMMENT ON FUNCTION zeroth.update_run_progress(uuid, text, bigint, jsonb, jsonb, text, text) IS
'update_run_progress: the lease holder merges JSON objects into progress and/or accounting (top-level keys replace, omitted keys kept) while the run is running; fenced by (worker_id, generation, live lease). Returns false when fenced out. Raises ZP003 (holder but not running), ZP008. Time: clock_timestamp().';

-- start_run: pending → running, fenced. Counts an attempt. Idempotent for the holder of a running
-- run (a recovered run is already running), so a worker may call it on every drive.
-- Locks: the run row. Returns false when fenced out. Raises ZP008. Time: clock_timestamp().
CREATE FUNCTION zeroth.start_run(
    run_id       uuid,
    worker_id    text,
    generation   bigint,
    tenant_id    text DEFAULT NULL,
    workspace_id text DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
COMMENT ON FUNCTION zeroth.start_run(uuid, text, bigint, text, text) IS
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
    checkpoint_id uuid DEFAULT NULL,
    tenant_id     text DEFAULT NULL,
    workspace_id  text DEFAULT NULL)
    RETURNS uuid
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
COMMENT ON FUNCTION zeroth.save_checkpoint(uuid, text, bigint, jsonb, uuid, text, text) IS
'save_checkpoint: append a checkpoint (or replace one by checkpoint_id) of a running run, fenced by (worker_id, generation, live lease); run row and checkpoint written together. Returns the checkpoint id, or NULL when fenced out. Raises ZP003 (not running), ZP007 (checkpoint of another run), ZP008. Time: clock_timestamp().';

-- complete_run: running → completed, fenced; stores output (SQL NULL keeps what commit_fenced
-- wrote, JSON null clears it), clears the lease, frees the slot. Locks: the admission slot, then
-- the run. Returns false when fenced out. Raises ZP003 (holder but not running), ZP008. Notifies
-- zeroth_wakeup when a concurrency slot was freed. Time: clock_timestamp().
CREATE FUNCTION zeroth.complete_run(
    run_id       uuid,
    worker_id    text,
    generation   bigint,
    output       jsonb DEFAULT NULL,
    tenant_id    text  DEFAULT NULL,
    workspace_id text  DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
COMMENT ON FUNCTION zeroth.complete_run(uuid, text, bigint, jsonb, text, text) IS
'complete_run: running → completed for the live lease (worker_id, generation); stores output (SQL NULL keeps the committed output, JSON null clears it), clears the lease, frees the admission slot. Returns false when fenced out. Raises ZP003 (holder but not running), ZP008. Notifies zeroth_wakeup when a slot was freed. Time: clock_timestamp().';

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
    outputs      jsonb[] DEFAULT NULL,
    tenant_id    text    DEFAULT NULL,
    workspace_id text    DEFAULT NULL)
    RETURNS TABLE (run_id uuid, completed boolean)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    SET plan_cache_mode = force_generic_plan AS $$
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
COMMENT ON FUNCTION zeroth.complete_runs(text, uuid[], bigint[], jsonb[], text, text) IS
'complete_runs: complete_run for a batch of one worker''s runs in one statement; run_ids[i] completes only while generations[i] is live, held by worker_id and running; outputs[i] as complete_run''s output. One row per requested run in input order, completed = false when refused. Locks slots then runs, each in run_id order. Raises ZP008. Notifies zeroth_wakeup (once per deployment) when slots were freed. Time: clock_timestamp().';

-- fail_run: running → pending (retryable, attempts < max_attempts: run_after = now + exponential
-- backoff with jitter) or → failed (non-retryable), or → failed and dead-lettered (retryable but
-- attempts exhausted). Fenced; clears the lease and frees the slot. Returns 'retry_scheduled',
-- 'failed' or 'dead_lettered', or NULL when fenced out. Raises ZP003, ZP008. Notifies
-- zeroth_wakeup when a slot was freed or the retry is due at once. Time: clock_timestamp().
CREATE FUNCTION zeroth.fail_run(
    run_id             uuid,
    worker_id          text,
    generation         bigint,
    error              jsonb            DEFAULT NULL,
    retryable          boolean          DEFAULT true,
    retry_base_seconds double precision DEFAULT 1,
    retry_max_seconds  double precision DEFAULT 300,
    tenant_id          text             DEFAULT NULL,
    workspace_id       text             DEFAULT NULL)
    RETURNS text
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
COMMENT ON FUNCTION zeroth.fail_run(uuid, text, bigint, jsonb, boolean, double precision, double precision, text, text) IS
'fail_run: running → pending with exponential backoff + jitter (retryable, attempts < max_attempts), → failed (not retryable), or → failed + dead_lettered_at (retries exhausted). Fenced; clears the lease, frees the slot. Returns retry_scheduled | failed | dead_lettered, or NULL when fenced out. Raises ZP003, ZP008. Notifies zeroth_wakeup when a slot was freed or the retry is due at once. Time: clock_timestamp().';

-- cancel_run: the lease holder ends its run as cancelled (after seeing a cancel request, or on its
-- own). pending or running → cancelled, fenced; clears the lease and frees the slot. Returns false
-- when fenced out. Raises ZP008. Notifies zeroth_wakeup when a slot was freed. Time: clock_timestamp().
CREATE FUNCTION zeroth.cancel_run(
    run_id       uuid,
    worker_id    text,
    generation   bigint,
    tenant_id    text DEFAULT NULL,
    workspace_id text DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
COMMENT ON FUNCTION zeroth.cancel_run(uuid, text, bigint, text, text) IS
'cancel_run: the live lease holder (worker_id, generation) ends its pending or running run as cancelled; clears the lease, frees the slot. Returns false when fenced out. Raises ZP008. Notifies zeroth_wakeup when a slot was freed. Time: clock_timestamp().';

-- pause_run: running → waiting (approval, interrupt, …), fenced. The lease is released (a waiting
-- run is claimed by nobody), the slot freed and the attempt given back (waiting is not a
-- failure); resume_run makes it pending again. Returns false
-- when fenced out. Raises ZP003 (holder but not running), ZP008. Notifies zeroth_wakeup when a slot
-- was freed. Time: clock_timestamp().
CREATE FUNCTION zeroth.pause_run(
    run_id       uuid,
    worker_id    text,
    generation   bigint,
    reason       text,
    tenant_id    text DEFAULT NULL,
    workspace_id text DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
COMMENT ON FUNCTION zeroth.pause_run(uuid, text, bigint, text, text, text) IS
'pause_run: running → waiting with a reason, for the live lease (worker_id, generation); releases the lease and slot and gives the attempt back. Returns false when fenced out. Raises ZP003 (holder but not running), ZP008. Notifies zeroth_wakeup when a slot was freed. Time: clock_timestamp().';

-- ---------------------------------------------------------------------------------------------
-- Giving a lease back (exact generation, live lease; none of these bumps the generation)
-- ---------------------------------------------------------------------------------------------

-- release_lease: give up exactly (worker_id, generation) while that lease is live, whatever the
-- status, so cleanup of generation N can never touch generation N+1 even when the same worker
-- holds it, and a lease that expired (or an admin cleared) is no longer the caller's to move.
-- A pending run becomes claimable at once (lease cleared). A running run keeps its holder and
-- gets an expired lease instead (a running run without a lease would be stranded, F-02), so
-- claim_orphaned recovers it (the recovery counts the next attempt: an interrupted attempt is
-- spent, only hand_back_to_pending gives one back). Frees the slot. Locks: slot, then run. Returns false on no match.
-- Raises ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().
CREATE FUNCTION zeroth.release_lease(
    run_id       uuid,
    worker_id    text,
    generation   bigint,
    tenant_id    text DEFAULT NULL,
    workspace_id text DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
COMMENT ON FUNCTION zeroth.release_lease(uuid, text, bigint, text, text) IS
'release_lease: give up exactly (worker_id, generation) while that lease is live, any status, never bumps the generation. Pending: lease cleared, claimable at once. Running: holder kept, lease expired in place so claim_orphaned recovers it (never a running run without a lease; the recovery counts an attempt). Frees the slot. Returns false on no match (an expired or cleared lease included). Raises ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';

-- hand_back_to_pending: running → pending for exactly the live lease (worker_id, generation)
-- (graceful shutdown, contention). The live holder stops the attempt and returns the run to the
-- queue itself, so the attempt is given back — for the first max_attempts hand-backs (hand_backs
-- counts them). After that the attempt stays counted, and a hand-back that finds every attempt
-- used dead-letters the run instead (failed, stop_reason attempts_exhausted): a handler that
-- always outlives the shutdown, or sends its own worker SIGTERM, cannot loop for ever. Still
-- returns true then (the lease was given back). An admin cancel that got there first wins: the run is no
-- longer running, so nothing matches; an expired or cleared lease matches nothing either. Clears
-- the lease and recovery id, frees the slot. Locks: slot, then run. Returns false on no match.
-- Raises ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().
CREATE FUNCTION zeroth.hand_back_to_pending(
    run_id       uuid,
    worker_id    text,
    generation   bigint,
    tenant_id    text DEFAULT NULL,
    workspace_id text DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
COMMENT ON FUNCTION zeroth.hand_back_to_pending(uuid, text, bigint, text, text) IS
'hand_back_to_pending: running → pending for exactly the live lease (worker_id, generation); gives the attempt back for the first max_attempts hand-backs (runs.hand_backs), after that keeps it counted and, when no attempt is left, dead-letters the run instead (failed, stop_reason attempts_exhausted; still returns true); clears the lease, frees the slot. An admin cancel that came first wins (no match); an expired or cleared lease matches nothing. Returns false on no match. Raises ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';

-- expire_recovery_lease: make owned running work immediately reclaimable without losing anything:
-- for exactly the live lease (worker_id, generation), lease_expires_at := now - 1 µs, holder and
-- recovery checkpoint kept, slot freed. Used when the setup of a recovered run fails (the run must
-- stay claimable, never released to a NULL lease); the next recovery counts an attempt. Locks:
-- slot, then run. Returns false on no match. Raises ZP008. Notifies zeroth_wakeup.
-- Time: clock_timestamp().
CREATE FUNCTION zeroth.expire_recovery_lease(
    run_id       uuid,
    worker_id    text,
    generation   bigint,
    tenant_id    text DEFAULT NULL,
    workspace_id text DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
COMMENT ON FUNCTION zeroth.expire_recovery_lease(uuid, text, bigint, text, text) IS
'expire_recovery_lease: for exactly the live lease (worker_id, generation) of a running run, set lease_expires_at to now - 1 µs, keeping holder and recovery checkpoint, freeing the slot: immediately reclaimable by claim_orphaned (which counts an attempt). Returns false on no match. Raises ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';

-- ---------------------------------------------------------------------------------------------
-- Admin transitions (unfenced, scoped)
-- ---------------------------------------------------------------------------------------------

-- clear_lease: admin, unfenced. Pending: the lease is cleared. Running: the holder is kept and the
-- lease expired in place, so the run stays recoverable (clearing it would strand it, F-02). Frees
-- every slot naming the run. Locks: slots, then run. Returns false when the run held no lease.
-- Raises ZP001 (unknown run), ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().
CREATE FUNCTION zeroth.clear_lease(
    run_id       uuid,
    tenant_id    text DEFAULT NULL,
    workspace_id text DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
COMMENT ON FUNCTION zeroth.clear_lease(uuid, text, text) IS
'clear_lease: admin, unfenced. Pending: lease cleared. Running: holder kept, lease expired in place so claim_orphaned recovers it (never stranded); the old holder can no longer release or hand it back. Frees the run''s slots. Returns false when there was no lease. Raises ZP001, ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';

-- request_cancel_v2: the cancel with five outcomes. cancelled (pending, waiting or queued: at
-- once; a claimed holder is fenced out) | cancel_requested (running, owner's lease + grace not run
-- out: durable flag, first action wins, NOTIFY zeroth_control to the owner's key; retry_after_s
-- says when a retry could take over) | taken_over (running past lease + grace: cancelled here, stop
-- reason recorded, the owner fenced out) | not_cancellable (terminal) | unknown. Locks: slots,
-- then run. Raises ZP008. Notifies zeroth_control, zeroth_wakeup. Time: clock_timestamp().
CREATE FUNCTION zeroth.request_cancel_v2(
    run_id        uuid,
    tenant_id     text             DEFAULT NULL,
    workspace_id  text             DEFAULT NULL,
    action        text             DEFAULT 'cancel',
    grace_seconds double precision DEFAULT 10)
    RETURNS zeroth.cancel_result
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
COMMENT ON FUNCTION zeroth.request_cancel_v2(uuid, text, text, text, double precision) IS
'request_cancel_v2: cancelled (pending/waiting/queued, at once) | cancel_requested (running, owner''s lease + grace not run out: durable flag, first action wins, NOTIFY zeroth_control with the owner''s key, retry_after_s) | taken_over (running past lease + grace: cancelled with a stop reason, owner fenced out) | not_cancellable | unknown. Raises ZP008. Notifies zeroth_control, zeroth_wakeup. Time: clock_timestamp().';

-- request_cancel: the 0002 contract, on the shared decision with no grace: a running run whose
-- lease expired is cancelled at once (reported as cancelled; the row also records the stop reason
-- taken_over). Returns cancelled | cancel_requested | not_cancellable | unknown. Locks: slots,
-- then run. Raises ZP008. Notifies zeroth_control, zeroth_wakeup. Time: clock_timestamp().
CREATE FUNCTION zeroth.request_cancel(
    run_id       uuid,
    tenant_id    text DEFAULT NULL,
    workspace_id text DEFAULT NULL,
    action       text DEFAULT 'cancel')
    RETURNS text
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
COMMENT ON FUNCTION zeroth.request_cancel(uuid, text, text, text) IS
'request_cancel: returns cancelled (pending, waiting, or running with an expired lease: terminal at once, lease cleared so the old holder''s fenced writes are refused) | cancel_requested (running with a live lease: durable flag, first action wins, NOTIFY zeroth_control to the owner''s key) | not_cancellable (terminal) | unknown (no such run in scope). request_cancel_v2 adds taken_over, a grace and retry_after_s. Raises ZP008. Notifies zeroth_wakeup when an immediate cancel freed a slot. Time: clock_timestamp().';

-- claim_for_takeover: take over one run whose owner's lease expired more than grace ago, applying
-- the run's own choice: resumable → requeued (back to pending, claimable, checkpoints kept; the
-- interrupted attempt stays counted) or, out of attempts, dead-lettered; not resumable → failed
-- with {stop_reason, message}; a cancel was requested → cancelled. Returns the row once, or
-- nothing (lease live or within grace, renewing right now, not active, unknown). Locks: slot then
-- run, SKIP LOCKED. Raises ZP008. Notifies zeroth_wakeup (and zeroth_run_finished for thread
-- runs). Time: clock_timestamp().
CREATE FUNCTION zeroth.claim_for_takeover(
    run_id        uuid,
    tenant_id     text             DEFAULT NULL,
    workspace_id  text             DEFAULT NULL,
    grace_seconds double precision DEFAULT 10,
    stop_reason   text             DEFAULT 'orphan_recovered',
    message       text             DEFAULT NULL)
    RETURNS SETOF zeroth.takeover
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
COMMENT ON FUNCTION zeroth.claim_for_takeover(uuid, text, text, double precision, text, text) IS
'claim_for_takeover: take over one run whose owner''s lease expired more than grace ago: resumable → requeued (pending, the interrupted attempt stays counted) or dead_lettered when out of attempts, not resumable → failed with {stop_reason, message}, cancel requested → cancelled. Returns the row once, or nothing (live, within grace, being renewed, not active, unknown). SKIP LOCKED. Raises ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';

-- reconcile_thread_runs: the periodic pass over active thread runs of a scope (one deployment or
-- all) whose owners' leases expired more than grace ago; each is taken over as claim_for_takeover
-- does (its resumable choice decides). Concurrent reconcilers never block each other and report
-- each run once (SKIP LOCKED). Returns the runs taken over. Raises ZP006, ZP008. Notifies
-- zeroth_wakeup. Time: clock_timestamp().
CREATE FUNCTION zeroth.reconcile_thread_runs(
    deployment_ref text             DEFAULT NULL,
    tenant_id      text             DEFAULT NULL,
    workspace_id   text             DEFAULT NULL,
    grace_seconds  double precision DEFAULT 10,
    claim_limit    integer          DEFAULT 100,
    stop_reason    text             DEFAULT 'orphan_recovered',
    message        text             DEFAULT NULL)
    RETURNS SETOF zeroth.takeover
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
$$;
COMMENT ON FUNCTION zeroth.reconcile_thread_runs(text, text, text, double precision, integer, text, text) IS
'reconcile_thread_runs: take over (as claim_for_takeover) up to claim_limit active thread runs of a scope (one deployment or all) whose owners'' leases expired more than grace ago. Concurrent reconcilers never block each other or report a run twice. Raises ZP006, ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';

-- resume_run: waiting → pending (approval given, interrupt resolved). input, when given, is stored
-- as metadata.resume_input for the next drive. A run queued behind its thread's active run is not
-- paused and cannot be resumed (ZP003): it starts when that run ends. Locks: the run row. Returns
-- true. Raises ZP001 (unknown run), ZP003 (not waiting, or queued), ZP008. Notifies zeroth_wakeup.
-- Time: clock_timestamp().
CREATE FUNCTION zeroth.resume_run(
    run_id       uuid,
    tenant_id    text  DEFAULT NULL,
    workspace_id text  DEFAULT NULL,
    input        jsonb DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
COMMENT ON FUNCTION zeroth.resume_run(uuid, text, text, jsonb) IS
'resume_run: waiting → pending; input (if given) is stored as metadata.resume_input. A run queued behind its thread''s active run cannot be resumed. Raises ZP001 (unknown run), ZP003 (not waiting, or queued), ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';

-- redrive_run: failed or cancelled → pending (dead-letter redrive, operator replay), or → waiting
-- in the thread queue when its thread has an active run now. Resets attempts, hand_backs, error, output,
-- cancel and dead-letter marks; never the lease generation, so fencing stays monotonic across
-- replays. Checkpoints are kept: the next claim hands the latest one to the handler, which
-- decides whether to resume from it. Locks: the thread's lock and active run (thread
-- runs), then the run row. Returns true. Raises ZP001 (unknown run), ZP003 (not failed/cancelled),
-- ZP008. Notifies zeroth_wakeup when the run became pending. Time: clock_timestamp().
CREATE FUNCTION zeroth.redrive_run(
    run_id       uuid,
    tenant_id    text DEFAULT NULL,
    workspace_id text DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
COMMENT ON FUNCTION zeroth.redrive_run(uuid, text, text) IS
'redrive_run: failed or cancelled → pending, or → waiting in the thread queue when its thread has an active run; resets attempts, hand_backs, error, output, cancel and dead-letter marks, never lease_generation. Raises ZP001 (unknown run), ZP003 (not failed/cancelled), ZP008. Notifies zeroth_wakeup when the run became pending. Time: clock_timestamp().';

-- prune_runs: finished (completed | failed | cancelled) → deleted, when finished_at < now - older_than.
-- One batch of at most batch_size runs per call (one short transaction); the caller loops until 0.
-- Scope: tenant_id NULL = every tenant (a DBA function); a tenant names exactly (tenant, workspace),
-- NULL workspace being the null workspace. Dead letters are failed runs and go too. Checkpoints go
-- by ON DELETE CASCADE. Locks: the doomed run rows FOR UPDATE SKIP LOCKED, so it never waits on a
-- worker or an operator and nobody waits on it for long. Raises ZP006 (workspace without tenant),
-- ZP008. Notifies nothing. Time: clock_timestamp().
CREATE FUNCTION zeroth.prune_runs(
    older_than   interval,
    batch_size   integer DEFAULT 1000,
    tenant_id    text    DEFAULT NULL,
    workspace_id text    DEFAULT NULL)
    RETURNS integer
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
COMMENT ON FUNCTION zeroth.prune_runs(interval, integer, text, text) IS
'prune_runs: finished (completed | failed | cancelled, dead letters included) → deleted when finished_at < now - older_than; one batch of at most batch_size per call, returns the number deleted (loop until 0). tenant_id NULL = every tenant; a tenant names exactly (tenant, workspace). Checkpoints go by ON DELETE CASCADE. FOR UPDATE SKIP LOCKED: never waits on workers. Raises ZP006 (workspace without tenant), ZP008. Time: clock_timestamp().';

-- ---------------------------------------------------------------------------------------------
-- Ownership and privileges (as 0006). Every function belongs to zeroth_owner and PUBLIC may run
-- none; the public functions above are SECURITY DEFINER with a pinned search_path in their own
-- definitions; internal helpers stay SECURITY INVOKER (they run inside the public ones).
-- ---------------------------------------------------------------------------------------------

DO $owner$
DECLARE
    v_routine text;
BEGIN
    FOR v_routine IN
        SELECT p.oid::pg_catalog.regprocedure::text
          FROM pg_catalog.pg_proc p
         WHERE p.pronamespace = 'zeroth'::pg_catalog.regnamespace
    LOOP
        EXECUTE pg_catalog.format('ALTER ROUTINE %s OWNER TO zeroth_owner', v_routine);
    END LOOP;
END
$owner$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA zeroth FROM PUBLIC;

-- Worker and producer functions. Not granted (admin only, run as zeroth_owner or a superuser):
-- clear_lease (unfenced), redrive_run (undoes a dead letter), prune_runs (deletes history).
GRANT EXECUTE ON FUNCTION
    zeroth.enqueue_run,
    zeroth.enqueue_runs,
    zeroth.admit_run,
    zeroth.claim_pending,
    zeroth.claim_and_start,
    zeroth.claim_orphaned,
    zeroth.claim_for_takeover,
    zeroth.reconcile_thread_runs,
    zeroth.renew_lease,
    zeroth.renew_leases,
    zeroth.current_generation,
    zeroth.current_holder,
    zeroth.get_recovery_checkpoint_id,
    zeroth.count_pending,
    zeroth.list_thread_runs,
    zeroth.get_thread_run,
    zeroth.wakeup_key,
    zeroth.control_key,
    zeroth.run_finished_key,
    zeroth.commit_fenced,
    zeroth.update_run_progress,
    zeroth.start_run,
    zeroth.save_checkpoint,
    zeroth.complete_run,
    zeroth.complete_runs,
    zeroth.fail_run,
    zeroth.cancel_run,
    zeroth.pause_run,
    zeroth.release_lease,
    zeroth.hand_back_to_pending,
    zeroth.expire_recovery_lease,
    zeroth.request_cancel,
    zeroth.request_cancel_v2,
    zeroth.resume_run
    TO zeroth_worker;
