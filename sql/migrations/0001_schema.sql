-- 0001_schema: schema zeroth, the run_status enum, runs, checkpoints, admission slots.
--
-- Conventions (see sql/README.md): database time only; scope is (tenant_id, workspace_key) where
-- workspace_key is '' for the null workspace and 'w:' || workspace_id otherwise, so NULL is a real
-- workspace that an index can find with plain equality.
--
-- The functions, views and trigger this migration created when it was released live in
-- sql/functions/ now (one file each, re-applied by every upgrade: sql/README.md); this file
-- keeps what has state: types, tables, indexes, roles, policies and data changes.

CREATE SCHEMA IF NOT EXISTS zeroth;
COMMENT ON SCHEMA zeroth IS 'zeroth_pg: a Postgres-native durable run dispatcher. The public API is the functions in this schema.';

CREATE TYPE zeroth.run_status AS ENUM (
    'pending',    -- claimable once run_after has passed and no live lease holds it
    'running',    -- started by its lease holder; always carries a lease (CHECK runs_running_has_lease)
    'waiting',    -- paused for outside input (approval, interrupt); resume_run makes it pending
    'completed',
    'failed',
    'cancelled'
);
COMMENT ON TYPE zeroth.run_status IS 'Status axis of a run. The lease axis (lease_* columns) is orthogonal: see docs/state-machine.md.';

CREATE TABLE zeroth.runs (
    run_id                 uuid              NOT NULL,
    tenant_id              text              NOT NULL,
    workspace_id           text,
    workspace_key          text              NOT NULL
        GENERATED ALWAYS AS (CASE WHEN workspace_id IS NULL THEN '' ELSE 'w:' || workspace_id END) STORED,
    deployment_ref         text              NOT NULL,
    thread_id              text,
    status                 zeroth.run_status NOT NULL DEFAULT 'pending',
    wait_reason            text,
    priority               integer           NOT NULL DEFAULT 0,
    run_after              timestamptz       NOT NULL,
    attempts               integer           NOT NULL DEFAULT 0,
    max_attempts           integer           NOT NULL DEFAULT 3,
    created_at             timestamptz       NOT NULL,
    updated_at             timestamptz       NOT NULL,
    started_at             timestamptz,
    finished_at            timestamptz,
    payload                jsonb             NOT NULL DEFAULT '{}'::jsonb,
    output                 jsonb,
    error                  jsonb,
    metadata               jsonb             NOT NULL DEFAULT '{}'::jsonb,
    progress               jsonb,
    idempotency_key        text,
    checkpoint_seq         bigint            NOT NULL DEFAULT 0,
    lease_worker_id        text,
    lease_acquired_at      timestamptz,
    lease_expires_at       timestamptz,
    lease_generation       bigint            NOT NULL DEFAULT 0,
    admission_slot         integer,
    recovery_checkpoint_id uuid,
    cancel_action          text,
    cancel_requested_at    timestamptz,
    dead_lettered_at       timestamptz,
    CONSTRAINT runs_pkey PRIMARY KEY (tenant_id, workspace_key, run_id),
    -- F-02: a running run without a lease matches no claim path and would be stranded forever.
    CONSTRAINT runs_running_has_lease CHECK (status <> 'running' OR lease_worker_id IS NOT NULL),
    CONSTRAINT runs_lease_only_on_active CHECK (lease_worker_id IS NULL OR status IN ('pending', 'running')),
    CONSTRAINT runs_lease_complete CHECK ((lease_worker_id IS NULL) = (lease_expires_at IS NULL)
                                         AND (lease_worker_id IS NULL) = (lease_acquired_at IS NULL)),
    CONSTRAINT runs_slot_needs_lease CHECK (admission_slot IS NULL OR lease_worker_id IS NOT NULL),
    CONSTRAINT runs_generation_nonnegative CHECK (lease_generation >= 0),
    CONSTRAINT runs_attempts_valid CHECK (attempts >= 0 AND max_attempts >= 1),
    CONSTRAINT runs_deployment_nonempty CHECK (deployment_ref <> ''),
    CONSTRAINT runs_tenant_nonempty CHECK (tenant_id <> ''),
    CONSTRAINT runs_payload_object CHECK (jsonb_typeof(payload) = 'object'),
    CONSTRAINT runs_metadata_object CHECK (jsonb_typeof(metadata) = 'object'),
    CONSTRAINT runs_wait_reason_only_waiting CHECK (wait_reason IS NULL OR status = 'waiting'),
    CONSTRAINT runs_cancel_action_valid CHECK (cancel_action IS NULL OR cancel_action IN ('cancel', 'interrupt', 'rollback'))
) WITH (fillfactor = 80);
-- fillfactor 80 leaves room on each page so lease renewals (which touch no indexed column) stay HOT.
COMMENT ON TABLE zeroth.runs IS 'One row per run. Write it only through the zeroth.* functions; every lease-holder write is fenced by (lease_worker_id, lease_generation, lease_expires_at).';
COMMENT ON COLUMN zeroth.runs.lease_generation IS 'Fencing token: bumped by every change of owner (claim_pending, claim_orphaned); never decreases, never reset.';
COMMENT ON COLUMN zeroth.runs.admission_slot IS 'The admission_slots.slot_no this lease holds when it was claimed under max_concurrency; NULL otherwise.';
COMMENT ON COLUMN zeroth.runs.checkpoint_seq IS 'Number of checkpoints saved; the next checkpoint_order.';
COMMENT ON COLUMN zeroth.runs.attempts IS 'Number of started attempts (start_run from pending); a hand-back gives the attempt back.';

-- Claim index: scope-leading, only pending rows, no lease column, so it stays small and renewals stay HOT.
-- The predicate uses the enum value, which is what is stored (upstream's lowercase-string index never matched).
CREATE INDEX runs_claim_pending_idx ON zeroth.runs
    (tenant_id, workspace_key, deployment_ref, priority DESC, run_after, created_at)
    WHERE status = 'pending';

-- Orphan index: running rows by scope; the expiry filter is applied to the few running rows of a scope.
CREATE INDEX runs_running_idx ON zeroth.runs (tenant_id, workspace_key, deployment_ref)
    WHERE status = 'running';

CREATE UNIQUE INDEX runs_idempotency_key_idx ON zeroth.runs
    (tenant_id, workspace_key, deployment_ref, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

CREATE INDEX runs_dead_letter_idx ON zeroth.runs (tenant_id, workspace_key, deployment_ref, dead_lettered_at)
    WHERE dead_lettered_at IS NOT NULL;

CREATE TABLE zeroth.checkpoints (
    checkpoint_id    uuid        NOT NULL,
    tenant_id        text        NOT NULL,
    workspace_key    text        NOT NULL,
    run_id           uuid        NOT NULL,
    checkpoint_order bigint      NOT NULL,
    lease_generation bigint      NOT NULL,
    data             jsonb       NOT NULL,
    created_at       timestamptz NOT NULL,
    CONSTRAINT checkpoints_pkey PRIMARY KEY (checkpoint_id),
    CONSTRAINT checkpoints_run_fkey FOREIGN KEY (tenant_id, workspace_key, run_id)
        REFERENCES zeroth.runs (tenant_id, workspace_key, run_id) ON DELETE CASCADE
);
COMMENT ON TABLE zeroth.checkpoints IS 'Ordered checkpoints per run, written fenced by save_checkpoint; claim_orphaned hands the latest to the next owner.';
CREATE INDEX checkpoints_run_order_idx ON zeroth.checkpoints (tenant_id, workspace_key, run_id, checkpoint_order DESC);

-- Concurrency admission. Instead of one admission row per deployment that every claimer locks
-- (upstream's design, which serialises all claims), a scope with max_concurrency = K has K
-- numbered slot rows. A claimer takes free slots with FOR UPDATE SKIP LOCKED, so claimers never
-- wait on each other. A slot row mirrors its holder's lease (run, worker, generation, expiry) and
-- is written in the same transaction as the run's lease, slot row first, so that a renewal racing
-- a claimer for an expired slot is decided by that one row lock.
CREATE TABLE zeroth.admission_slots (
    tenant_id        text        NOT NULL,
    workspace_key    text        NOT NULL,
    deployment_ref   text        NOT NULL,
    slot_no          integer     NOT NULL,
    run_id           uuid,
    lease_worker_id  text,
    lease_generation bigint,
    lease_expires_at timestamptz,
    CONSTRAINT admission_slots_pkey PRIMARY KEY (tenant_id, workspace_key, deployment_ref, slot_no),
    CONSTRAINT admission_slots_slot_positive CHECK (slot_no >= 1),
    CONSTRAINT admission_slots_holder_complete CHECK (
        (run_id IS NULL) = (lease_worker_id IS NULL)
        AND (run_id IS NULL) = (lease_generation IS NULL)
        AND (run_id IS NULL) = (lease_expires_at IS NULL))
) WITH (fillfactor = 50);
COMMENT ON TABLE zeroth.admission_slots IS 'Concurrency slots per (tenant, workspace, deployment). A slot is free when run_id is NULL or its lease expired.';
CREATE INDEX admission_slots_run_idx ON zeroth.admission_slots (run_id) WHERE run_id IS NOT NULL;
