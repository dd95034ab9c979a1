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
--
-- The functions, views and trigger this migration created when it was released live in
-- sql/functions/ now (one file each, re-applied by every upgrade: sql/README.md); this file
-- keeps what has state: types, tables, indexes, roles, policies and data changes.

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
