-- sql/functions/views/queue_depth.sql: the operator view zeroth.queue_depth. Re-applied by every
-- upgrade (sql/README.md).
-- 0003_operator_views: the first read-only views for operators and workers.
-- Views are plain SQL over zeroth.runs; they take no locks beyond a normal snapshot read.
-- security_invoker: the view reads as its caller, so zeroth_reader's row-level security
-- policy on zeroth.runs filters it to one tenant.
CREATE OR REPLACE VIEW zeroth.queue_depth WITH (security_invoker = true) AS
SELECT r.tenant_id,
       r.workspace_id,
       r.deployment_ref,
       count(*) FILTER (WHERE r.lease_worker_id IS NULL OR r.lease_expires_at < clock_timestamp())
           AS claimable,
       count(*) FILTER (WHERE r.run_after > clock_timestamp()) AS scheduled,
       count(*) AS pending,
       count(*) FILTER (WHERE r.run_after <= clock_timestamp()
                          AND (r.lease_worker_id IS NULL OR r.lease_expires_at < clock_timestamp()))
           AS due,
       min(r.run_after) FILTER (WHERE r.run_after <= clock_timestamp()
                                  AND (r.lease_worker_id IS NULL
                                       OR r.lease_expires_at < clock_timestamp()))
           AS oldest_due_at
  FROM zeroth.runs r
 WHERE r.status = 'pending'
 GROUP BY r.tenant_id, r.workspace_id, r.deployment_ref;
COMMENT ON VIEW zeroth.queue_depth IS 'Pending runs per (tenant, workspace, deployment): all pending, those without a live lease (claimable once due), and those scheduled for later (run_after in the future); due counts the claimable ones that are due now; oldest_due_at is the run_after of the longest-waiting due run nobody holds (NULL when none), so now() - oldest_due_at is how long work has waited. Uses runs_claim_pending_idx.';
ALTER VIEW zeroth.queue_depth OWNER TO zeroth_owner;
REVOKE ALL ON zeroth.queue_depth FROM PUBLIC;
GRANT SELECT ON zeroth.queue_depth TO zeroth_reader;
