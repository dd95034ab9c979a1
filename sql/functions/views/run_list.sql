-- sql/functions/views/run_list.sql: the operator view zeroth.run_list. Re-applied by every
-- upgrade (sql/README.md).
-- One row per run with the columns an operator reads (the dashboard's runs page and run page,
-- issue 17): everything but the internal bookkeeping (resumable, hand_backs, the admission
-- and notification fields). No index on zeroth.runs without a predicate serves it (issue 30:
-- every claim and completion would write into one), so a page ordered by (created_at DESC,
-- run_id DESC) is two queries of it merged, each with the page's LIMIT: the runs that are not
-- running (`status <> 'running'`: a backward walk of runs_created_not_running_idx) and the
-- running ones (runs_running_idx, as many as there are live leases, sorted); a run by run_id
-- alone is one probe of runs_pkey, which leads with run_id (run_id, tenant_id, workspace_key:
-- migration 0023; zeroth_pg._calls.run_by_id, zeroth_pg.web.app.run_page_query). workspace_key
-- is kept so that a caller can use the scope indexes (runs_pkey with the run; runs_thread_idx:
-- tenant_id, workspace_key, thread_id, created_at).
-- security_invoker: the view reads as its caller, so zeroth_reader's row-level security
-- policy on zeroth.runs filters it to one tenant.
CREATE OR REPLACE VIEW zeroth.run_list WITH (security_invoker = true) AS
SELECT r.run_id,
       r.tenant_id,
       r.workspace_id,
       r.workspace_key,
       r.deployment_ref,
       r.thread_id,
       r.thread_queued_at,
       r.status,
       r.wait_reason,
       r.priority,
       r.run_after,
       r.attempts,
       r.max_attempts,
       r.created_at,
       r.updated_at,
       r.started_at,
       r.finished_at,
       r.dead_lettered_at,
       r.idempotency_key,
       r.lease_worker_id,
       r.lease_generation,
       r.lease_acquired_at,
       r.lease_expires_at,
       r.recovery_checkpoint_id,
       r.cancel_action,
       r.cancel_requested_at,
       r.checkpoint_seq,
       r.payload,
       r.output,
       r.error,
       r.metadata,
       r.progress,
       r.parent_run_id,
       r.code_version_id  -- code versions (issue 34; zeroth.code_versions): appended last
  FROM zeroth.runs r;
COMMENT ON VIEW zeroth.run_list IS 'Every run with the columns an operator reads (scope, status, timing, lease, cancel, payload, output, error, metadata, progress, the parent run of a child run, the code version that started it). Keyset pages on (created_at, run_id): the runs that are not running walk runs_created_not_running_idx, the running ones come from runs_running_idx; a run by run_id: runs_pkey (run_id, tenant_id, workspace_key) leads with it. A zeroth_reader sees its tenant''s runs.';
ALTER VIEW zeroth.run_list OWNER TO zeroth_owner;
REVOKE ALL ON zeroth.run_list FROM PUBLIC;
GRANT SELECT ON zeroth.run_list TO zeroth_reader;
