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
