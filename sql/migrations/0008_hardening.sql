-- 0008_hardening: close the holes an outside review found (issue 11). Every function is
-- re-created (sql/functions/); the old definitions of 0002-0007 are dropped first, so no dead body
-- or overload of them stays behind.
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
--
-- The functions, views and trigger this migration created when it was released live in
-- sql/functions/ now (one file each, re-applied by every upgrade: sql/README.md); this file
-- keeps what has state: types, tables, indexes, roles, policies and data changes.

-- ---------------------------------------------------------------------------------------------
-- Drop every function of 0002-0007 (the trigger function stays: the trigger needs it; the
-- function files replace it). CASCADE only reaches functions: nothing else in the schema calls
-- them.
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
