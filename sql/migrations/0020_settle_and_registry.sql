-- 0020_settle_and_registry: state changes for the work of the session of 2026-12-05 (evening):
-- one settle path and the state machine as data (issue 33), the registry's retry policy and
-- default lease and the operator's day (issue 31), the per-run cost of the hot path (issue 30).
--
-- Each section below names the issue it answers; the functions that use this state are in
-- sql/functions/ and are re-applied after this file in the same upgrade.
SELECT 1;

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
