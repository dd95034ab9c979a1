-- 0003_operator_views: the first read-only views for operators and workers.
-- Views are plain SQL over zeroth.runs; they take no locks beyond a normal snapshot read.

CREATE VIEW zeroth.queue_depth AS
SELECT r.tenant_id,
       r.workspace_id,
       r.deployment_ref,
       count(*) FILTER (WHERE r.lease_worker_id IS NULL OR r.lease_expires_at < clock_timestamp())
           AS claimable,
       count(*) FILTER (WHERE r.run_after > clock_timestamp()) AS scheduled,
       count(*) AS pending
  FROM zeroth.runs r
 WHERE r.status = 'pending'
 GROUP BY r.tenant_id, r.workspace_id, r.deployment_ref;
COMMENT ON VIEW zeroth.queue_depth IS 'Pending runs per (tenant, workspace, deployment): all pending, those without a live lease (claimable once due), and those scheduled for later (run_after in the future). Uses runs_claim_pending_idx.';

CREATE VIEW zeroth.dead_letters AS
SELECT r.run_id,
       r.tenant_id,
       r.workspace_id,
       r.deployment_ref,
       r.attempts,
       r.max_attempts,
       r.error,
       r.dead_lettered_at,
       r.created_at,
       r.payload
  FROM zeroth.runs r
 WHERE r.dead_lettered_at IS NOT NULL;
COMMENT ON VIEW zeroth.dead_letters IS 'Runs that failed max_attempts times with a retryable error and were dead-lettered by fail_run; redrive_run puts one back to pending.';
