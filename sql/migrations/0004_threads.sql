-- 0004_threads: one active run per thread, admission strategies, cancel outcomes with takeover,
-- progress and accounting (deer-flow parity, docs/threads.md).
--
-- The active run of a thread is its run in status pending, running or waiting that is not queued
-- (thread_queued_at IS NULL). waiting counts: a paused run still owns the thread's state and will
-- resume from its checkpoint, so letting another run in would make resume_run either fail or
-- interleave two runs on one thread. The partial unique index runs_thread_active_idx keeps at most
-- one active run per (tenant, workspace, thread) across every process.
--
-- A queued run (strategy enqueue, or an interrupt waiting for a live owner to stop) is status
-- waiting with thread_queued_at set. claim_pending never sees it (its index holds pending rows
-- only), so the claim stays O(claimed rows). When the active run ends by any path (complete_run,
-- fail_run, cancel_run, request_cancel, takeover), trigger runs_thread_run_finished promotes the
-- oldest queued run to pending in the same transaction and notifies zeroth_wakeup and
-- zeroth_run_finished.
--
-- Lock order, extending 0002's: the thread's advisory lock (admissions and redrive only), then
-- admission_slots, then the active run, then queued runs. Finishing functions never take the
-- advisory lock (slot, run, then the queued head in the trigger), so no cycle can form.
-- Call these functions at READ COMMITTED (the default): a REPEATABLE READ snapshot cannot see a
-- run queued after it began (admissions then fail with 40001 rather than strand anything, and an
-- admission promotes a queued run whose thread has no active run).
--
-- The functions, views and trigger this migration created when it was released live in
-- sql/functions/ now (one file each, re-applied by every upgrade: sql/README.md); this file
-- keeps what has state: types, tables, indexes, roles, policies and data changes.

-- ---------------------------------------------------------------------------------------------
-- Columns, de-duplication of existing active thread runs, indexes
-- ---------------------------------------------------------------------------------------------

ALTER TABLE zeroth.runs
    ADD COLUMN thread_queued_at timestamptz,
    ADD COLUMN resumable boolean NOT NULL DEFAULT true,
    ADD COLUMN accounting jsonb,
    ADD CONSTRAINT runs_thread_queue_waits CHECK (thread_queued_at IS NULL OR (status = 'waiting' AND thread_id IS NOT NULL)),
    ADD CONSTRAINT runs_accounting_object CHECK (accounting IS NULL OR jsonb_typeof(accounting) = 'object');
COMMENT ON COLUMN zeroth.runs.thread_queued_at IS 'Set while the run waits behind the active run of its thread (status waiting); the queue is ordered by it. Cleared when the run is promoted to pending or cancelled.';
COMMENT ON COLUMN zeroth.runs.resumable IS 'When its owner dies: true = another worker re-executes it (claim_orphaned, claim_for_takeover hands it back); false = claim_for_takeover / reconcile_thread_runs end it as failed with a stop reason (deer-flow). admit_run defaults to false for admit-and-own runs.';
COMMENT ON COLUMN zeroth.runs.accounting IS 'Caller-defined JSON object (token and message counts, …) merged by update_run_progress.';

-- Before 0004 a thread_id was only a label, so a database may hold several active runs of one
-- thread. Keep one per thread (running first, then waiting, then pending; oldest first). Other
-- pending runs join the thread's queue in creation order: they never ran, nothing is lost. Other
-- running or waiting runs end as failed with stop_reason thread_dedupe (their owners' later
-- writes are fenced out, as with a takeover).
WITH ranked AS (
    SELECT r.tenant_id, r.workspace_key, r.run_id, r.status,
           row_number() OVER (PARTITION BY r.tenant_id, r.workspace_key, r.thread_id
                              ORDER BY r.status = 'running' DESC, r.status = 'waiting' DESC,
                                       r.created_at, r.run_id) AS n
      FROM zeroth.runs r
     WHERE r.thread_id IS NOT NULL AND r.status IN ('pending', 'running', 'waiting')
), extra AS (
    SELECT k.tenant_id, k.workspace_key, k.run_id, k.status FROM ranked k WHERE k.n > 1
), freed AS (
    UPDATE zeroth.admission_slots s
       SET run_id = NULL, lease_worker_id = NULL, lease_generation = NULL, lease_expires_at = NULL
      FROM extra x
     WHERE s.run_id = x.run_id AND s.tenant_id = x.tenant_id AND s.workspace_key = x.workspace_key
    RETURNING s.slot_no
)
UPDATE zeroth.runs r
   SET status = CASE WHEN x.status = 'pending' THEN 'waiting'::zeroth.run_status ELSE 'failed'::zeroth.run_status END,
       thread_queued_at = CASE WHEN x.status = 'pending' THEN r.created_at END,
       wait_reason = CASE WHEN x.status = 'pending' THEN 'thread_queue' END,
       finished_at = CASE WHEN x.status = 'pending' THEN NULL ELSE clock_timestamp() END,
       error = CASE WHEN x.status = 'pending' THEN r.error
                    ELSE jsonb_build_object('stop_reason', 'thread_dedupe', 'message',
                        'another run of this thread was kept when one active run per thread became enforced (migration 0004)',
                        'previous_error', r.error) END,
       updated_at = clock_timestamp(),
       lease_worker_id = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
       admission_slot = NULL, recovery_checkpoint_id = NULL
  FROM extra x
 WHERE r.tenant_id = x.tenant_id AND r.workspace_key = x.workspace_key AND r.run_id = x.run_id;

CREATE UNIQUE INDEX runs_thread_active_idx ON zeroth.runs (tenant_id, workspace_key, thread_id)
    WHERE thread_id IS NOT NULL AND status IN ('pending', 'running', 'waiting') AND thread_queued_at IS NULL;
COMMENT ON INDEX zeroth.runs_thread_active_idx IS 'At most one active (pending, running or waiting, not queued) run per thread, across all processes.';

CREATE INDEX runs_thread_queue_idx ON zeroth.runs (tenant_id, workspace_key, thread_id, thread_queued_at, run_id)
    WHERE thread_queued_at IS NOT NULL;

CREATE INDEX runs_thread_idx ON zeroth.runs (tenant_id, workspace_key, thread_id, created_at DESC, run_id DESC)
    WHERE thread_id IS NOT NULL;

-- ---------------------------------------------------------------------------------------------
-- Result types
-- ---------------------------------------------------------------------------------------------

CREATE TYPE zeroth.admission AS (
    outcome          text,
    run_id           uuid,
    status           zeroth.run_status,
    lease_generation bigint,
    lease_expires_at timestamptz,
    active_run_id    uuid,
    retry_after_s    integer,
    displaced        jsonb
);
COMMENT ON TYPE zeroth.admission IS 'Result of admit_run. outcome: admitted | queued | busy | reused. lease_* are set when the caller holds the run (admit-and-own); active_run_id and retry_after_s name the run the thread waits for (busy, queued); displaced lists the runs an interrupt/rollback cancelled or asked to stop: [{run_id, outcome, worker_id, lease_generation}].';

CREATE TYPE zeroth.cancel_result AS (
    outcome          text,
    run_id           uuid,
    status           zeroth.run_status,
    cancel_action    text,
    lease_worker_id  text,
    lease_generation bigint,
    retry_after_s    integer
);
COMMENT ON TYPE zeroth.cancel_result IS 'Result of request_cancel_v2. outcome: cancelled | cancel_requested | taken_over | not_cancellable | unknown; status after the call; the winning cancel_action; the owner asked to stop or displaced; retry_after_s = seconds until the owner''s lease + grace runs out (a cancel retried then takes over).';

CREATE TYPE zeroth.takeover AS (
    run_id              uuid,
    thread_id           text,
    outcome             text,
    status              zeroth.run_status,
    previous_worker_id  text,
    previous_generation bigint
);
COMMENT ON TYPE zeroth.takeover IS 'A run claimed by claim_for_takeover / reconcile_thread_runs. outcome: failed (not resumable) | cancelled (a cancel was requested) | requeued (resumable: back to pending for another worker).';

CREATE TYPE zeroth.thread_run AS (
    run_id              uuid,
    thread_id           text,
    deployment_ref      text,
    status              zeroth.run_status,
    queued              boolean,
    wait_reason         text,
    attempts            integer,
    max_attempts        integer,
    resumable           boolean,
    created_at          timestamptz,
    started_at          timestamptz,
    finished_at         timestamptz,
    updated_at          timestamptz,
    lease_worker_id     text,
    lease_generation    bigint,
    lease_expires_at    timestamptz,
    cancel_action       text,
    cancel_requested_at timestamptz,
    idempotency_key     text,
    payload             jsonb,
    metadata            jsonb,
    output              jsonb,
    error               jsonb,
    progress            jsonb,
    accounting          jsonb
);
COMMENT ON TYPE zeroth.thread_run IS 'A run as list_thread_runs / get_thread_run report it; queued = waiting behind the active run of its thread.';
