-- 0020_settle_and_registry: state changes for the work of the session of 2026-12-05 (evening):
-- one settle path and the state machine as data (issue 33), the registry's retry policy and
-- default lease and the operator's day (issue 31), the per-run cost of the hot path (issue 30).
--
-- Each section below names the issue it answers; the functions that use this state are in
-- sql/functions/ and are re-applied after this file in the same upgrade.
SELECT 1;

-- Issue 31, Build, last bullet ("Deployment defaults in SQL": attempts, retry/backoff policy,
-- priority, default lease, concurrency): the registry (migration 0019) held max_attempts and
-- priority; it now holds a deployment's retry policy and default lease too. Each is nullable:
-- NULL is "not set", and the functions fall back to their own defaults (1 s / 300 s, 60 s).
--   * retry_base_seconds, retry_max_seconds: what zeroth.fail_run uses for a retry when its caller
--     passes NULL (the Python worker does unless its user configured a policy). Read at the
--     failure, not stored on the run (no column on zeroth.runs, the hot table): a change of policy
--     applies to the next failure of every run of the deployment.
--   * lease_seconds: the lease the claim functions give a run of the deployment when the caller
--     passes NULL. Read at each claim (one primary-key lookup per deployment claimed).
-- Bounded as the functions bound them: 0 <= base <= max <= 30 days (a NULL side counts as 1 / 300
-- against the other); 0 < lease <= 86400. Concurrency stays in zeroth.scope_limits (per scope);
-- deployment_changes records the new values in its old_values / new_values documents (jsonb),
-- so it needs no column.
ALTER TABLE zeroth.deployments
    ADD COLUMN retry_base_seconds double precision,
    ADD COLUMN retry_max_seconds  double precision,
    ADD COLUMN lease_seconds      double precision,
    ADD CONSTRAINT deployments_retry_valid CHECK (
        (retry_base_seconds IS NULL OR retry_base_seconds >= 0)
        AND (retry_max_seconds IS NULL OR retry_max_seconds <= 86400 * 30)
        AND coalesce(retry_base_seconds, 1) <= coalesce(retry_max_seconds, 300)
        AND coalesce(retry_base_seconds, 1) <= 86400 * 30),
    ADD CONSTRAINT deployments_lease_valid CHECK (
        lease_seconds IS NULL OR (lease_seconds > 0 AND lease_seconds <= 86400));
COMMENT ON COLUMN zeroth.deployments.retry_base_seconds IS 'Backoff base of a retry (zeroth.fail_run with retry_base_seconds NULL): about base * 2^(attempt - 1) with jitter. NULL: not set (1). Read at each failure: a change applies to the next failure.';
COMMENT ON COLUMN zeroth.deployments.retry_max_seconds IS 'Backoff cap of a retry (zeroth.fail_run with retry_max_seconds NULL). NULL: not set (300). Read at each failure: a change applies to the next failure.';
COMMENT ON COLUMN zeroth.deployments.lease_seconds IS 'Lease of a claim that names none (claim_pending, claim_and_start, complete_and_claim, claim_and_start_scopes, claim_orphaned, claim_orphaned_scopes, admit_run with lease_seconds NULL), 0 < s <= 86400. NULL: not set (60). Read at each claim.';
COMMENT ON COLUMN zeroth.deployment_changes.old_values IS 'The defaults before the change (max_attempts, priority, managed_by, retry_base_seconds, retry_max_seconds, lease_seconds: since migration 0020, each only when set); NULL when the change created the row.';
COMMENT ON COLUMN zeroth.deployment_changes.new_values IS 'The defaults after the change (max_attempts, priority, managed_by, retry_base_seconds, retry_max_seconds, lease_seconds: since migration 0020, each only when set).';
ALTER TYPE zeroth.deployment_registration
    ADD ATTRIBUTE retry_base_seconds double precision,
    ADD ATTRIBUTE retry_max_seconds  double precision,
    ADD ATTRIBUTE lease_seconds      double precision;
COMMENT ON TYPE zeroth.deployment_registration IS 'The result of register_deployment / set_deployment_defaults: outcome (created, updated, unchanged, kept) and the deployment''s defaults as they now are (retry_base_seconds, retry_max_seconds, lease_seconds NULL: not set); previous: the values an update replaced, else NULL.';

-- Issue 31, the operator's day, item "fire now twice": zeroth.fire_schedule_now takes an optional
-- idempotency_key (a double click or a retried POST returns the first call's run). The function
-- file creates the four-argument signature; the three-argument one would stay beside it and make
-- every call that names three arguments ambiguous, so it goes here (IF EXISTS: a fresh install
-- creates the functions after the migrations).
DROP FUNCTION IF EXISTS zeroth.fire_schedule_now(text, text, text);

-- Issue 31, the operator's day, item "the registry's audit is never pruned":
-- zeroth.deployment_changes grew by a row per change for ever. zeroth.prune_runs, called for every
-- tenant, now deletes the changes older than its cutoff, oldest first, keeping each deployment's
-- latest change (the version numbering continues after the highest audited one). This index is
-- the oldest-first walk: the changes a prune keeps (each deployment's latest) are the only old
-- rows it passes again.
CREATE INDEX deployment_changes_age_idx ON zeroth.deployment_changes (changed_at);
COMMENT ON TABLE zeroth.deployment_changes IS 'The audit log of zeroth.deployments: one row per change (a creation has old_values NULL), with the deployment''s new version, the database time, who (changed_by: session_user; acting_role: the SET ROLE in force, NULL without one) and the function that made it. Registrations that change nothing write no row. zeroth.prune_runs (called for every tenant) deletes the changes older than its cutoff, keeping each deployment''s latest change; nothing else deletes rows but a DBA. zeroth_reader reads every row.';

-- Issue 33 item 1 (one settle path): the attempt history of an end made by zeroth._settle is
-- written by the settling statement itself; runs_attempt_history (sql/functions/triggers.sql)
-- skips an update that marks the generation it ends as recorded. A column of the row, not a
-- session setting or the current role: only the statement that wrote the history row sets it
-- (to the generation it ended, which claims then bump past), so an end made by hand — a DBA's
-- UPDATE, as any role — still goes through the trigger.
ALTER TABLE zeroth.runs ADD COLUMN attempt_recorded_generation bigint;
COMMENT ON COLUMN zeroth.runs.attempt_recorded_generation IS 'The lease generation whose ended attempt zeroth._settle recorded in zeroth.run_attempts itself (the trigger runs_attempt_history skips that end); NULL or an older generation otherwise.';

-- Issue 33 item 2 (the state machine as data): every legal edge of a run's status, one row per
-- (from status, outcome kind); NULL is a run not yet created (from) or deleted (to). The settle
-- path (zeroth._settle) looks its outcome up here: an outcome whose edge is not listed changes
-- nothing (ZP012). docs/state-machine.md's status diagram is generated from it
-- (python -m zeroth_pg.docs), in edge_no order.
CREATE TABLE zeroth.run_transitions (
    edge_no     integer           NOT NULL PRIMARY KEY,
    from_status zeroth.run_status,
    outcome     text              NOT NULL CHECK (outcome ~ '^[a-z_]+$'),
    to_status   zeroth.run_status,
    label       text              NOT NULL,
    CONSTRAINT run_transitions_edge_key UNIQUE NULLS NOT DISTINCT (from_status, outcome)
);
ALTER TABLE zeroth.run_transitions OWNER TO zeroth_owner;
ALTER TABLE zeroth.run_transitions ENABLE ROW LEVEL SECURITY;
-- Read by the functions (as its owner) only; the diagram in docs/state-machine.md shows it.
REVOKE ALL ON zeroth.run_transitions FROM PUBLIC;
COMMENT ON TABLE zeroth.run_transitions IS 'The run state machine as data: one row per legal edge (from_status, outcome kind, to_status; NULL = not yet created / deleted) with its diagram label. zeroth._settle settles only listed edges (an unlisted one changes nothing: ZP012); docs/state-machine.md''s diagram is generated from it.';
INSERT INTO zeroth.run_transitions (edge_no, from_status, outcome, to_status, label) VALUES
    (1, NULL, 'enqueued', 'pending', 'enqueue_run / enqueue_runs / admit_run / fire_due_schedules (a fire time, through enqueue_run)'),
    (2, 'pending', 'started', 'running', 'start_run (fenced, counts an attempt) / claim_and_start (lease + start in one UPDATE)'),
    (3, 'pending', 'claim_lapsed', 'failed', 'a claim or claim_for_takeover finds a claim that lapsed before start_run with no attempt left (dead-lettered, attempts_exhausted)'),
    (4, 'pending', 'released', 'pending', 'release_lease of a claim not started (settled: lease cleared, claimable at once)'),
    (5, 'running', 'restarted', 'running', 'start_run again (recovered run, fenced, idempotent)'),
    (6, 'running', 'completed', 'completed', 'complete_run / complete_runs / complete_and_claim / settle_runs (settled, fenced, per run)'),
    (7, 'running', 'retried', 'pending', 'fail_run / settle_runs retryable, attempts < max_attempts (settled, run_after = backoff)'),
    (8, 'running', 'failed', 'failed', 'fail_run / settle_runs not retryable (settled)'),
    (9, 'running', 'dead_lettered', 'failed', 'fail_run / settle_runs retryable with retries exhausted, or hand_back_to_pending with no attempt left after the free ones (settled, dead_lettered_at)'),
    (10, 'running', 'handed_back', 'pending', 'hand_back_to_pending / settle_runs (settled, exact live lease; gives the attempt back the first max_attempts times)'),
    (11, 'running', 'expired', 'running', 'release_lease / expire_recovery_lease (settled: lease expired in place, holder kept; claim_orphaned recovers it)'),
    (12, 'running', 'paused', 'waiting', 'pause_run (settled, gives the attempt back)'),
    (13, 'running', 'waited', 'waiting', 'wait_for_event, event not emitted yet / wait_for_children, children not ended yet (settled, gives the attempt back)'),
    (14, 'running', 'slept', 'pending', 'sleep_run (settled, run_after = T, gives the attempt back, checkpoint in the same call)'),
    (15, 'running', 'cancelled', 'cancelled', 'cancel_run / settle_runs (holder) / sleep_run, wait_for_event, wait_for_children with a cancel request pending (settled)'),
    (16, 'pending', 'cancelled', 'cancelled', 'cancel_run / settle_runs (holder of a claim not started; settled)'),
    (17, 'waiting', 'event_emitted', 'pending', 'emit_event (first emit of the awaited name in the run''s scope)'),
    (18, 'waiting', 'wait_due', 'pending', 'wake_due_waits (the wait''s deadline passed; the worker''s orphan sweep)'),
    (19, NULL, 'child_started', 'pending', 'start_child_run (the parent''s live holder, fenced; parent_run_id set)'),
    (20, 'waiting', 'children_ended', 'pending', 'a child''s end met the wait (trigger runs_child_run_finished) / wake_due_waits (a skipped wake-up)'),
    (21, 'pending', 'parent_cancelled', 'cancelled', 'the parent was cancelled (trigger runs_cancel_children; not detached children)'),
    (22, 'waiting', 'parent_cancelled', 'cancelled', 'the parent was cancelled (trigger runs_cancel_children)'),
    (23, 'waiting', 'resumed', 'pending', 'resume_run'),
    (24, 'pending', 'cancel_requested', 'cancelled', 'request_cancel'),
    (25, 'waiting', 'cancel_requested', 'cancelled', 'request_cancel'),
    (26, 'running', 'cancel_requested', 'cancelled', 'request_cancel when the lease expired'),
    (27, 'running', 'recovered', 'running', 'claim_orphaned (lease expired: new owner, counts an attempt)'),
    (28, 'running', 'recovery_exhausted', 'failed', 'claim_orphaned, resumable but out of attempts (dead-lettered, attempts_exhausted)'),
    (29, 'running', 'orphan_recovered', 'failed', 'claim_orphaned, not resumable, lease + grace ran out (orphan_recovered)'),
    (30, 'running', 'takeover_requeued', 'pending', 'claim_for_takeover, resumable run (requeued, lease + grace ran out)'),
    (31, 'running', 'takeover_failed', 'failed', 'claim_for_takeover, run not resumable (stop reason in error)'),
    (32, 'running', 'takeover_cancelled', 'cancelled', 'claim_for_takeover after a cancel request / request_cancel_v2 taken_over'),
    (33, 'failed', 'redriven', 'pending', 'redrive_run'),
    (34, 'cancelled', 'redriven', 'pending', 'redrive_run'),
    (35, 'completed', 'pruned', NULL, 'prune_runs (finished_at older than the cut-off)'),
    (36, 'failed', 'pruned', NULL, 'prune_runs'),
    (37, 'cancelled', 'pruned', NULL, 'prune_runs');

-- Issue 31, Build, last bullet ("Deployment defaults in SQL"), the default lease (review of the
-- registry): deployments_lease_valid above took any lease over 0, so 1e-9 s passed, and a claim's
-- interval of it rounds to no time at all: every claim of the deployment that names no lease, by
-- every worker, lapsed before its run could start, each lapsed claim counting an attempt until
-- the run was dead-lettered. A registered lease is at least a second, as the functions that write
-- it now check (zeroth._check_deployment_policy: ZP008); this is the same bound for a DBA's
-- manual UPDATE. A row already under a second fails this ALTER: set it with
-- zeroth.set_deployment_defaults (or unset it) first.
ALTER TABLE zeroth.deployments
    DROP CONSTRAINT deployments_lease_valid,
    ADD CONSTRAINT deployments_lease_valid CHECK (
        lease_seconds IS NULL OR (lease_seconds >= 1 AND lease_seconds <= 86400));
COMMENT ON COLUMN zeroth.deployments.lease_seconds IS 'Lease of a claim that names none (claim_pending, claim_and_start, complete_and_claim, claim_and_start_scopes, claim_orphaned, claim_orphaned_scopes, admit_run with lease_seconds NULL), 1 <= s <= 86400 (a shorter one would lapse before its run could start). NULL: not set (60). Read at each claim.';

-- Issue 33 item 1 (one settle path), review: the attempt history's description named the old
-- writers (complete_run, zeroth._complete_locked_runs); every lease end of a worker now goes
-- through zeroth._settle.
COMMENT ON TABLE zeroth.run_attempts IS 'Attempt history, ended attempts: one row per lease generation of a run (a claim) once it ended, with its holder, attempt number, when it was claimed, started and ended, and how it ended (outcome; error when it failed). Written when the attempt ends (the open attempt is the runs row): by the settle path (zeroth._settle: every lease-ending function of a worker) in the settling statement, and by the trigger runs_attempt_history on zeroth.runs for every other end (admin functions, claims that end an old holder''s attempt, a DBA''s UPDATE by hand); deleted with the run by prune_runs. zeroth_reader reads it through zeroth.attempt_history, the rows of the tenant named in zeroth.tenant_id.';
